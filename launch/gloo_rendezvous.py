"""A Horovod Gloo ring without ``horovodrun``: the rendezvous server and each rank's environment.

``horovodrun --gloo`` does two things: it serves an HTTP rendezvous (a key-value store the ranks
use to find each other) and starts every rank with ``HOROVOD_*`` variables. A Kubernetes TFJob
has no ``horovodrun``: worker 0 serves the rendezvous on a fixed port and every worker derives
its variables from its index (``gmeta k8s entrypoint``); tests do the same on loopback. Ranks
may start in any order: ``hvd.init()`` blocks until all of them have registered, once it reaches
the server. Before the server is up it does not wait (Horovod's store gives up after three
refused connections 0.5 s apart and aborts the process), so every rank first waits for the
server to accept connections (``gmeta_tf/cluster/worker.py::wait_for_rendezvous``).
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer


def host_plan(hostnames: List[str]):
    """One rank per host (one GPU per worker pod), ranks in the order given."""
    hosts = parse_hosts(",".join(f"{h}:1" for h in hostnames))
    return get_host_assignments(hosts, len(hostnames))


class GlooRendezvous:
    """Horovod's rendezvous HTTP server on a fixed port (``horovodrun`` picks a random one)."""

    def __init__(self, hostnames: List[str], port: int, bind: str = "0.0.0.0"):
        self.port = port
        self._httpd = RendezvousHTTPServer((bind, port), RendezvousHandler, 0)
        self._httpd.init(host_plan(hostnames))
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "GlooRendezvous":
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def rank_env(rank: int, hostnames: List[str], rendezvous_addr: str, rendezvous_port: int,
             iface: str) -> Dict[str, str]:
    """The variables ``horovodrun --gloo`` would give rank ``rank`` (one rank per host)."""
    slot = host_plan(hostnames)[rank]
    return {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }
