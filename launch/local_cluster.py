"""One cluster on one host: M parameter servers plus ``horovodrun -np N`` (``launch/supervisor.py``
decides what happens around it: restarts, stop signals; ``emulated_cluster.py`` puts the same
processes on emulated hosts).

What a user trusts this for:

* PS processes listen on free loopback ports and are waited on through their readiness probe
  (``ps/server.py``), never a sleep; a PS that dies before it is ready is named.
* Every line of every process is streamed with a prefix (``[ps0]``; Horovod's own
  ``[rank,...]<stdout>`` prefixes for the workers).
* A stop request (``request_stop``: the launcher got SIGTERM / Ctrl-C) goes to every rank as the
  signal itself, so they checkpoint at one agreed step before exiting.
* Teardown on success, failure and interruption: every child runs in its own process group and
  the whole group gets SIGTERM, then SIGKILL after a grace period: no orphans.
* A launcher killed outright (kill -9) runs no teardown, so each child also asks the kernel for
  SIGTERM when the launcher dies (``prctl(PR_SET_PDEATHSIG)``), and a PS watches the launcher's
  pid (``LAUNCHER_PID_ENV``) besides: the PS, holding the tables in memory, never outlives it.
* What failed is readable afterwards (``failed_ranks``, dead PS children, ``last_step_seen``),
  so the supervisor's message names the rank or PS at fault.
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
_STEP_SEEN = re.compile(r"\bstep (\d+)/\d+|\bat step (\d+)|checkpointed step (\d+)")
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


def signal_name(code: int) -> str:
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
        self.stop_signal: Optional[int] = None
        self.stop_grace_s = 0.0
        self.first_failure_at: Optional[float] = None  # wall clock of the first death seen
        self.exit_order: List[Child] = []  # waited-for processes, in the order they exited

    # -- processes ----------------------------------------------------------------------------
    def spawn(self, name: str, argv: List[str], prefix: Optional[str] = None,
              env: Optional[Dict[str, str]] = None) -> Child:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
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
        """Run ``worker_argv`` as ``workers`` ranks under ``horovodrun`` to its end."""
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        argv = [horovodrun, "-np", str(workers), "-H", f"localhost:{workers}", "--gloo", *worker_argv]
        self.log(f"[launch] {shlex.join(argv)}")
        return self.wait_workers([self.spawn("horovodrun", argv)], timeout_s)

    def train(self, workers: int, train_args: List[str], timeout_s: Optional[float] = None) -> int:
        """``gmeta train train_args`` as ``workers`` Horovod ranks against this cluster's PS."""
        argv = [sys.executable, "-m", "gmeta_tf.cli.main", "train", *train_args]
        if self.ps_addresses:
            argv += ["--ps", ",".join(self.ps_addresses)]
        return self.run_workers(workers, argv, timeout_s)

    def wait_workers(self, waited: List[Child], timeout_s: Optional[float] = None) -> int:
        """Wait for ``waited`` (horovodrun, or the workers themselves) to exit; their first
        non-zero code, 0, or 124 at the time-out. A stop request (``request_stop``) is passed to
        every rank as the signal itself, so they checkpoint at one agreed step
        (``gmeta_tf/train/preemption.py``); horovodrun's own SIGTERM handling would give them 5 s."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        forwarded = None
        while any(c.proc.poll() is None for c in waited):
            for c in self.ps_children():
                if c.proc.poll() is not None and not c.stopping:
                    c.stopping = True  # report once; the workers fail on their own, naming it
                    self.first_failure_at = self.first_failure_at or time.time()
                    self.log(f"[launch] {c.name} died ({signal_name(c.proc.returncode)})")
            for c in waited:
                if c.proc.poll() is not None and c not in self.exit_order:
                    self.exit_order.append(c)
            self.tick()
            if self.stop_signal is not None and forwarded is None:
                pids = self.worker_pids()
                self.log(f"[launch] {signal.Signals(self.stop_signal).name}: asking {len(pids)} worker(s) for a "
                         f"preemption checkpoint (grace {self.stop_grace_s:g} s)")
                for pid in pids:
                    try:
                        os.kill(pid, self.stop_signal)
                    except ProcessLookupError:
                        pass
                forwarded = time.monotonic() + self.stop_grace_s + 5.0
            over = forwarded is not None and time.monotonic() > forwarded
            if over or (deadline is not None and time.monotonic() > deadline):
                self.log("[launch] workers still running after the grace period: stopping them" if over else
                         f"[launch] workers still running after {timeout_s:.0f} s: stopping them")
                for c in waited:
                    self._stop(c)
                if not over:
                    return 124
                break
            time.sleep(0.1)
        for c in waited:
            if c not in self.exit_order:
                self.exit_order.append(c)
            if c.thread is not None:
                c.thread.join(timeout=5)
        codes = [c.proc.returncode for c in self.exit_order if c in waited and c.proc.returncode]
        if codes:
            self.first_failure_at = self.first_failure_at or time.time()
        return codes[0] if codes else 0

    def tick(self) -> None:
        """Called every 0.1 s while the workers run (emulated clusters fire scheduled faults)."""

    def request_stop(self, signum: int, grace_s: float) -> None:
        """Called from the launcher's signal handler: ``wait_workers`` forwards it."""
        self.stop_signal, self.stop_grace_s = signum, grace_s

    def worker_pids(self) -> List[int]:
        """The ``gmeta train`` rank processes under ``horovodrun`` (each in a session of its own,
        behind Horovod's middleman and a shell, so neither its group nor its children list has them)."""
        import psutil

        out = []
        for hv in (c for c in self.children if c.name == "horovodrun"):
            try:
                for p in psutil.Process(hv.proc.pid).children(recursive=True):
                    try:
                        cmd = p.cmdline()
                    except psutil.Error:
                        continue
                    if "gmeta_tf.cli.main" in cmd and "train" in cmd:
                        out.append(p.pid)
            except psutil.Error:
                pass
        return out

    def last_step_seen(self) -> Optional[int]:
        """The newest step the ranks logged or named in a failure (``step N/M``, ``at step N``)."""
        seen = None
        for c in self.children:
            for line in c.lines[-400:]:
                for m in _STEP_SEEN.finditer(line):
                    seen = max(seen or 0, int(next(g for g in m.groups() if g)))
        return seen

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
