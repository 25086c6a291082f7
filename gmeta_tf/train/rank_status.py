"""Each rank's state as data: one small JSON record per rank, and the launcher's stop file.

Why records and not log lines: the launcher used to learn a rank's step, its exit code and
whether it checkpointed by matching the text the trainer and ``horovodrun`` print, so changing a
log line changed what the launcher reported, and a rank that exited 143 after its grace period
ran out was reported as "checkpointed". Now each rank writes what it is doing (``phase``, the
last step it completed, the last complete checkpoint it saw) and, on its way out, a typed
``RankExit`` (reason, code, message), the way ``torchrun`` has each rank write an error file.
What a rank cannot write (killed by a signal) its parent writes from the exit status it reaps:
``launch/rank_agent.py`` under ``horovodrun``, the launcher itself for ranks it starts.

Layout, in the directory ``GMETA_STATUS_DIR`` names (default ``<run dir>/status`` for a local run
directory: ``train/rank_life.py``)::

    rank0.json, rank1.json ...   one ``RankStatus`` each, replaced whole (``atomic_file``)
    rank1.<process>.json         the same in an elastic ring, one per process (below)
    start-<job>.<gate>           an elastic ring's start-up gates (``train/elastic.py``)
    stop                         the launcher's stop request (``StopRequest``): a rank checks it
                                 when it starts and at every step's vote, so a stop that arrives
                                 before a rank runs is not lost

Why one record per process in an elastic ring (``cluster.elastic``): a worker horovodrun starts
on a returned host gets a slot rank that can be the rank another live process started as, and
a record named by rank alone would then be written by both. There each process names its record
after its own ``process`` id (``record_id``: host, pid and a random part, made by the rank's
agent or by the rank), and the rank the process holds in the ring now is a field
(``ring_rank``). Without elastic a rank's number belongs to one process for the job's life (a
restart clears the records first), and the record keeps the name ``rank<N>.json``.

Standard library only: ``launch/rank_agent.py`` imports it in a process that must start fast.
"""
from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Dict, List, Optional

from gmeta_tf import exit_codes
from gmeta_tf.atomic_file import replace_file

RECORD_ID_ENV = "GMETA_RECORD_ID"  # this process's record id, made by its agent (``launch/rank_agent.py``)
ELASTIC_ENV = "HOROVOD_ELASTIC"  # "1" on every rank an elastic horovodrun starts
STATUS_DIR_ENV = "GMETA_STATUS_DIR"  # where this rank writes its record (set by the launcher)
STOP_FILE_ENV = "GMETA_STOP_FILE"  # the stop file this rank obeys (only a launcher sets one)
STATUS_DIR = "status"  # under a local run directory when no launcher says otherwise
STOP_FILE = "stop"
START_GATE_PREFIX = "start-"  # an elastic ring's start-up gates (``train/elastic.py``'s ``StartGate``)


class Phase(str, Enum):
    STARTING = "starting"  # process up, the cluster and tables not yet (Horovod, PS, restore)
    TRAINING = "training"
    STOPPING = "stopping"  # asked to stop: checkpointing the agreed step
    EXITED = "exited"


class ExitReason(str, Enum):
    DONE = "done"
    PREEMPTED = "preempted"  # every rank checkpointed the agreed step (``checkpoint``), then exited
    GRACE_EXPIRED = "grace_expired"  # asked to stop, no checkpoint within the grace period
    SECOND_SIGNAL = "second_signal"  # asked twice: exited at once, no checkpoint
    CLUSTER_FAULT = "cluster_fault"  # a lost PS or peer (``ClusterFaultError``)
    USER_ERROR = "user_error"  # a ``UserError``: config, data, address
    CRASHED = "crashed"  # an unexpected exception (a bug)
    KILLED = "killed"  # by a signal, written by the rank's parent
    EXITED = "exited"  # exited with ``code`` without a record of its own, written by the parent


