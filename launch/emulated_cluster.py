"""``gmeta launch local --network PROFILE``: the same cluster as ``LocalCluster``, each PS and each
worker on an emulated host of its own (``launch/network/``), started the way a TFJob's pods are
(``launch/emulated_hosts.py``: ``TF_CONFIG``, the Gloo rendezvous, no horovodrun).

Everything else is ``LocalCluster``'s: the processes, their prefixed output, teardown, the PS
watch, preemption requests passed to the workers, the failure report the supervisor reads. So a
restart, a preemption or a kill behaves the same on loopback and on emulated links, and the
fault tests can cut, slow or drop one host's link (``net.cut`` / ``set_rate`` / ``set_loss``).
"""
from __future__ import annotations

import tempfile
from typing import Callable, Dict, List, Optional, Sequence

from launch import emulated_hosts
from launch.local_cluster import LocalCluster
from launch.network.faults import NetworkFault
from launch.network.netns import EmulatedNetwork


class EmulatedCluster(LocalCluster):
    def __init__(self, net: EmulatedNetwork, workers: int, ps: int, log: Callable[[str], None] = print,
                 env: Optional[Dict[str, str]] = None, grace_s: float = 10.0,
                 faults: Sequence[NetworkFault] = ()):
        super().__init__(log=log, env=env, grace_s=grace_s)
        self.net = net
        self.job = emulated_hosts.EmulatedJob(workers=workers, ps=ps)
        self.workers: List = []
        self.pending = list(faults)  # each fires once, when a worker reached its step

    def tick(self) -> None:
        if not self.pending:
            return
        step = self.last_step_seen() or 0
        for fault in [f for f in self.pending if step >= f.at_step]:
            self.pending.remove(fault)
            self.log(f"[launch] step {step}: network fault {fault.host} {fault.kind}={fault.value:g}")
            fault.apply(self.net)

    def _spawn(self, name, argv, env, prefix):
        return self.spawn(name, argv, prefix=prefix, env=env).proc

    def start_ps(self, count: int, timeout_s: float = 120.0, python: Optional[str] = None) -> List[str]:
        with tempfile.TemporaryDirectory(prefix="gmeta-ready-") as ready_dir:
            emulated_hosts.start_ps(self.net, self.job, self._spawn, ready_dir, timeout_s, self.log)
        self.ps_addresses = emulated_hosts.cluster_spec(self.net, self.job)["ps"]
        return self.ps_addresses

    def train(self, workers: int, train_args: List[str], timeout_s: Optional[float] = None) -> int:
        """Every worker runs ``gmeta k8s entrypoint train_args`` on its host (the entrypoint
        always resumes, as a restarted pod does)."""
        args = [a for a in train_args if a not in ("--resume", "--no-resume")]
        self.workers = []
        for i in range(workers):
            host = f"worker{i}"
            argv = [self.job.python, "-m", "gmeta_tf.cli.main", "k8s", "entrypoint", *args]
            self.workers.append(self.spawn(f"worker:{i} ({self.net.address(host)})", self.net.exec_argv(host, argv),
                                           prefix=host, env=emulated_hosts.worker_env(self.net, self.job, i)))
        return self.wait_workers(self.workers, timeout_s)

    def worker_pids(self) -> List[int]:
        # `ip netns exec` enters the namespace and execs the command: the pid is the worker's
        return [c.proc.pid for c in self.workers if c.proc.poll() is None]

    def failed_ranks(self) -> Dict[int, int]:
        """``{rank: exit code}`` of the worker that failed first (the others fail because of it)."""
        for c in self.exit_order:
            if c in self.workers and c.proc.returncode:
                return {self.workers.index(c): c.proc.returncode}
        return {}
