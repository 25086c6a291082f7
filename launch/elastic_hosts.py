"""The ``horovodrun`` arguments of an elastic ring on one machine (``gmeta launch local --elastic``).

Why one host name per worker: Horovod Elastic blacklists the *host* of a failed worker
(``horovod/runner/elastic/registration.py``) and stops the job once every host is blacklisted, so
``-H localhost:N`` (one host) would end the whole ring at the first lost worker. Here each worker
gets a name of its own, one slot each, every name resolving to an address of this machine
(``localhost``, ``127.0.0.1``, the host name, the interfaces' addresses): ``horovodrun`` starts a
slot whose name resolves to a local address as a plain child, without ssh (``gloo_run``'s
``_exec_command``), and blacklisting one name leaves the others running.

``--network-interfaces lo`` keeps elastic start-up from probing the NICs of "two hosts" over ssh
(``gloo_run._get_min_start_hosts``) and the ring on loopback. No ``--blacklist-cooldown-range``:
a blacklisted name never comes back, so the ring only shrinks (docs/fault_tolerance.md says why a
re-grown worker is not supported yet). ``--min-np 1``: the job goes on while one worker lives.
"""
from __future__ import annotations

import socket
from typing import Callable, Iterable, List, Optional, Set

from gmeta_tf.errors import ClusterError

LOOPBACK_INTERFACE = "lo"


def local_names(candidates: Iterable[str], resolve: Callable[[str], Optional[str]], local_addresses: Set[str]) -> List[str]:
    """``candidates`` that resolve to one of ``local_addresses``, each once, in order."""
    out: List[str] = []
    for name in candidates:
        if name and name not in out and resolve(name) in local_addresses:
            out.append(name)
    return out


def host_list(workers: int, names: List[str]) -> str:
    """``-H`` for ``workers`` one-slot hosts, the first ``workers`` of ``names``."""
    if workers > len(names):
        raise ClusterError(f"--elastic with --workers {workers}: this machine has {len(names)} distinct local host "
                           f"name(s) ({', '.join(names)}), one per worker is needed (Horovod Elastic blacklists a "
                           f"lost worker's host); use --workers <= {len(names)}")
    return ",".join(f"{name}:1" for name in names[:workers])


def horovodrun_args(workers: int, hosts: str) -> List[str]:
    """``horovodrun``'s arguments for an elastic ring of at most ``workers`` (at least 1)."""
    return ["-np", str(workers), "--min-np", "1", "--max-np", str(workers), "-H", hosts,
            "--network-interfaces", LOOPBACK_INTERFACE, "--gloo"]


def this_machine_names() -> List[str]:
    """The local names ``horovodrun`` will start without ssh, as it decides it."""
    from horovod.runner.util.network import get_local_host_addresses, resolve_host_address

    addresses = get_local_host_addresses()
    candidates = ["localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn(), *sorted(addresses)]
    return local_names(candidates, resolve_host_address, addresses)
