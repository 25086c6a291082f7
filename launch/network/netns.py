"""``EmulatedNetwork``: one network namespace per emulated host, joined by a bridge, links shaped by tc.

Layout (docs/network.md has the picture)::

    gm-<pid>-<id>-0br   a namespace holding bridge br0 and one port p<i> per host
    gm-<pid>-<id>-<host> one namespace per host: lo up, eth0 = 10.77.0.<i+2>/16, no other route

Each host's ``eth0`` is one end of a veth pair whose other end (``p<i>``) sits on the bridge,
in a namespace of its own: nothing is attached to the root namespace, so no packet from a host
can leave the set of namespaces this object made (no default route, no link out). A host's link
is shaped at both ends (``eth0`` egress = its upload, ``p<i>`` egress = its download) with a
``tbf`` whose burst is above the largest packet veth hands it (GSO super-packets up to 64 KiB:
a burst below that drops them all and gRPC fails with "Connection reset by peer"). Loss is a
classic-BPF ``cls_bpf`` filter in direct-action mode on a ``clsact`` qdisc (``ld rand``; drop
when below p * 2^32): this kernel has neither netem nor the gact action, and this needs no
iptables.

Names carry the owner's pid and a per-network id (``gm-<pid>-<id>-``, the network's prefix), and
the owner holds a lock on that prefix for the network's life (``cleanup.OwnerLock``). So
``sweep_stale`` can remove what a launcher killed with SIGKILL left behind, and only that: a
network whose lock is free. A ``watchdog`` process (on by default) removes it within a second of
that kill without waiting for the next launch. Every removal goes through ``cleanup.py``.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from gmeta_tf import exit_codes
from gmeta_tf.errors import NetworkEmulationError
from launch.network import cleanup, watchdog
from launch.network.cleanup import ETC_NETNS, list_namespaces
from launch.network.profile import LinkProfile, format_rate
from launch.tfjob_ports import POD_IFACE

PREFIX = "gm"
SUBNET_PREFIX = "10.77"  # RFC 1918; lives only inside namespaces this module creates
SUBNET_BITS = 16
HOST_IFACE = POD_IFACE  # what a pod calls its interface (the Gloo ring's, launch/tfjob_ports.py)
_BRIDGE_NS_SUFFIX = "0br"  # host names start with a letter, so this never collides
_HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")  # validates a host name the caller gives
_CAP_NET_ADMIN = 12
_MIN_BURST = 256 * 1024  # above veth's 64 KiB GSO packets, with room for two
_CMD_TIMEOUT_S = 30.0


def run_cmd(argv: Sequence[str]) -> str:
    """Run one ``ip`` / ``tc`` command; any failure is a ``NetworkEmulationError`` naming it."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except FileNotFoundError:
        raise NetworkEmulationError(f"`{argv[0]}` is not installed (iproute2 provides ip and tc)") from None
    except subprocess.TimeoutExpired:
        raise NetworkEmulationError(f"`{shlex.join(argv)}` did not finish in {_CMD_TIMEOUT_S:.0f} s") from None
    if r.returncode != 0:
        raise NetworkEmulationError(f"`{shlex.join(argv)}` failed (exit {r.returncode}): "
                                    f"{(r.stderr or r.stdout).strip() or 'no message'}")
    return r.stdout


