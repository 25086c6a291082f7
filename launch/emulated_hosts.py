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
from typing import Dict, List

from gmeta_tf.cluster.worker import WORKER_ADDRESS_ENV
from launch.network.netns import HOST_IFACE, EmulatedNetwork
from launch.tfjob_ports import RENDEZVOUS_PORT, TFJOB_PORT

PS_PORT = TFJOB_PORT  # each host is its own namespace: every PS and worker on the TFJob port
WORKER_PORT = TFJOB_PORT


def host_names(workers: int, ps: int) -> List[str]:
    """The emulated hosts of a job: ``ps0..``, then ``worker0..`` (their names in logs)."""
    return [f"ps{i}" for i in range(ps)] + [f"worker{i}" for i in range(workers)]


def cluster_spec(net: EmulatedNetwork, workers: int, ps: int) -> Dict[str, List[str]]:
    return {"ps": [f"{net.address(f'ps{i}')}:{PS_PORT}" for i in range(ps)],
            "worker": [f"{net.address(f'worker{i}')}:{WORKER_PORT}" for i in range(workers)]}


def ps_argv(python: str, ps_hosts: List[str], index: int, ready_file: str) -> List[str]:
    return [python, "-m", "gmeta_tf.cli.main", "ps", "serve", "--ps-hosts", ",".join(ps_hosts),
            "--index", str(index), "--ready-file", ready_file]


def worker_argv(python: str, entrypoint_args: List[str]) -> List[str]:
    return [python, "-m", "gmeta_tf.cli.main", "k8s", "entrypoint", *entrypoint_args]


def worker_env(net: EmulatedNetwork, workers: int, ps: int, index: int) -> Dict[str, str]:
    """What worker ``index``'s pod would get, plus the address it joins the TF cluster as."""
    host = f"worker{index}"
    return {"TF_CONFIG": json.dumps({"cluster": cluster_spec(net, workers, ps), "task": {"type": "worker", "index": index}}),
            "GMETA_RENDEZVOUS_PORT": str(RENDEZVOUS_PORT), "GMETA_GLOO_IFACE": HOST_IFACE,
            WORKER_ADDRESS_ENV: f"{net.address(host)}:{WORKER_PORT}"}
