"""What each emulated host of a TFJob runs: every PS and every worker in its own network namespace.

The processes are the ones a TFJob's pods run (launch/tfjob_pod.py), not horovodrun's: a PS is
``gmeta ps serve`` on its host's address; a worker is ``gmeta k8s entrypoint`` with ``TF_CONFIG``
(cluster + task), the Gloo rendezvous served by worker 0 on its host and
``HOROVOD_GLOO_IFACE=eth0``. Every host has its own ports, as pods do, so every PS listens on the
TFJob port (``launch/tfjob_ports.py``): no free-port races. What differs from a pod:

* a worker joins the TF cluster as its host's address (``GMETA_WORKER_ADDRESS``,
  gmeta_tf/cluster/worker.py), since a PS on another host cannot reach its ``localhost``;
* a PS says it is ready through ``--ready-file`` (the file system is shared; the launcher, in
  the root namespace, cannot reach a PS's health port, by design).

This module only says what runs where (argv, environment, addresses); starting, watching and
stopping the processes is ``launch/emulated_cluster.py``'s, the one orchestrator of an emulated
job (``gmeta launch local --network`` and the network bench alike).
"""
from __future__ import annotations

import json
from typing import Dict, List, Sequence

from gmeta_tf.cluster.worker import WORKER_ADDRESS_ENV
from gmeta_tf.errors import ClusterError
from launch.network.netns import HOST_IFACE, EmulatedNetwork
from launch.ps_lifecycle import ps_serve_argv
from launch.tfjob_ports import GLOO_IFACE_ENV, RENDEZVOUS_PORT, RENDEZVOUS_PORT_ENV, TFJOB_PORT

PS_PORT = TFJOB_PORT  # each host is its own namespace: every PS and worker on the TFJob port
WORKER_PORT = TFJOB_PORT


def ps_host(index: int) -> str:
    """PS ``index``'s host (its namespace, and its prefix in logs)."""
    return f"ps{index}"


def worker_host(index: int) -> str:
    """Worker ``index``'s host (its namespace, and its prefix in logs)."""
    return f"worker{index}"


def host_names(workers: int, ps: int) -> List[str]:
    """The emulated hosts of a job: ``ps0..``, then ``worker0..`` (their names in logs)."""
    return [ps_host(i) for i in range(ps)] + [worker_host(i) for i in range(workers)]


def cluster_spec(net: EmulatedNetwork, workers: int, ps: int) -> Dict[str, List[str]]:
    return {"ps": [f"{net.address(ps_host(i))}:{PS_PORT}" for i in range(ps)],
            "worker": [f"{net.address(worker_host(i))}:{WORKER_PORT}" for i in range(workers)]}


def ps_argv(python: str, ps_hosts: List[str], index: int, ready_file: str) -> List[str]:
    """A PS host's ``gmeta ps serve``, ready when it wrote ``ready_file``."""
    return ps_serve_argv(python, ps_hosts, index, ready_file=ready_file)


def entrypoint_args(train_args: Sequence[str]) -> List[str]:
    """``gmeta train``'s arguments as a host's entrypoint takes them. The entrypoint always resumes,
    as a restarted pod does: ``--resume`` is what it does anyway (dropped), ``--no-resume`` cannot
    be honoured and is refused (``ClusterError``), by the launch before any host starts and by the
    cluster itself for a caller that starts one directly."""
    if "--no-resume" in train_args:
        raise ClusterError("--no-resume cannot be honoured with --network: each emulated host runs the TFJob "
                           "entrypoint, which always resumes (a restarted pod continues its job); start from "
                           "an empty --out instead")
    return [a for a in train_args if a != "--resume"]


def worker_argv(python: str, entrypoint_args: List[str]) -> List[str]:
    return [python, "-m", "gmeta_tf.cli.main", "k8s", "entrypoint", *entrypoint_args]


def worker_env(net: EmulatedNetwork, workers: int, ps: int, index: int) -> Dict[str, str]:
    """What worker ``index``'s pod would get, plus the address it joins the TF cluster as."""
    return {"TF_CONFIG": json.dumps({"cluster": cluster_spec(net, workers, ps), "task": {"type": "worker", "index": index}}),
            RENDEZVOUS_PORT_ENV: str(RENDEZVOUS_PORT), GLOO_IFACE_ENV: HOST_IFACE,
            WORKER_ADDRESS_ENV: f"{net.address(worker_host(index))}:{WORKER_PORT}"}
