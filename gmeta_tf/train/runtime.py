"""Where this process trains: rank, size, dense-gradient sync, parameter servers.

Its own module so that the trainer (which takes a ``Runtime``) and the distributed worker
(``cluster/worker.py``, which builds one) both import it downward: the worker sits above the
trainer, and nothing in ``train/`` imports ``cluster/``.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from gmeta_tf.train.dense_sync import LocalSync


@dataclass
class Runtime:
    """Where this process trains. The default is the embedded single process."""

    sync: object = field(default_factory=LocalSync)
    ps_tasks: int = 0
    namespace: Optional[str] = None  # TFRA table namespace; shared by all workers of one job
    placement: Optional[Dict[str, object]] = None  # config.placement_file.read_placement
    bp_v2: bool = False
    log: Callable[[str], None] = print
    ps_addresses: List[str] = field(default_factory=list)
    # ``cluster.elastic``: rank 0 goes first through files, not barriers (``elastic.StartGate``)
    start_gate: Optional[object] = None
    # ``host:port`` of the Gloo rendezvous worker 0 serves for its life (a TFJob's worker,
    # ``launch/tfjob_pod.py``); None where a launcher serves it (horovodrun) or there is none.
    # Its peers ask it after a failed collective: refusing connections, worker 0 is gone (``failures.py``).
    rank0_rendezvous: Optional[str] = None

    @property
    def rank(self) -> int:
        return self.sync.rank

    @property
    def size(self) -> int:
        return self.sync.size


def connect_once(addr: str, timeout_s: float) -> None:
    """Open and close a TCP connection to ``host:port``; OSError when nothing listens there."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s):
        pass


def reachable(addr: str, timeout_s: float = 1.0) -> bool:
    try:
        connect_once(addr, timeout_s)
        return True
    except OSError:
        return False
