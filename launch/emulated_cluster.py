"""``gmeta launch local --network PROFILE``: the same cluster as ``LocalCluster``, each PS and each
worker on an emulated host of its own (``launch/network/``), started the way a TFJob's pods are
(``launch/emulated_hosts.py`` says what each host runs: ``TF_CONFIG``, the Gloo rendezvous, no
horovodrun).

The one orchestrator of an emulated job: ``gmeta launch local --network`` and the network bench
(``bench/network_paths.py``) both start, watch and stop their processes here. Everything else is
``LocalCluster``'s: the processes, their prefixed output, teardown, the PS watch, the stop file
every rank reads, the status records the supervisor reads (the workers are this launcher's own
children, so it writes the exit of one killed by a signal itself). So a restart, a preemption or
a kill behaves the same on loopback and on emulated links, and the fault tests can cut, slow or
drop one host's link (``net.cut`` / ``set_rate`` / ``set_loss``).
"""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Sequence

from gmeta_tf.errors import ClusterError
from launch import emulated_hosts, ps_lifecycle
from launch.emulated_hosts import ps_host, worker_host
from launch.local_cluster import Child, LocalCluster
from launch.network.faults import NetworkFault
from launch.network.netns import EmulatedNetwork


class EmulatedCluster(LocalCluster):
    # Network faults are scheduled per cluster (``pending``) and a host's namespace is rebuilt
    # with it: a restart starts every host again, PS included.
    keeps_ps_across_restarts = False

    def __init__(self, net: EmulatedNetwork, log: Callable[[str], None] = print,
                 env: Optional[Dict[str, str]] = None, grace_s: float = 10.0,
                 faults: Sequence[NetworkFault] = (), python: str = sys.executable):
        super().__init__(log=log, env=env, grace_s=grace_s)
        self.net = net
        self.python = python
        self.ps_count = 0
        self.workers: List[Child] = []
        self.pending = list(faults)  # each fires once, when a worker reached its step

    def tick(self) -> None:
        if not self.pending:
            return
        step = self.last_step_seen() or 0
        for fault in [f for f in self.pending if step >= f.at_step]:
            self.pending.remove(fault)
            self.log(f"[launch] step {step}: network fault {fault.host} {fault.kind}={fault.value:g}")
            fault.apply(self.net)

    def _need_hosts(self, hosts: List[str]) -> None:
        missing = [h for h in hosts if h not in self.net.hosts]
        if missing:
            raise ClusterError(f"the emulated network has no host(s) {', '.join(missing)}")

    def start_ps(self, count: int, timeout_s: float = 120.0, python: Optional[str] = None) -> List[str]:
        """Start ``count`` PS, one on each host ``ps0..``, and wait until each has written its ready
        file (the launcher, in the root namespace, cannot reach a host's health port)."""
        self._need_hosts(emulated_hosts.host_names(0, count))
        self.ps_count = count
        spec = emulated_hosts.cluster_spec(self.net, 0, count)["ps"]
        with tempfile.TemporaryDirectory(prefix="gmeta-ready-") as ready_dir:
            started = []
            for i in range(count):
                host, ready = ps_host(i), os.path.join(ready_dir, f"{ps_host(i)}.ready")
                argv = emulated_hosts.ps_argv(python or self.python, spec, i, ready)
                child = self.spawn(ps_lifecycle.ps_name(i, spec[i]), self.net.exec_argv(host, argv), prefix=host)
                started.append((child, ps_lifecycle.file_probe(ready)))
            ps_lifecycle.wait_ready(started, timeout_s, self.stop_signals)
        self.ps_addresses = spec
        self.log(f"[launch] {count} PS ready on emulated hosts: {', '.join(spec)}")
        return self.ps_addresses

    def train(self, workers: int, train_args: List[str], timeout_s: Optional[float] = None) -> int:
        """Every worker runs ``gmeta k8s entrypoint train_args`` on its host; the entrypoint always
        resumes, as a restarted pod does (``emulated_hosts.entrypoint_args``)."""
        args = emulated_hosts.entrypoint_args(train_args)
        self._need_hosts(emulated_hosts.host_names(workers, 0))
        self.start_ranks()
        self.workers = []
        for i in range(workers):
            host = worker_host(i)
            env = {**emulated_hosts.worker_env(self.net, workers, self.ps_count, i), **self.rank_env()}
            child = self.spawn(f"worker:{i} ({self.net.address(host)})",
                               self.net.exec_argv(host, emulated_hosts.worker_argv(self.python, args)),
                               prefix=host, env=env)
            child.rank = i  # `ip netns exec` execs: the pid is the worker's, and so is its exit status
            self.workers.append(child)
        return self.wait_workers(self.workers, timeout_s)