# Stopped on request: the launcher says "stopped", not "failed", and says whether it checkpointed.
STOPPED_REASONS = (ExitReason.PREEMPTED, ExitReason.GRACE_EXPIRED, ExitReason.SECOND_SIGNAL)
# Exits the rank did not explain itself (its parent wrote them): its peers learn of them only by a
# failed collective, so the launcher ends them at once (launch/local_cluster.py).
SILENT_EXITS = (ExitReason.KILLED, ExitReason.EXITED)


@dataclass(frozen=True)
class RankExit:
    reason: ExitReason
    code: int  # the process's exit code, in the shell's form (``exit_codes.normalized``)
    message: str
    signal: Optional[str] = None  # the stop signal, or the one that killed it
    checkpoint_s: Optional[float] = None  # PREEMPTED: seconds the agreed step's save took

    @property
    def checkpointed(self) -> bool:
        return self.reason is ExitReason.PREEMPTED


@dataclass(frozen=True)
class RankStatus:
    rank: int
    pid: int
    phase: Phase
    step: int = 0  # the last step this rank completed
    start_step: Optional[int] = None  # the step training started after (a resume's checkpoint)
    checkpoint: Optional[int] = None  # the newest complete checkpoint this rank saw saved
    stop_signal: Optional[str] = None  # set once the rank was asked to stop
    exit: Optional[RankExit] = None
    updated_unix: float = 0.0
    # ``cluster.elastic``: each ring this process trained in, ``[step, rank, size]`` (the commit it
    # (re-)entered at, its rank and the ring's size there); ``joined_step``: the commit at which
    # it joined a ring already running (a worker started on a returned host), else None.
    ring: Optional[List[List[int]]] = None
    joined_step: Optional[int] = None
    # An elastic ring's process: the record's own id (its file name; ``rank`` is the rank the
    # process started as) and the rank it holds in the ring now (after a re-forming, a joining).
    process: Optional[str] = None
    ring_rank: Optional[int] = None
    host: Optional[str] = None  # where the process runs: a peer on this host can be looked at (``failures.py``)

    def to_json(self) -> str:
        d = asdict(self)
        d["phase"] = self.phase.value
        if self.exit is not None:
            d["exit"]["reason"] = self.exit.reason.value
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "RankStatus":
        d = json.loads(text)
        d["phase"] = Phase(d["phase"])
        if d.get("exit") is not None:
            d["exit"] = RankExit(**{**d["exit"], "reason": ExitReason(d["exit"]["reason"])})
        return cls(**d)


_RECORD_NAME = re.compile(r"rank(\d+)(?:\.([A-Za-z0-9_-]+))?\.json")


def record_id(env=os.environ) -> str:
    """This process's record id: the one its agent made (``RECORD_ID_ENV``), else a new one."""
    given = env.get(RECORD_ID_ENV, "")
    if given and re.fullmatch(r"[A-Za-z0-9_-]+", given):
        return given
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40]
    return f"{host}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def status_path(directory: str, rank: int, process: Optional[str] = None) -> str:
    return os.path.join(directory, f"rank{rank}.json" if process is None else f"rank{rank}.{process}.json")


def write(directory: str, status: RankStatus) -> None:
    os.makedirs(directory, exist_ok=True)
    replace_file(status_path(directory, status.rank, status.process), status.to_json())


def _read_file(path: str) -> Optional[RankStatus]:
    try:
        with open(path) as f:
            return RankStatus.from_json(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError):  # written by another version: not ours to read
        return None


def read_processes(directory: Optional[str]) -> List[RankStatus]:
    """Every record in ``directory``, one per process (an elastic ring's lost, surviving and
    joined workers each have their own), in the order of their file names."""
    if not directory or not os.path.isdir(directory):
        return []
    out = []
    for name in sorted(os.listdir(directory)):
        if _RECORD_NAME.fullmatch(name):
            status = _read_file(os.path.join(directory, name))
            if status is not None:
                out.append(status)
    return out


def read(directory: str, rank: int, process: Optional[str] = None) -> Optional[RankStatus]:
    """The record of ``process``; without one, the newest of the processes that started as ``rank``."""
    if process is not None:
        return _read_file(status_path(directory, rank, process))
    same = [s for s in read_processes(directory) if s.rank == rank]
    return max(same, key=lambda s: s.updated_unix) if same else None