def missing_privilege() -> Optional[str]:
    """One line saying what this process lacks to build namespaces, or None."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH: install iproute2 (apt-get install iproute2)"
    try:  # root in a container may still lack CAP_NET_ADMIN: ask for the capability itself
        with open("/proc/self/status") as f:
            caps = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    except (OSError, StopIteration, ValueError, IndexError):
        caps = (1 << _CAP_NET_ADMIN) if os.geteuid() == 0 else 0
    if not caps & (1 << _CAP_NET_ADMIN):
        return (f"--network needs CAP_NET_ADMIN (root) to create network namespaces; this process "
                f"(uid {os.geteuid()}) lacks it: use --network loopback, or run as root with that capability")
    return None


def require_privilege() -> None:
    problem = missing_privilege()
    if problem:
        raise NetworkEmulationError(problem)


def sweep_stale(log=lambda msg: None) -> List[str]:
    """Delete every ``gm-...`` network whose owner is provably gone: its owner lock is free (a
    launcher killed with SIGKILL whose watchdog was killed too). A network whose lock is held
    stays, whether or not its owner's pid is visible here (another pid namespace sharing
    /run/netns), and so does one without a lock file. Returns the names removed."""
    prefixes = {cleanup.prefix_of(n) for n in cleanup.list_namespaces()}
    prefixes |= {cleanup.prefix_of(n) for n in (os.listdir(ETC_NETNS) if os.path.isdir(ETC_NETNS) else [])}
    removed = []
    for prefix in sorted(p for p in prefixes if p):
        removed += cleanup.remove_owned(prefix, grace_s=2.0)
    if removed:
        log(f"[network] removed {len(removed)} stale namespace(s) of dead launchers: {', '.join(removed)}")
    return removed


def _tbf_args(rate_bit_s: int) -> List[str]:
    # burst: at least 256 KiB (above GSO packets) and 2 ms at line rate, so the bucket refills
    # between timer ticks at 10 Gbit/s; queue: 50 ms at line rate, as a switch port buffers.
    burst = max(_MIN_BURST, rate_bit_s // 8 // 500)
    return ["tbf", "rate", f"{rate_bit_s}bit", "burst", str(burst), "latency", "50ms"]


def _loss_filter(loss: float) -> str:
    """Classic BPF: A = random u32; if A >= p * 2^32 return TC_ACT_OK (0) else TC_ACT_SHOT (2)."""
    threshold = min(2**32 - 1, int(round(loss * 2**32)))
    ld_rand = 0xFFFFF000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM
    return f"4,32 0 0 {ld_rand},53 0 1 {threshold},6 0 0 0,6 0 0 2"


@dataclass(frozen=True)
class _End:
    """One end of a host's link: the namespace and the device whose egress is shaped there."""
    ns: str
    dev: str


