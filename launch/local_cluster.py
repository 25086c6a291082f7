"""One cluster on one host: M parameter servers plus ``horovodrun -np N`` (``launch/supervisor.py``
decides what happens around it: restarts, stop signals; ``emulated_cluster.py`` puts the same
processes on emulated hosts).

What a user trusts this for:

* PS processes listen on free loopback ports and are waited on through their readiness probe
  (``ps/server.py``), never a sleep; a PS that dies before it is ready is named.
* Every line of every process is streamed with a prefix (``[ps0]``; Horovod's own
  ``[rank,...]<stdout>`` prefixes for the workers). Lines are only echoed: what the launcher
  knows of a rank (its step, its checkpoint, why it exited) it reads from the rank's status
  record (``gmeta_tf/train/rank_status.py``), never from text. Under ``horovodrun`` each rank runs
  behind ``launch/rank_agent.py``, which records the exit of a rank killed by a signal.
* A stop request (the launcher got a stop signal) is written as the stop file of the status
  directory, which every rank reads when it starts and at every step's vote: ranks that
  ``horovodrun`` has not started yet get it too, and all checkpoint at one agreed step. A second
  signal stops everything at once (``LaunchStopped``).
* Teardown on success, failure and interruption: every child runs in its own process group and
  the whole group gets SIGTERM, then SIGKILL after a grace period: no orphans.
* A launcher killed outright (kill -9) runs no teardown, so each child also asks the kernel for
  SIGTERM when the launcher dies (``prctl(PR_SET_PDEATHSIG)``), and a PS watches the launcher's
  pid (``LAUNCHER_PID_ENV``) besides: the PS, holding the tables in memory, never outlives it.
* What failed is readable afterwards (``rank_exits``, dead PS children, ``last_step_seen``),
  so the supervisor's message names the rank or PS at fault.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
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

from gmeta_tf import exit_codes
from gmeta_tf.errors import ClusterError
from gmeta_tf.quiet import NOISE
from gmeta_tf.stop_signals import StopSignals
from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import STATUS_DIR_ENV, STOP_FILE, STOP_FILE_ENV, RankStatus, StopRequest
from launch.elastic_hosts import horovodrun_args, this_machine_names, worker_hosts, write_discovery
from launch.horovodrun import argv as hvd_launch_argv
from launch.rank_agent import RANK_ARGV_ENV, agent_argv

LAUNCH_ID_ENV = "GMETA_LAUNCH_ID"  # set on every child, so tests can prove none outlives a launch
LAUNCHER_PID_ENV = "GMETA_LAUNCHER_PID"  # a PS started by a launcher exits when this pid is gone
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)  # loaded before any fork


def _die_with(parent: int):
    """A ``preexec_fn``: SIGTERM this child when ``parent`` (the launcher) dies, however it dies.
    If the launcher is already gone when the child gets here, the child exits at once, with the
    code the death signal would have given it a moment later."""
    def setup() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(exit_codes.signal_exit(signal.SIGTERM))
    return setup


class WorkersTimedOut(ClusterError):
    """The workers were still running when the launch's time-out (``--timeout``) ran out; they
    have been stopped. A type, not a number: the old 124 returned in place of a process's code
    could be read as a worker's own. Uncaught, it exits ``TIMED_OUT`` (124) as the launch does."""

    exit_code = exit_codes.TIMED_OUT.code

    def __init__(self, timeout_s: float):
        super().__init__(f"workers still running after {timeout_s:.0f} s: stopped")
        self.timeout_s = timeout_s


