"""The parameter servers of one cluster: started, waited on until ready, told apart from workers.

Why one module: a PS is started two ways (``gmeta ps serve`` on a free loopback port with an HTTP
readiness probe, ``LocalCluster``; or on its emulated host's TFJob port with a ready file, since
the launcher cannot reach a namespace's health port, ``EmulatedCluster``), but waited on one way
(``wait_ready``): never a sleep, a PS that dies before it is ready is named, the deadline is the
whole start's and a stop signal meanwhile ends the launch (``LaunchStopped``; there is no rank yet
to checkpoint). Their end is the teardown's (``launch/processes.py``), after the workers'.
"""
from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from typing import Callable, List, Optional, Sequence, Tuple

from gmeta_tf.errors import ClusterError
from launch.outcomes import LaunchStopped
from launch.processes import Child

PS_NAME_PREFIX = "ps:"  # every PS child's name starts so: ``ps:<index> (<address>)``
_POLL_S = 0.2

Probe = Callable[[], bool]  # whether one PS says it is ready


def ps_name(index: int, address: str) -> str:
    return f"{PS_NAME_PREFIX}{index} ({address})"


def is_ps(child: Child) -> bool:
    return child.name.startswith(PS_NAME_PREFIX)


def free_ports(n: int, host: str = "127.0.0.1") -> List[int]:
    """``n`` distinct ports that were free a moment ago (held open together while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_probe(url: str) -> Probe:
    """Ready when ``url`` (``ps/server.py``'s ``/ready``) answers 200."""
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, OSError):
            return False
    return ready


def file_probe(path: str) -> Probe:
    """Ready once the PS wrote ``path`` (``gmeta ps serve --ready-file``)."""
    return lambda: os.path.exists(path)


def wait_ready(started: Sequence[Tuple[Child, Probe]], timeout_s: float,
               stop_signals: Callable[[], List[int]]) -> None:
    """Block until every started PS's probe says ready. Raises ``ClusterError`` naming the PS that
    exited first or was not ready within ``timeout_s`` (from now, for all of them together), and
    ``LaunchStopped`` at a stop signal."""
    deadline = time.monotonic() + timeout_s
    for child, ready in started:
        while not ready():
            asked = stop_signals()
            if asked:
                raise LaunchStopped(asked[0])
            if child.proc.poll() is not None:
                raise ClusterError(f"{child.name} exited with code {child.proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise ClusterError(f"{child.name} not ready after {timeout_s:.0f} s")
            time.sleep(_POLL_S)


def ps_serve_argv(python: str, addresses: List[str], index: int, health_port: Optional[int] = None,
                  ready_file: Optional[str] = None) -> List[str]:
    """``gmeta ps serve`` for PS ``index`` of ``addresses``, saying it is ready one way or the other."""
    probe = ["--health-port", str(health_port)] if health_port is not None else ["--ready-file", str(ready_file)]
    return [python, "-m", "gmeta_tf.cli.main", "ps", "serve", "--ps-hosts", ",".join(addresses),
            "--index", str(index), *probe]


def start_local_ps(spawn: Callable[..., Child], count: int, python: str) -> Tuple[List[str], List[Tuple[Child, Probe]]]:
    """``count`` PS on free loopback ports: their addresses, and each child with its probe."""
    ports = free_ports(2 * count)
    grpc_ports, health_ports = ports[:count], ports[count:]
    addresses = [f"127.0.0.1:{p}" for p in grpc_ports]
    started = []
    for i in range(count):
        child = spawn(ps_name(i, addresses[i]), ps_serve_argv(python, addresses, i, health_port=health_ports[i]),
                      prefix=f"ps{i}")
        started.append((child, http_probe(f"http://127.0.0.1:{health_ports[i]}/ready")))
    return addresses, started