def read_all(directory: Optional[str]) -> Dict[int, RankStatus]:
    """Every rank's record in ``directory``, by the rank each process started as; where two
    processes of an elastic ring started as one rank (a lost worker and the one that joined in
    its slot), the newer record. ``read_processes`` has each."""
    out: Dict[int, RankStatus] = {}
    for status in read_processes(directory):
        if status.rank not in out or status.updated_unix >= out[status.rank].updated_unix:
            out[status.rank] = status
    return out


def clear(directory: str) -> None:
    """Remove the records, the stop file and the start gates (``train/elastic.py``) of an earlier
    cluster (the launcher, before it starts the ranks of a new one)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name == STOP_FILE or name.startswith(START_GATE_PREFIX) or (name.startswith("rank") and name.endswith(".json")):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass


def exit_from_code(code: int) -> RankExit:
    """What a parent knows of a rank that exited without a record of its own: its code."""
    sig = exit_codes.signal_of(code)
    if sig:
        return RankExit(ExitReason.KILLED, exit_codes.normalized(code), exit_codes.describe(code),
                        signal=exit_codes.signal_name(sig))
    return RankExit(ExitReason.EXITED, code, exit_codes.describe(code))


def record_exit(directory: str, rank: int, pid: int, code: int, process: Optional[str] = None) -> RankStatus:
    """The parent's side, once it has reaped the rank: keep the rank's own exit when it matches
    the code the process really ended with, else write the one the code tells (a rank killed
    after its record said "done" died all the same). ``process``: the record id the parent gave
    the rank (an elastic ring's), so only that process's record is read and written."""
    old = read(directory, rank, process) if process is not None else _read_file(status_path(directory, rank))
    if old is not None and old.exit is not None and old.exit.code == exit_codes.normalized(code):
        return old
    base = old or RankStatus(rank=rank, pid=pid, phase=Phase.STARTING, process=process)
    new = replace(base, phase=Phase.EXITED, exit=exit_from_code(code), updated_unix=time.time())
    write(directory, new)
    return new


@dataclass(frozen=True)
class StopRequest:
    """The launcher's stop request: the signal it was sent and when."""

    signal: int
    at_unix: float

    @classmethod
    def read(cls, path: str) -> Optional["StopRequest"]:
        try:
            with open(path) as f:
                d = json.load(f)
            return cls(int(d["signal"]), float(d["at_unix"]))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def write(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        replace_file(path, json.dumps(asdict(self)))


@dataclass
class StatusWriter:
    """One rank's record, kept in memory and written whole when it changes in a way a reader
    acts on (a phase, a checkpoint, an exit, each logged step). ``directory`` None writes
    nothing (a run directory on an object store, an in-process caller without one). Several
    threads write (the preemption watch writes an exit from its own): a lock keeps each whole."""

    directory: Optional[str]
    rank: int = 0
    process: Optional[str] = None  # an elastic ring's per-process record id (``record_id``)
    status: RankStatus = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self):
        self.status = RankStatus(rank=self.rank, pid=os.getpid(), phase=Phase.STARTING, updated_unix=time.time(),
                                 process=self.process, host=socket.gethostname())

    def update(self, write_now: bool = True, **fields) -> None:
        with self._lock:
            if self.status.exit is not None:
                return  # an exit is the last word
            self.status = replace(self.status, **fields, updated_unix=time.time())
            if write_now:
                self._write()

    def exited(self, reason: ExitReason, code: int, message: str, *, signal: Optional[str] = None,
               checkpoint_s: Optional[float] = None, checkpoint: Optional[int] = None) -> None:
        with self._lock:
            if self.status.exit is not None:
                return
            fields = {} if checkpoint is None else {"checkpoint": checkpoint}
            self.status = replace(self.status, **fields, phase=Phase.EXITED, updated_unix=time.time(),
                                  exit=RankExit(reason, exit_codes.normalized(code), message[:2000], signal,
                                                checkpoint_s))
            self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        if self.directory is None:
            return
        try:
            write(self.directory, self.status)
        except OSError:
            pass  # a full disk must not turn a step into a failure; the launcher falls back on exit codes