class LaunchStopped(KeyboardInterrupt):
    """The launcher was stopped by ``signum`` before (or without) a preemption checkpoint: a stop
    signal while the PS start or during a restart's back-off, or a second one."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


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


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    lines: List[str] = field(default_factory=list)
    thread: Optional[threading.Thread] = None
    stopping: bool = False
    rank: Optional[int] = None  # a worker rank the launcher started itself (no horovodrun)


class LocalCluster:
    # Whether a restart after a lost worker may keep this cluster's PS (launch/supervisor.py):
    # true where the PS are plain local processes; an emulated network's hosts are not.
    keeps_ps_across_restarts = True

    def __init__(self, log: Callable[[str], None] = print, env: Optional[Dict[str, str]] = None,
                 grace_s: float = 10.0, elastic: bool = False, elastic_dir: Optional[str] = None,
                 elastic_cooldown_s: Optional[List[int]] = None, elastic_reset_limit: Optional[int] = None):
        self.log = log
        # Horovod Elastic (``--elastic``): a lost rank is the ring's to absorb, not a failure here.
        # ``elastic_dir`` holds the ring's host discovery script and host file
        # (``launch/elastic_hosts.py``); ``elastic_cooldown_s`` is ``cluster.elastic_cooldown_s``,
        # ``elastic_reset_limit`` ``cluster.elastic_reset_limit`` (horovodrun's ``--reset-limit``).
        self.elastic = elastic
        self.elastic_dir = elastic_dir
        self.elastic_cooldown_s = elastic_cooldown_s
        self.elastic_reset_limit = elastic_reset_limit
        self._lost_logged: List[tuple] = []  # (rank, pid) of each lost rank said
        self._joined_logged: List[int] = []  # pids of the workers said to have joined the ring
        self.launch_id = os.environ.get(LAUNCH_ID_ENV) or uuid.uuid4().hex
        self.env = {**os.environ, **(env or {}), LAUNCH_ID_ENV: self.launch_id, "PYTHONUNBUFFERED": "1",
                    LAUNCHER_PID_ENV: str(os.getpid())}
        self.grace_s = grace_s
        self.children: List[Child] = []
        self.ps_addresses: List[str] = []
        self._lock = threading.Lock()
        self.stop_grace_s = 0.0
        self.first_failure_at: Optional[float] = None  # wall clock of the first death seen
        self.exit_order: List[Child] = []  # waited-for processes, in the order they exited
        self.status_dir: Optional[str] = None  # the ranks' status records and the stop file
        self.signals: Optional[StopSignals] = None  # the launcher's, read by the wait loop
        self._stop_asked: List[int] = []
        self._survivors_ended = False  # once per set of ranks (``_end_survivors_of_a_lost_rank``)

    def watch_stops(self, signals: Optional[StopSignals], grace_s: float, status_dir: Optional[str]) -> None:
        """Stop signals the wait loops act on (``signals``: recorded by the launcher's handler),
        the ranks' grace period, and the directory of their status records and stop file."""
        self.signals, self.stop_grace_s, self.status_dir = signals, grace_s, status_dir

    def rank_env(self) -> Dict[str, str]:
        """What tells a rank where its status record goes and which stop file it obeys."""
        if not self.status_dir:
            return {}
        return {STATUS_DIR_ENV: self.status_dir, STOP_FILE_ENV: os.path.join(self.status_dir, STOP_FILE)}

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
                wait_ready(f"http://127.0.0.1:{health_ports[i]}/ready", timeout_s, child.proc,
                           stop=lambda: bool(self.stop_signals()))
            except InterruptedError:
                raise LaunchStopped(self.stop_signals()[0]) from None
            except (RuntimeError, TimeoutError) as e:
                raise ClusterError(f"{child.name} did not become ready: {e}") from None
        self.log(f"[launch] {count} PS ready: {', '.join(self.ps_addresses)}")
        return self.ps_addresses

    def run_workers(self, workers: int, worker_argv: List[str], timeout_s: Optional[float] = None,
                    env: Optional[Dict[str, str]] = None, shown: Optional[List[str]] = None) -> int:
        """Run ``worker_argv`` as ``workers`` ranks under ``horovodrun`` to its end (``shown``: the
        command the log line names instead, when ``worker_argv`` wraps it)."""
        if self.elastic:
            hosts = worker_hosts(workers, this_machine_names())
            directory = self.elastic_dir or os.path.join(self.status_dir or ".", "elastic")
            args = horovodrun_args(workers, write_discovery(directory, hosts), self.elastic_cooldown_s,
                                   reset_limit=self.elastic_reset_limit)
        else:
            args = ["-np", str(workers), "-H", f"localhost:{workers}", "--gloo"]
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))  # what the line shows: the same run
        self.log(f"[launch] {shlex.join([horovodrun, *args, *(shown or worker_argv)])}")
        argv = [*hvd_launch_argv(), *args, *worker_argv]  # horovodrun without its per-launch Gloo probe
        return self.wait_workers([self.spawn("horovodrun", argv, env=env)], timeout_s)

    def train(self, workers: int, train_args: List[str], timeout_s: Optional[float] = None) -> int:
        """``gmeta train train_args`` as ``workers`` Horovod ranks against this cluster's PS, each
        behind ``launch/rank_agent.py`` when there is a status directory."""
        argv = [sys.executable, "-m", "gmeta_tf.cli.main", "train", *train_args]
        if self.ps_addresses:
            argv += ["--ps", ",".join(self.ps_addresses)]
        if not self.status_dir:
            return self.run_workers(workers, argv, timeout_s)
        self.start_ranks()
        env = {**self.rank_env(), RANK_ARGV_ENV: json.dumps(argv)}
        return self.run_workers(workers, agent_argv(), timeout_s, env=env, shown=argv)

    def start_ranks(self) -> None:
        """Before a cluster's ranks start: the records and stop file of the one before go."""
        if self.status_dir:
            os.makedirs(self.status_dir, exist_ok=True)
            rank_status.clear(self.status_dir)

    def wait_workers(self, waited: List[Child], timeout_s: Optional[float] = None) -> int:
        """Wait for ``waited`` (horovodrun, or the workers themselves) to exit; their first
        non-zero code, or 0 (``DONE``); raises ``WorkersTimedOut`` at the time-out. A stop signal is delivered to every rank as
        the stop file (``deliver_stop``), running or still to start, so they checkpoint at one
        agreed step (``gmeta_tf/train/preemption.py``); after the grace period (plus a margin)
        they are stopped. A second signal raises ``LaunchStopped`` (the caller tears down)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stop_deadline = None
        while any(c.proc.poll() is None for c in waited):
            for c in self.ps_children():
                if c.proc.poll() is not None and not c.stopping:
                    c.stopping = True  # report once; the workers fail on their own, naming it
                    self.first_failure_at = self.first_failure_at or time.time()
                    self.log(f"[launch] {c.name} died ({exit_codes.describe(c.proc.returncode)})")
            self._note_exits(waited)
            self._end_survivors_of_a_lost_rank()
            self.tick()
            asked = self.stop_signals()
            if len(asked) > 1:
                raise LaunchStopped(asked[0])
            if asked and stop_deadline is None:
                self.deliver_stop(asked[0])
                stop_deadline = time.monotonic() + self.stop_grace_s + 5.0
            over = stop_deadline is not None and time.monotonic() > stop_deadline
            if over or (deadline is not None and time.monotonic() > deadline):
                self.log("[launch] workers still running after the grace period: stopping them" if over else
                         f"[launch] workers still running after {timeout_s:.0f} s: stopping them")
                for c in waited:
                    self._stop(c)
                if not over:
                    self._note_exits(waited)
                    raise WorkersTimedOut(timeout_s)
                break
            time.sleep(0.1)
        self._note_exits(waited)
        for c in waited:
            if c.thread is not None:
                c.thread.join(timeout=5)
        codes = [c.proc.returncode for c in self.exit_order if c in waited and c.proc.returncode]
        if codes:
            self.first_failure_at = self.first_failure_at or time.time()
        return codes[0] if codes else exit_codes.DONE.code

    def _note_exits(self, waited: List[Child]) -> None:
        """Exits in the order they happened; a rank this launcher started and reaped itself gets
        the exit its code tells written into its record, as ``rank_agent`` does under horovodrun."""
        for c in waited:
            if c.proc.poll() is not None and c not in self.exit_order:
                self.exit_order.append(c)
                if c.rank is not None and self.status_dir:
                    rank_status.record_exit(self.status_dir, c.rank, c.proc.pid, c.proc.returncode)

    def _end_survivors_of_a_lost_rank(self) -> None:
        """A rank that died without a word of its own (killed by a signal, or exited with no
        record of why: ``rank_status.SILENT_EXITS``), no stop having been asked, leaves a ring
        that cannot take another step: its peers would find out only at their next collective,
        and horovodrun only after them (3.9 s of a 22.7 s recovery, docs/fault_tolerance.md).
        Its agent records the death at once, so the survivors are killed here as soon as it is
        read; a restart follows from the last complete checkpoint, as it would have anyway. A
        rank that failed with a reason (a lost PS, a bad input) is left to end on its own: its
        peers fail naming the same cause."""
        if self._survivors_ended or self.stop_signals():
            return
        if self.elastic:  # every process's record: a lost worker and the one that joined in its slot
            processes = self.process_records()
            self._note_lost_elastic([r for r in processes
                                     if r.exit is not None and r.exit.reason in rank_status.SILENT_EXITS])
            self._note_joined_elastic(processes)
            return
        records = self.rank_records()
        lost = [r for r in records.values() if r.exit is not None and r.exit.reason in rank_status.SILENT_EXITS]
        if not lost:
            return
        self._survivors_ended = True
        self.first_failure_at = self.first_failure_at or min(r.updated_unix for r in lost)
        survivors = [r for r in records.values() if r.exit is None]
        self.log(f"[launch] worker rank {lost[0].rank} {lost[0].exit.message}: ending the other "
                 f"{len(survivors)} rank(s) now (the ring cannot take another step without it)")
        for r in survivors:
            try:
                os.kill(r.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _note_lost_elastic(self, lost: List[RankStatus]) -> None:
        """Under Horovod Elastic the survivors roll back to their last commit and go on as a
        smaller ring: each lost rank (process) is said once, and nobody is ended."""
        for r in lost:
            if (r.rank, r.pid) not in self._lost_logged:
                self._lost_logged.append((r.rank, r.pid))
                self.log(f"[launch] worker rank {r.rank} {r.exit.message}: elastic, the other ranks go on "
                         f"without it from their last commit")

    def _note_joined_elastic(self, records: List[RankStatus]) -> None:
        """A worker horovodrun started on a returned host (``cluster.elastic_cooldown_s``) says in its
        record the commit it joined the running ring at (``joined_step``, ``ring``); said once."""
        for r in records:
            if r.joined_step is not None and r.ring and r.pid not in self._joined_logged:
                self._joined_logged.append(r.pid)
                _, rank, size = r.ring[0]
                self.log(f"[launch] a new worker (pid {r.pid}) joined the elastic ring as rank {rank} of {size} "
                         f"at the commit of step {r.joined_step}: the ring grew back")

    def elastic_outcome(self) -> Optional[str]:
        """How an elastic ring that finished ended, from the ranks' records: the ring's size at the
        end (the ranks that finished) and the workers lost and joined on the way."""
        if not self.elastic:
            return None
        records = self.process_records()
        self._note_joined_elastic(records)
        done = [r for r in records if r.exit is not None and r.exit.reason is rank_status.ExitReason.DONE]
        sizes = {r.ring[-1][2] for r in done if r.ring}
        size = max(sizes) if sizes else len(done)
        return (f"[launch] elastic: the ring finished with {size} rank(s); {len(self._lost_logged)} worker(s) lost, "
                f"{len(self._joined_logged)} joined on a returned host")

    def tick(self) -> None:
        """Called every 0.1 s while the workers run (emulated clusters fire scheduled faults)."""

    def stop_signals(self) -> List[int]:
        """The stop signals this launch got, in order (recorded by the launcher's handler)."""
        return self._stop_asked + (list(self.signals.received) if self.signals is not None else [])

    def request_stop(self, signum: int, grace_s: float) -> None:
        """Ask for a stop as a signal would (the wait loop delivers it)."""
        self._stop_asked.append(signum)
        self.stop_grace_s = grace_s

    def deliver_stop(self, signum: int) -> None:
        """Write the stop file every rank reads when it starts and at each step's vote; without a
        status directory the ranks cannot be asked, so they are stopped."""
        name = exit_codes.signal_name(signum)
        if not self.status_dir:
            self.log(f"[launch] {name}: no status directory to ask the workers through: stopping them")
            for c in self.children:
                if not c.name.startswith("ps:"):
                    self._stop(c)
            return
        StopRequest(signum, time.time()).write(os.path.join(self.status_dir, STOP_FILE))
        self.log(f"[launch] {name}: asking every worker for a preemption checkpoint "
                 f"(grace {self.stop_grace_s:g} s)")

    def rank_records(self) -> Dict[int, RankStatus]:
        """Every rank's status record, by rank (none without a status directory)."""
        return rank_status.read_all(self.status_dir)

    def process_records(self) -> List[RankStatus]:
        """Every process's status record (an elastic ring's lost and joined workers each have one)."""
        return rank_status.read_processes(self.status_dir)

    def rank_exits(self) -> List[RankStatus]:
        """The records of the ranks that exited other than done, in the order they exited: the
        first is the rank at fault, the others followed it (horovodrun stops them, or a
        collective with it failed)."""
        out = [r for r in self.process_records()
               if r.exit is not None and r.exit.reason is not rank_status.ExitReason.DONE]
        return sorted(out, key=lambda r: r.updated_unix)

    def last_step_seen(self) -> Optional[int]:
        """The newest step any rank's record reports (written at each logged step, each
        checkpoint and at its exit)."""
        steps = [r.step for r in self.rank_records().values()]
        return max(steps) if steps else None

    def ps_children(self) -> List[Child]:
        return [c for c in self.children if c.name.startswith("ps:")]

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
        self._end(list(reversed(self.children)))  # workers first, then the PS

    def teardown_workers(self) -> None:
        """End every process but the PS, and forget them and their exits: the cluster's PS serve
        the next set of workers (a restart after a lost worker, ``launch/supervisor.py``)."""
        ps = self.ps_children()
        workers = [c for c in reversed(self.children) if c not in ps]
        self._end(workers)
        self.children = [c for c in self.children if c in ps]
        self.exit_order, self.first_failure_at, self._survivors_ended = [], None, False

    def _end(self, children: List[Child]) -> None:
        for child in children:
            self._stop(child)
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)  # anything the child left in its group
            except (ProcessLookupError, PermissionError):
                pass
        for child in children:
            if child.thread is not None:
                child.thread.join(timeout=2)
