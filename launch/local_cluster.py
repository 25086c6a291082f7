"""One cluster on one host: M parameter servers plus ``horovodrun -np N``, composed from the
launcher's parts: the processes (``processes.py``: groups, prefixed output, teardown), the PS
(``ps_lifecycle.py``: start, the one readiness wait), the workers (``worker_launch.py``:
horovodrun, the rank agent, an elastic ring). What this class adds is the watch of one set of
workers; ``supervisor.py`` decides what happens around it (restarts, stop signals), and
``emulated_cluster.py`` puts the same processes on emulated hosts.

What a user trusts this for:

* Lines are only echoed: what the launcher knows of a rank (its step, its checkpoint, why it
  exited) it reads from the rank's status record (``gmeta_tf/train/rank_status.py``), never
  from text. Under ``horovodrun`` each rank runs behind ``launch/rank_agent.py``, which records
  the exit of a rank killed by a signal.
* A stop request (the launcher got a stop signal) is written as the stop file of the status
  directory, which every rank reads when it starts and at every step's vote: ranks that
  ``horovodrun`` has not started yet get it too, and all checkpoint at one agreed step. A second
  signal stops everything at once (``LaunchStopped``).
* Teardown on success, failure and interruption ends every child's whole process group, workers
  first; a PS also watches the launcher's pid (``LAUNCHER_PID_ENV``), so the PS, holding the
  tables in memory, never outlives a launcher killed outright.
* What failed is readable afterwards (``rank_exits``, dead PS children, ``last_step_seen``),
  so the supervisor's message names the rank or PS at fault.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from typing import Callable, Dict, List, Optional

from gmeta_tf import exit_codes
from gmeta_tf.stop_signals import StopSignals
from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import STATUS_DIR_ENV, STOP_FILE, STOP_FILE_ENV, RankStatus, StopRequest
from launch import ps_lifecycle, worker_launch
from launch.outcomes import LaunchStopped, WorkersTimedOut
from launch.processes import Child, end_children, spawn_child, stop_child
from launch.ps_lifecycle import free_ports
from launch.worker_launch import ElasticRing
from ps.server import LAUNCHER_PID_ENV  # a PS started by a launcher exits when this pid is gone

__all__ = ["LAUNCHER_PID_ENV", "LAUNCH_ID_ENV", "Child", "LaunchStopped", "LocalCluster", "WorkersTimedOut",
           "free_ports"]

LAUNCH_ID_ENV = "GMETA_LAUNCH_ID"  # set on every child, so tests can prove none outlives a launch
_STOP_MARGIN_S = 5.0  # past the ranks' grace period, before the launcher stops them itself
_WATCH_S = 0.1


class LocalCluster:
    # Whether a restart after a lost worker may keep this cluster's PS (launch/supervisor.py):
    # true where the PS are plain local processes; an emulated network's hosts are not.
    keeps_ps_across_restarts = True

    def __init__(self, log: Callable[[str], None] = print, env: Optional[Dict[str, str]] = None,
                 grace_s: float = 10.0, elastic: bool = False, elastic_dir: Optional[str] = None,
                 elastic_cooldown_s: Optional[List[int]] = None, elastic_reset_limit: Optional[int] = None):
        self.log = log
        # Horovod Elastic (``--elastic``): a lost rank is the ring's to absorb, not a failure here
        # (``launch/worker_launch.py``, ``ElasticRing``).
        self.elastic = elastic
        self.ring = ElasticRing(elastic_dir, elastic_cooldown_s, elastic_reset_limit) if elastic else None
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
        child = spawn_child(name, argv, {**self.env, **(env or {})}, self.log, self._lock, prefix=prefix)
        self.children.append(child)
        return child

    def start_ps(self, count: int, timeout_s: float = 120.0, python: str = sys.executable) -> List[str]:
        """``count`` PS on free loopback ports, each waited on through its readiness probe."""
        addresses, started = ps_lifecycle.start_local_ps(self.spawn, count, python)
        self.ps_addresses = addresses
        ps_lifecycle.wait_ready(started, timeout_s, self.stop_signals)
        self.log(f"[launch] {count} PS ready: {', '.join(self.ps_addresses)}")
        return self.ps_addresses

    def run_workers(self, workers: int, worker_argv: List[str], timeout_s: Optional[float] = None,
                    env: Optional[Dict[str, str]] = None, shown: Optional[List[str]] = None) -> int:
        """Run ``worker_argv`` as ``workers`` ranks under ``horovodrun`` to its end (``shown``: the
        command the log line names instead, when ``worker_argv`` wraps it)."""
        args = worker_launch.ring_args(workers, self.ring, self.status_dir)
        argv, line = worker_launch.horovodrun_command(args, worker_argv, shown)
        self.log(line)
        return self.wait_workers([self.spawn("horovodrun", argv, env=env)], timeout_s)

    def train(self, workers: int, train_args: List[str], timeout_s: Optional[float] = None) -> int:
        """``gmeta train train_args`` as ``workers`` Horovod ranks against this cluster's PS, each
        behind ``launch/rank_agent.py`` when there is a status directory."""
        argv = worker_launch.train_argv(train_args, self.ps_addresses)
        if not self.status_dir:
            return self.run_workers(workers, argv, timeout_s)
        self.start_ranks()
        env = worker_launch.agent_env(self.rank_env(), argv)
        return self.run_workers(workers, worker_launch.agent_argv(), timeout_s, env=env, shown=argv)

    def start_ranks(self) -> None:
        """Before a cluster's ranks start: the records and stop file of the one before go."""
        if self.status_dir:
            os.makedirs(self.status_dir, exist_ok=True)
            rank_status.clear(self.status_dir)

    # -- the watch of one set of workers --------------------------------------------------------
    def wait_workers(self, waited: List[Child], timeout_s: Optional[float] = None) -> int:
        """Wait for ``waited`` (horovodrun, or the workers themselves) to exit; their first
        non-zero code, or 0 (``DONE``); raises ``WorkersTimedOut`` at the time-out. A stop signal is delivered to every rank as
        the stop file (``deliver_stop``), running or still to start, so they checkpoint at one
        agreed step (``gmeta_tf/train/preemption.py``); after the grace period (plus a margin)
        they are stopped. A second signal raises ``LaunchStopped`` (the caller tears down)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stop_deadline = None
        while any(c.proc.poll() is None for c in waited):
            self._watch_once(waited)
            stop_deadline = self._act_on_stops(stop_deadline)
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
            time.sleep(_WATCH_S)
        return self._first_code(waited)

    def _watch_once(self, waited: List[Child]) -> None:
        """One look at the cluster while the workers run: a dead PS, exits, a lost rank, faults."""
        for c in self.ps_children():
            if c.proc.poll() is not None and not c.stopping:
                c.stopping = True  # report once; the workers fail on their own, naming it
                self.first_failure_at = self.first_failure_at or time.time()
                self.log(f"[launch] {c.name} died ({exit_codes.describe(c.proc.returncode)})")
        self._note_exits(waited)
        self._end_survivors_of_a_lost_rank()
        self.tick()

    def _act_on_stops(self, stop_deadline: Optional[float]) -> Optional[float]:
        """A first stop signal is delivered (the deadline to stop the ranks by is returned); a
        second raises ``LaunchStopped``."""
        asked = self.stop_signals()
        if len(asked) > 1:
            raise LaunchStopped(asked[0])
        if asked and stop_deadline is None:
            self.deliver_stop(asked[0])
            return time.monotonic() + self.stop_grace_s + _STOP_MARGIN_S
        return stop_deadline

    def _first_code(self, waited: List[Child]) -> int:
        """The first non-zero exit among ``waited`` (in the order they exited), or ``DONE``."""
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
        peers fail naming the same cause. An elastic ring goes on without it (``ElasticRing``)."""
        if self._survivors_ended or self.stop_signals():
            return
        if self.ring is not None:  # every process's record: a lost worker and the one that joined in its slot
            processes = self.process_records()
            self.ring.note_lost([r for r in processes if _silent(r)], self.log)
            self.ring.note_joined(processes, self.log)
            return
        records = self.rank_records()
        lost = [r for r in records.values() if _silent(r)]
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

    def elastic_outcome(self) -> Optional[str]:
        """How an elastic ring that finished ended, from the ranks' records (None without one)."""
        return None if self.ring is None else self.ring.outcome(self.process_records(), self.log)

    def tick(self) -> None:
        """Called every 0.1 s while the workers run (emulated clusters fire scheduled faults)."""

    # -- stop requests --------------------------------------------------------------------------
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
                if not ps_lifecycle.is_ps(c):
                    self._stop(c)
            return
        StopRequest(signum, time.time()).write(os.path.join(self.status_dir, STOP_FILE))
        self.log(f"[launch] {name}: asking every worker for a preemption checkpoint "
                 f"(grace {self.stop_grace_s:g} s)")

    # -- what the ranks said ----------------------------------------------------------------------
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
        return [c for c in self.children if ps_lifecycle.is_ps(c)]

    # -- teardown -----------------------------------------------------------------------------
    def _stop(self, child: Child) -> None:
        stop_child(child, self.grace_s)

    def teardown(self) -> None:
        end_children(list(reversed(self.children)), self.grace_s)  # workers first, then the PS

    def teardown_workers(self) -> None:
        """End every process but the PS, and forget them and their exits: the cluster's PS serve
        the next set of workers (a restart after a lost worker, ``launch/supervisor.py``)."""
        ps = self.ps_children()
        end_children([c for c in reversed(self.children) if c not in ps], self.grace_s)
        self.children = [c for c in self.children if c in ps]
        self.exit_order, self.first_failure_at, self._survivors_ended = [], None, False


def _silent(r: RankStatus) -> bool:
    """A rank that exited without a word of its own (``rank_status.SILENT_EXITS``)."""
    return r.exit is not None and r.exit.reason in rank_status.SILENT_EXITS