class EmulatedNetwork:
    """Emulated hosts joined by one bridge; a context manager that always tears down.

    ``with EmulatedNetwork(["ps0", "worker0", "worker1"], parse_profile("rate=100mbit")) as net:``
    then ``net.exec_argv("ps0", argv)`` runs a process on host ps0, reachable at
    ``net.address("ps0")``. Fault hooks: ``cut``, ``set_loss``, ``set_rate``.
    """

    def __init__(self, hosts: Sequence[str], profile: LinkProfile, *, owner_pid: Optional[int] = None,
                 net_id: Optional[str] = None, watchdog_process: bool = True,
                 log=lambda msg: None):
        if not profile.emulated:
            raise NetworkEmulationError("--network loopback emulates nothing: start processes as usual")
        if not hosts:
            raise NetworkEmulationError("an emulated network needs at least one host")
        for h in hosts:
            if not _HOST_NAME.match(h):
                raise NetworkEmulationError(f"host name {h!r} must be a lower-case letter then up to 15 "
                                            "letters or digits")
        if len(set(hosts)) != len(hosts):
            raise NetworkEmulationError(f"host names repeat: {list(hosts)}")
        if len(hosts) > 250:
            raise NetworkEmulationError(f"{len(hosts)} hosts: at most 250 per emulated network")
        self.hosts = list(hosts)
        self.profile = profile
        self.owner_pid = owner_pid or os.getpid()
        self.net_id = net_id or uuid.uuid4().hex[:8]
        self.prefix = f"{PREFIX}-{self.owner_pid}-{self.net_id}-"
        self.bridge_ns = self.prefix + _BRIDGE_NS_SUFFIX
        self.log = log
        self._watchdog_wanted = watchdog_process
        self._watchdog: Optional[subprocess.Popen] = None
        self._rates: Dict[str, Optional[int]] = {h: profile.rate_bit_s for h in hosts}
        self._losses: Dict[str, float] = {h: 0.0 for h in hosts}
        self._created: List[str] = []
        self._cuts: List[threading.Thread] = []
        self._closed = False
        self._lock: Optional[cleanup.OwnerLock] = None

    # -- what callers use ---------------------------------------------------------------------
    def namespace(self, host: str) -> str:
        self._check_host(host)
        return self.prefix + host

    def address(self, host: str) -> str:
        """The host's IPv4 address, routable from every other host of this network only."""
        self._check_host(host)
        i = self.hosts.index(host) + 2  # .0 network, .1 left free
        return f"{SUBNET_PREFIX}.{i // 256}.{i % 256}"

    def exec_argv(self, host: str, argv: Sequence[str]) -> List[str]:
        """``argv`` run inside ``host``'s namespace (same pid: exec, not a child)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def namespaces(self) -> List[str]:
        return [self.bridge_ns, *(self.prefix + h for h in self.hosts)]

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedNetwork":
        require_privilege()
        try:
            self._lock = cleanup.OwnerLock.hold(self.prefix)  # before the first namespace exists
            if self._watchdog_wanted:
                self._watchdog = watchdog.start(self.owner_pid, self.prefix)
            self._build()
        except BaseException:
            self.close()
            raise
        self.log(f"[network] {len(self.hosts)} emulated hosts ({self.profile.describe()}): "
                 + ", ".join(f"{h}={self.address(h)}" for h in self.hosts))
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove every namespace (and with them every veth, the bridge, every qdisc)."""
        if self._closed:
            return
        self._closed = True
        for t in self._cuts:
            t.join(timeout=0)  # daemon threads; their `ip` calls fail harmlessly once gone
        # whatever the caller did not stop would be left running, cut off, in a deleted namespace
        alive = [ns for ns in self._created if ns in list_namespaces()]
        left = cleanup.kill_inside(alive, grace_s=2.0)
        if left:
            self.log(f"[network] stopped {len(left)} process(es) still on the emulated hosts: {left}")
        errors = cleanup.delete_namespaces(list(reversed(self._created)), grace_s=2.0)
        self._created.clear()
        if self._lock is not None:
            self._lock.release(keep_file=bool(errors))
            self._lock = None
        if self._watchdog is not None:
            watchdog.stop(self._watchdog)
            self._watchdog = None
        if errors:
            raise NetworkEmulationError("teardown of the emulated network failed: " + "; ".join(errors))

    def _add_ns(self, name: str) -> None:
        self._created.append(name)  # before: a half-made namespace is still removed
        run_cmd(["ip", "netns", "add", name])
        run_cmd(["ip", "-n", name, "link", "set", "lo", "up"])

    def _write_hosts(self, host: str) -> None:
        """This host's /etc/hosts (bind-mounted by ``ip netns exec``): the machine's hostname
        resolves to the host's own address, as on a real machine or a pod. Gloo needs it: Horovod
        builds its process-set contexts from ``gethostname()``, not ``HOROVOD_GLOO_IFACE``, and on
        the root /etc/hosts that name is 127.0.0.1, which the other hosts cannot reach. Every
        emulated host is listed under its own name too."""
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 f"{self.address(host)} {socket.gethostname()}"]
        lines += [f"{self.address(h)} {h}" for h in self.hosts]
        d = os.path.join(ETC_NETNS, self.prefix + host)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _build(self) -> None:
        br = self.bridge_ns
        self._add_ns(br)
        run_cmd(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        run_cmd(["ip", "-n", br, "link", "set", "br0", "up"])
        for i, host in enumerate(self.hosts):
            ns = self.prefix + host
            self._add_ns(ns)
            self._write_hosts(host)
            port = f"p{i}"
            # created directly in both namespaces: the root namespace never holds either end
            run_cmd(["ip", "link", "add", HOST_IFACE, "netns", ns, "type", "veth",
                     "peer", "name", port, "netns", br])
            run_cmd(["ip", "-n", br, "link", "set", port, "master", "br0"])
            run_cmd(["ip", "-n", br, "link", "set", port, "up"])
            run_cmd(["ip", "-n", ns, "addr", "add", f"{self.address(host)}/{SUBNET_BITS}", "dev", HOST_IFACE])
            run_cmd(["ip", "-n", ns, "link", "set", HOST_IFACE, "up"])
            for end in self._ends(host):
                run_cmd(["tc", "-n", end.ns, "qdisc", "add", "dev", end.dev, "clsact"])
            self._apply_rate(host, self._rates[host])
            if self.profile.loss:
                self.set_loss(host, self.profile.loss)

    # -- fault hooks --------------------------------------------------------------------------
    def set_rate(self, host: str, rate_bit_s: Optional[int]) -> None:
        """Reshape ``host``'s link (both directions); ``None`` removes the shaping (a straggler
        is one host given a lower rate than the rest)."""
        self._check_host(host)
        self._apply_rate(host, rate_bit_s)
        self._rates[host] = rate_bit_s
        self.log(f"[network] {host}: rate {'unshaped' if rate_bit_s is None else format_rate(rate_bit_s)}")

    def set_loss(self, host: str, p: float) -> None:
        """Drop each packet leaving either end of ``host``'s link with probability ``p``."""
        self._check_host(host)
        if not 0.0 <= p < 1.0:
            raise NetworkEmulationError(f"loss {p!r} for host {host} must be in [0, 1)")
        for end in self._ends(host):
            if self._losses[host]:
                run_cmd(["tc", "-n", end.ns, "filter", "del", "dev", end.dev, "egress"])
            if p:
                run_cmd(["tc", "-n", end.ns, "filter", "add", "dev", end.dev, "egress", "prio", "1",
                         "bpf", "da", "bytecode", _loss_filter(p)])
        self._losses[host] = p
        self.log(f"[network] {host}: loss {p:g}")

    def cut(self, host: str, seconds: float, wait: bool = True) -> Optional[threading.Thread]:
        """Take ``host``'s link down (its bridge port: the host sees no carrier, as when a switch
        port fails; open TCP connections survive a short cut) for ``seconds``, then up again.
        ``wait=False`` returns at once with the thread that restores it."""
        self._check_host(host)
        port = self._ends(host)[1]
        run_cmd(["ip", "-n", port.ns, "link", "set", port.dev, "down"])
        self.log(f"[network] {host}: link cut for {seconds:g} s")

        def restore() -> None:
            time.sleep(seconds)
            if not self._closed:
                run_cmd(["ip", "-n", port.ns, "link", "set", port.dev, "up"])
                self.log(f"[network] {host}: link restored")

        if wait:
            restore()
            return None
        t = threading.Thread(target=restore, daemon=True, name=f"cut-{host}")
        t.start()
        self._cuts.append(t)
        return t

    # -- internals ----------------------------------------------------------------------------
    def _check_host(self, host: str) -> None:
        if host not in self.hosts:
            raise NetworkEmulationError(f"no emulated host {host!r} (hosts: {', '.join(self.hosts)})")

    def _ends(self, host: str) -> List[_End]:
        return [_End(self.prefix + host, HOST_IFACE), _End(self.bridge_ns, f"p{self.hosts.index(host)}")]

    def _apply_rate(self, host: str, rate_bit_s: Optional[int]) -> None:
        for end in self._ends(host):
            if rate_bit_s is None:
                if self._rates.get(host) is not None:
                    run_cmd(["tc", "-n", end.ns, "qdisc", "del", "dev", end.dev, "root"])
            else:
                run_cmd(["tc", "-n", end.ns, "qdisc", "replace", "dev", end.dev, "root", *_tbf_args(rate_bit_s)])

    def qdiscs(self, host: str) -> str:
        """``tc qdisc show`` of both ends of ``host``'s link (for tests and the log)."""
        return "".join(run_cmd(["tc", "-n", e.ns, "qdisc", "show", "dev", e.dev]) for e in self._ends(host))


def _main(argv: List[str]) -> int:
    """``python -m launch.network.netns sweep``: remove namespaces of dead launchers."""
    if argv[:1] == ["sweep"]:
        require_privilege()
        for name in sweep_stale():
            print(name)
        return exit_codes.DONE.code
    print("usage: python -m launch.network.netns sweep", file=sys.stderr)
    return exit_codes.USER_ERROR.code


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_main(sys.argv[1:]))
