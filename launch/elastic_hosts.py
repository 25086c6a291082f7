"""The ``horovodrun`` arguments of an elastic ring on one machine (``gmeta launch local --elastic``).

Why one host name per worker: Horovod Elastic blacklists the *host* of a failed worker
(``horovod/runner/elastic/registration.py``) and stops the job once every host is blacklisted, so
``-H localhost:N`` (one host) would end the whole ring at the first lost worker. Here each worker
gets a name of its own, one slot each, every name resolving to an address of this machine
(``localhost``, ``127.0.0.1``, the host name, the interfaces' addresses): ``horovodrun`` starts a
slot whose name resolves to a local address as a plain child, without ssh (``gloo_run``'s
``_exec_command``), and blacklisting one name leaves the others running.

``--network-interfaces lo`` keeps elastic start-up from probing the NICs of "two hosts" over ssh
(``gloo_run._get_min_start_hosts``) and the ring on loopback. ``--min-np 1``: the job goes on while
one worker lives.

Why a host discovery script (``write_discovery``) and not ``-H``: it is the form the same ring
takes on a real cluster (``horovodrun --host-discovery-script``, re-run by the driver every second,
so hosts listed later join), and its host file is the launcher's to change. What returns a *lost*
host is horovodrun's ``--blacklist-cooldown-range`` (``cluster.elastic_cooldown_s``): Horovod
blacklists a failed worker's host, and once the cool-down ends (``HostState.is_resurrected`` in
``horovod/runner/elastic/discovery.py``) the driver tells rank 0, whose next commit raises
``HostsUpdatedInterrupt`` on every rank; the ring re-forms and the driver starts a new worker on
that host (docs/fault_tolerance.md, "Elastic workers"). Without a cool-down a blacklisted host
never comes back and the ring only shrinks.
"""
from __future__ import annotations

import os
import shlex
import socket
from typing import Callable, Iterable, List, Optional, Sequence, Set

from gmeta_tf.atomic_file import replace_file
from gmeta_tf.errors import ClusterError

LOOPBACK_INTERFACE = "lo"


def local_names(candidates: Iterable[str], resolve: Callable[[str], Optional[str]], local_addresses: Set[str]) -> List[str]:
    """``candidates`` that resolve to one of ``local_addresses``, each once, in order."""
    out: List[str] = []
    for name in candidates:
        if name and name not in out and resolve(name) in local_addresses:
            out.append(name)
    return out


def worker_hosts(workers: int, names: List[str]) -> List[str]:
    """The first ``workers`` of ``names``: one host, one slot, per worker."""
    if workers > len(names):
        raise ClusterError(f"--elastic with --workers {workers}: this machine has {len(names)} distinct local host "
                           f"name(s) ({', '.join(names)}), one per worker is needed (Horovod Elastic blacklists a "
                           f"lost worker's host); use --workers <= {len(names)}")
    return names[:workers]


def host_list(workers: int, names: List[str]) -> str:
    """``-H`` for ``workers`` one-slot hosts, the first ``workers`` of ``names``."""
    return ",".join(f"{name}:1" for name in worker_hosts(workers, names))


DISCOVERY_SCRIPT = "discover_hosts.sh"
HOSTS_FILE = "hosts"


def hosts_file_text(names: List[str]) -> str:
    """The discovery script's output: one ``name:1`` line (one slot) per host."""
    return "".join(f"{name}:1\n" for name in names)


def write_discovery(directory: str, names: List[str]) -> str:
    """Write the host file (``names``, one slot each) and the script that prints it into
    ``directory``; the script's path. The file is replaced whole, so the driver, which runs the
    script every second, never reads half of it."""
    os.makedirs(directory, exist_ok=True)
    hosts = os.path.abspath(os.path.join(directory, HOSTS_FILE))
    replace_file(hosts, hosts_file_text(names))
    script = os.path.abspath(os.path.join(directory, DISCOVERY_SCRIPT))
    replace_file(script, "#!/bin/sh\n# gmeta launch local --elastic: the hosts horovodrun may run a worker on "
                         f"(launch/elastic_hosts.py)\nexec cat {shlex.quote(hosts)}\n")
    os.chmod(script, 0o755)
    return script


def horovodrun_args(workers: int, discovery_script: str, cooldown_s: Optional[Sequence[int]],
                    reset_limit: Optional[int] = None) -> List[str]:
    """``horovodrun``'s arguments for an elastic ring of at most ``workers`` (at least 1), its hosts
    from ``discovery_script``; ``cooldown_s`` ``[MIN, MAX]`` (``cluster.elastic_cooldown_s``,
    checked there) lets a lost worker's host return, None never; ``reset_limit``
    (``cluster.elastic_reset_limit``): horovodrun's ``--reset-limit``, None unbounded."""
    cooldown = [] if cooldown_s is None else ["--blacklist-cooldown-range", str(cooldown_s[0]), str(cooldown_s[1])]
    limit = [] if reset_limit is None else ["--reset-limit", str(reset_limit)]
    return ["-np", str(workers), "--min-np", "1", "--max-np", str(workers),
            "--host-discovery-script", discovery_script, *cooldown, *limit,
            "--network-interfaces", LOOPBACK_INTERFACE, "--gloo"]


def this_machine_names() -> List[str]:
    """The local names ``horovodrun`` will start without ssh, as it decides it."""
    from horovod.runner.util.network import get_local_host_addresses, resolve_host_address

    addresses = get_local_host_addresses()
    candidates = ["localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn(), *sorted(addresses)]
    return local_names(candidates, resolve_host_address, addresses)
