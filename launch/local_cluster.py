"""``gmeta launch local``: M parameter servers plus ``horovodrun -np N`` on one host.

What a user trusts this for:

* PS processes listen on free loopback ports and are waited on through their readiness probe
  (``ps/server.py``), never a sleep; a PS that dies before it is ready is named.
* Every line of every process is streamed with a prefix (``[ps0]``; Horovod's own
  ``[rank,...]<stdout>`` prefixes for the workers).
* Teardown on success, failure and Ctrl-C / SIGTERM / SIGHUP: every child runs in its own
  process group and the whole group gets SIGTERM, then SIGKILL after a grace period: no orphans.
* A launcher killed outright (kill -9) runs no teardown, so each child also asks the kernel for
  SIGTERM when the launcher dies (``prctl(PR_SET_PDEATHSIG)``), and a PS watches the launcher's
  pid (``LAUNCHER_PID_ENV``) besides: the PS, holding the tables in memory, never outlives it.
* The exit code is non-zero if any rank or PS failed, and the message names which.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from gmeta_tf.errors import ClusterError
from gmeta_tf.quiet import NOISE

LAUNCH_ID_ENV = "GMETA_LAUNCH_ID"  # set on every child, so tests can prove none outlives a launch
LAUNCHER_PID_ENV = "GMETA_LAUNCHER_PID"  # a PS started by a launcher exits when this pid is gone
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)  # loaded before any fork


def _die_with(parent: int):
    """A ``preexec_fn``: SIGTERM this child when ``parent`` (the launcher) dies, however it dies.
    If the launcher is already gone when the child gets here, the child exits at once."""
    def setup() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return setup
_RANK_EXIT = re.compile(r"Process (\d+) exit with status code (-?\d+)")
_FIRST_FAILURE = re.compile(r"Terminating remaining workers after failure of Process (\d+)")


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


def _signal_name(code: int) -> str:
    # Popen reports a signal as -N; horovodrun reports its ranks' as 128 + N, the shell's way
    sig = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    if sig:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit code {code}"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    lines: List[str] = field(default_factory=list)
    thread: Optional[threading.Thread] = None
    stopping: bool = False


class LocalCluster:
    def __init__(self, log: Callable[[str], None] = print, env: Optional[Dict[str, str]] = None,
                 grace_s: float = 10.0):
        self.log = log
        self.launch_id = os.environ.get(LAUNCH_ID_ENV) or uuid.uuid4().hex
        self.env = {**os.environ, **(env or {}), LAUNCH_ID_ENV: self.launch_id, "PYTHONUNBUFFERED": "1",
                    LAUNCHER_PID_ENV: str(os.getpid())}
        self.grace_s = grace_s
        self.children: List[Child] = []
        self.ps_addresses: List[str] = []
        self._lock = threading.Lock()

    # -- processes ----------------------------------------------------------------------------
    def spawn(self, name: str, argv: List[str], prefix: Optional[str] = None) -> Child:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True, text=True, bufsize=1,
                                preexec_fn=_die_with(os.getpid()))
        child = Child(name, proc)
        tag = f"[{prefix}] " if prefix else ""

        def pump():
            for line in proc.stdout:
                line = line.rstrip("\n")
                if NOISE.search(line):  # TF start-up chatter of horovodrun and the ranks
                    continue
                child.lines.append(line)
                if len(child.lines) > 2000:
                    del child.lines[:1000]
                with self._lock:
                    self.log(f"{tag}{line}")

        child.thread = threading.Thread(target=pump, daemon=True)
        child.thread.start()
        self.children.append(child)
        return child

    def start_ps(self, count: int, timeout_s: float = 120.0, python: str = sys.executable) -> List[str]:
        from ps.server import wait_ready

        ports = free_ports(2 * count)
        grpc_ports, health_ports = ports[:count], ports[count:]
        self.ps_addresses = [f"127.0.0.1:{p}" for p in grpc_ports]
        ps_children = []
        for i in range(count):
            argv = [python, "-m", "gmeta_tf.cli.main", "ps", "serve", "--ps-hosts", ",".join(self.ps_addresses),
                    "--index", str(i), "--health-port", str(health_ports[i])]
            ps_children.append(self.spawn(f"ps:{i} ({self.ps_addresses[i]})", argv, prefix=f"ps{i}"))
        for i, child in enumerate(ps_children):
            try:
                wait_ready(f"http://127.0.0.1:{health_ports[i]}/ready", timeout_s, child.proc)
            except (RuntimeError, TimeoutError) as e:
                raise ClusterError(f"{child.name} did not become ready: {e}") from None
        self.log(f"[launch] {count} PS ready: {', '.join(self.ps_addresses)}")
        return self.ps_addresses

    def run_workers(self, workers: int, worker_argv: List[str], timeout_s: Optional[float] = None) -> int:
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        argv = [horovodrun, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", *worker_argv]
        self.log(f"[launch] {shlex.join(argv)}")
        child = self.spawn("horovodrun", argv)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while child.proc.poll() is None:
            for c in self.ps_children():
                if c.proc.poll() is not None and not c.stopping:
                    c.stopping = True  # report once; the workers fail on their own, naming it
                    self.log(f"[launch] {c.name} died ({_signal_name(c.proc.returncode)})")
            if deadline is not None and time.monotonic() > deadline:
                self.log(f"[launch] workers still running after {timeout_s:.0f} s: stopping them")
                self._stop(child)
                return 124
            time.sleep(0.2)
        child.thread.join(timeout=5)
        return child.proc.returncode

    def ps_children(self) -> List[Child]:
        return [c for c in self.children if c.name.startswith("ps:")]

    def failed_ranks(self) -> Dict[int, int]:
        """``{rank: exit code}`` of the ranks that failed first: the ones horovodrun stopped
        because another had failed are left out, so the message names the rank at fault."""
        hv = [c for c in self.children if c.name == "horovodrun"]
        out, first = {}, None
        for line in hv[0].lines if hv else []:
            m = _RANK_EXIT.search(line)
            if m and int(m.group(2)) != 0:
                out[int(m.group(1))] = int(m.group(2))
            m = _FIRST_FAILURE.search(line)
            if m and first is None:
                first = int(m.group(1))
        return {first: out[first]} if first in out else out

    # -- teardown -----------------------------------------------------------------------------
    def _stop(self, child: Child) -> None:
        child.stopping = True
        if child.proc.poll() is not None:
            return
        try:
            os.killpg(child.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            child.proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.proc.wait()

    def teardown(self) -> None:
        for child in reversed(self.children):  # workers first, then the PS
            self._stop(child)
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)  # anything the child left in its group
            except (ProcessLookupError, PermissionError):
                pass
        for child in self.children:
            if child.thread is not None:
                child.thread.join(timeout=2)


def launch_local(workers: int, ps: int, train_argv: List[str], log: Callable[[str], None] = print,
                 timeout_s: Optional[float] = None, ps_ready_timeout_s: float = 120.0) -> int:
    """Start ``ps`` PS tasks and ``workers`` Horovod ranks running ``gmeta train train_argv``.

    Returns 0 on success; raises ``ClusterError`` naming every failed rank / PS otherwise.
    """
    if workers < 1 or ps < 0:
        raise ClusterError(f"--workers must be >= 1 and --ps >= 0 (got {workers}, {ps})")
    cluster = LocalCluster(log=log)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for s in previous:  # a closed terminal (SIGHUP) tears down like Ctrl-C
        signal.signal(s, on_term)
    try:
        addresses = cluster.start_ps(ps, ps_ready_timeout_s) if ps else []
        argv = [sys.executable, "-m", "gmeta_tf.cli.main", "train", *train_argv]
        if addresses:
            argv += ["--ps", ",".join(addresses)]
        code = cluster.run_workers(workers, argv, timeout_s)
        problems = []
        for rank, rc in sorted(cluster.failed_ranks().items()):
            problems.append(f"worker rank {rank} failed ({_signal_name(rc)})")
        for c in cluster.ps_children():
            if c.proc.poll() is not None:
                problems.append(f"{c.name} died ({_signal_name(c.proc.returncode)})")
        if code == 124:
            problems.append(f"timed out after {timeout_s:.0f} s")
        if code != 0 and not problems:
            problems.append(f"horovodrun failed ({_signal_name(code)})")
        if problems:
            raise ClusterError("launch failed: " + "; ".join(problems))
        return 0
    except KeyboardInterrupt:
        log("[launch] interrupted: stopping every process")
        raise
    finally:
        cluster.teardown()
        for s, handler in previous.items():
            signal.signal(s, handler)
