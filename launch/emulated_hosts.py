"""A TFJob on emulated hosts: every PS and every worker in its own network namespace.

The processes start the way a TFJob's pods do (launch/tfjob_pod.py), not through horovodrun:
a PS is ``gmeta ps serve`` on its host's address; a worker is ``gmeta k8s entrypoint`` with
``TF_CONFIG`` (cluster + task), the Gloo rendezvous served by worker 0 on its host and
``HOROVOD_GLOO_IFACE=eth0``. Every host has its own ports, as pods do, so every PS listens on
``PS_PORT``: no free-port races. What differs from a pod:

* a worker joins the TF cluster as its host's address (``GMETA_WORKER_ADDRESS``,
  gmeta_tf/cluster/worker.py), since a PS on another host cannot reach its ``localhost``;
* a PS says it is ready through ``--ready-file`` (the file system is shared; the launcher, in
  the root namespace, cannot reach a PS's health port, by design).

Process handling is the caller's: ``spawn(name, argv, env, prefix)`` starts one process (argv
already wrapped in ``ip netns exec``) with ``env`` added to the launcher's environment and
returns its ``Popen``; the caller stops what it spawned (``LocalCluster.teardown``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from gmeta_tf.cluster.worker import WORKER_ADDRESS_ENV
from gmeta_tf.errors import ClusterError
from launch.network.netns import HOST_IFACE, EmulatedNetwork

PS_PORT = 2222  # the TFJob port: each host is its own namespace
WORKER_PORT = 2222
RENDEZVOUS_PORT = 12355  # launch/tfjob_pod.py DEFAULT_RENDEZVOUS_PORT

Spawn = Callable[[str, List[str], Dict[str, str], Optional[str]], subprocess.Popen]


def host_names(workers: int, ps: int) -> List[str]:
    """The emulated hosts of a job: ``ps0..``, then ``worker0..`` (their names in logs)."""
    return [f"ps{i}" for i in range(ps)] + [f"worker{i}" for i in range(workers)]


@dataclass(frozen=True)
class EmulatedJob:
    workers: int
    ps: int
    entrypoint_args: List[str] = field(default_factory=list)  # `gmeta k8s entrypoint` options
    python: str = sys.executable


@dataclass
class JobResult:
    worker_codes: Dict[str, int]  # worker host -> exit code (124: stopped at the time-out)
    ps_codes: Dict[str, Optional[int]]  # PS host -> exit code, None while still serving

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.worker_codes.values()) and all(
            c is None for c in self.ps_codes.values())


def cluster_spec(net: EmulatedNetwork, job: EmulatedJob) -> Dict[str, List[str]]:
    return {"ps": [f"{net.address(f'ps{i}')}:{PS_PORT}" for i in range(job.ps)],
            "worker": [f"{net.address(f'worker{i}')}:{WORKER_PORT}" for i in range(job.workers)]}


def start_ps(net: EmulatedNetwork, job: EmulatedJob, spawn: Spawn, ready_dir: str,
             timeout_s: float = 120.0, log: Callable[[str], None] = print) -> Dict[str, subprocess.Popen]:
    """Start every PS on its host and wait until each has written its ready file."""
    spec = cluster_spec(net, job)
    procs, files = {}, {}
    for i in range(job.ps):
        host = f"ps{i}"
        files[host] = os.path.join(ready_dir, f"{host}.ready")
        argv = [job.python, "-m", "gmeta_tf.cli.main", "ps", "serve", "--ps-hosts", ",".join(spec["ps"]),
                "--index", str(i), "--ready-file", files[host]]
        procs[host] = spawn(f"ps:{i} ({spec['ps'][i]})", net.exec_argv(host, argv), {}, f"ps{i}")
    deadline = time.monotonic() + timeout_s
    for host, proc in procs.items():
        while not os.path.exists(files[host]):
            if proc.poll() is not None:
                raise ClusterError(f"{host} ({net.address(host)}:{PS_PORT}) exited with code "
                                   f"{proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise ClusterError(f"{host} ({net.address(host)}:{PS_PORT}) not ready after {timeout_s:.0f} s")
            time.sleep(0.2)
    log(f"[launch] {job.ps} PS ready on emulated hosts: {', '.join(spec['ps'])}")
    return procs


def worker_env(net: EmulatedNetwork, job: EmulatedJob, index: int) -> Dict[str, str]:
    """What worker ``index``'s pod would get, plus the address it joins the TF cluster as."""
    host = f"worker{index}"
    return {"TF_CONFIG": json.dumps({"cluster": cluster_spec(net, job), "task": {"type": "worker", "index": index}}),
            "GMETA_RENDEZVOUS_PORT": str(RENDEZVOUS_PORT), "GMETA_GLOO_IFACE": HOST_IFACE,
            WORKER_ADDRESS_ENV: f"{net.address(host)}:{WORKER_PORT}"}


def run_job(net: EmulatedNetwork, job: EmulatedJob, spawn: Spawn, timeout_s: Optional[float] = None,
            ps_ready_timeout_s: float = 120.0, log: Callable[[str], None] = print) -> JobResult:
    """Start the PS, then the workers, each on its emulated host; wait for the workers.

    ``net`` must hold ``host_names(job.workers, job.ps)``. Returns every exit code; stopping the
    processes (also on an exception or a time-out) is the caller's, through what ``spawn`` made.
    """
    missing = [h for h in host_names(job.workers, job.ps) if h not in net.hosts]
    if missing:
        raise ClusterError(f"the emulated network has no host(s) {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="gmeta-ready-") as ready_dir:
        ps = start_ps(net, job, spawn, ready_dir, ps_ready_timeout_s, log) if job.ps else {}
    workers = {}
    for i in range(job.workers):
        host = f"worker{i}"
        argv = [job.python, "-m", "gmeta_tf.cli.main", "k8s", "entrypoint", *job.entrypoint_args]
        workers[host] = spawn(f"worker:{i} ({net.address(host)})", net.exec_argv(host, argv),
                              worker_env(net, job, i), f"worker{i}")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    codes: Dict[str, int] = {}
    while len(codes) < len(workers):
        for host, proc in workers.items():
            if host not in codes and proc.poll() is not None:
                codes[host] = proc.returncode
        if deadline is not None and time.monotonic() > deadline:
            log(f"[launch] workers still running after {timeout_s:.0f} s")
            codes.update({h: 124 for h in workers if h not in codes})
            break
        time.sleep(0.2)
    return JobResult(worker_codes=codes, ps_codes={h: p.poll() for h, p in ps.items()})
