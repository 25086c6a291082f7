"""Why one cluster ended, as the supervisor says it and exits with: the process at fault first (a
dead PS before the ranks whose failures follow from it, then the first rank to fail), read from
the PS processes and the ranks' status records, never from log text; and whether a restart may keep
the PS. The launch's exit code is its first cause's, from ``gmeta_tf/exit_codes.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Union

from gmeta_tf import exit_codes
from gmeta_tf.train.rank_status import ExitReason, RankExit, RankStatus
from launch.local_cluster import LocalCluster
from launch.outcomes import WorkersTimedOut


@dataclass
class Failure:
    """Why one cluster ended without finishing: the process at fault first, then the rest.
    ``exit_code`` is that process's own (a restart record keeps it); ``job_code`` is what the
    launch exits with (``exit_codes``)."""

    problems: List[str]
    exit_code: Optional[int]
    job_code: int
    timed_out: bool = False
    failed_at: Optional[float] = None

    @property
    def cause(self) -> str:
        return self.problems[0]


def rank_problem(status: RankStatus) -> str:
    """One rank's exit as the launcher says it; "checkpointed" only from a record saying so."""
    e = status.exit
    r = f"worker rank {status.rank}"
    if e.reason is ExitReason.PREEMPTED:
        return f"{r} was stopped by {e.signal} and checkpointed"
    if e.reason is ExitReason.GRACE_EXPIRED:
        return f"{r} was stopped by {e.signal} without a checkpoint (the grace period ran out)"
    if e.reason is ExitReason.SECOND_SIGNAL:
        return f"{r} was stopped by {e.signal} without a checkpoint (a second stop signal)"
    return f"{r} failed ({exit_codes.describe(e.code)})"


def job_code(e: RankExit) -> int:
    """The launch's exit code for a rank's exit: a stop keeps its signal's code, a rank's own
    mistake or bug keeps its code, a rank lost in any other way is a cluster fault."""
    if e.reason in (ExitReason.PREEMPTED, ExitReason.GRACE_EXPIRED, ExitReason.SECOND_SIGNAL, ExitReason.USER_ERROR):
        return e.code
    if e.reason is ExitReason.CRASHED:
        return exit_codes.FAILED.code
    if e.reason is ExitReason.EXITED and not exit_codes.retryable(e.code):
        return e.code
    return exit_codes.CLUSTER_FAULT.code


def failure_of(cluster: LocalCluster, code: Union[int, WorkersTimedOut], timeout_s: Optional[float]) -> Optional[Failure]:
    """None when the workers finished; else the failure, a dead PS first (the ranks' own
    failures follow from it), then the first rank to fail (the others followed it). ``code`` is
    what the wait ended with: the workers' code, or the time-out (a type, never read as a code)."""
    timed_out = isinstance(code, WorkersTimedOut)
    if timed_out:  # said with the launch's --timeout, not what was left of it at this start
        code = None
    problems, first_code, job, failed_at = [], None, None, cluster.first_failure_at
    for c in cluster.ps_children():
        if c.proc.poll() is not None:
            problems.append(f"{c.name} died ({exit_codes.describe(c.proc.returncode)})")
            first_code = first_code if first_code is not None else c.proc.returncode
            job = job if job is not None else exit_codes.CLUSTER_FAULT.code
    # Under Horovod Elastic a rank lost while horovodrun finished the job was absorbed by the ring.
    exits = [] if cluster.elastic and code == exit_codes.DONE.code else cluster.rank_exits()
    if exits:
        problems.append(rank_problem(exits[0]))
        first_code = first_code if first_code is not None else exits[0].exit.code
        job = job if job is not None else job_code(exits[0].exit)
        failed_at = min(failed_at or exits[0].updated_unix, exits[0].updated_unix)
    if timed_out:
        problems.append(f"timed out after {timeout_s:.0f} s")
        job = exit_codes.TIMED_OUT.code
    elif code != exit_codes.DONE.code and not problems:
        problems.append(f"horovodrun failed ({exit_codes.describe(code)})")
        first_code = code
        job = exit_codes.FAILED.code
    if not problems:
        return None
    return Failure(problems, first_code, job, timed_out=timed_out, failed_at=failed_at)


def workers_only(cluster: LocalCluster, failure: Failure) -> bool:
    """A restart may keep the PS when every PS still runs and the fault was a worker's: a restore
    clears and refills every table and slot on the PS (``embedding/table_files.restore_tables``),
    so nothing the lost step left there survives into the resumed run (tests/faults/test_restarts.py
    compares such a run with an uninterrupted one, rows and slots included). Saves the PS's start,
    about 6 s of a recovery (docs/fault_tolerance.md)."""
    if not cluster.keeps_ps_across_restarts or not cluster.ps_children():
        return False
    return all(c.proc.poll() is None for c in cluster.ps_children()) and not failure.timed_out


def stop_outcome(cluster: LocalCluster, workers: int) -> str:
    """What the ranks did with a stop request, from their records."""
    records = cluster.rank_records()
    ranks = [records.get(r) for r in range(workers)]
    if all(r is not None and r.exit is not None and r.exit.checkpointed for r in ranks):
        return "the workers checkpointed and exited"
    if all(r is not None and r.exit is not None and r.exit.reason is ExitReason.DONE for r in ranks):
        return "the workers had finished"
    problems = [f"{c.name} died ({exit_codes.describe(c.proc.returncode)})"
                for c in cluster.ps_children() if c.proc.poll() is not None]
    for r, status in enumerate(ranks):
        if status is None:
            problems.append(f"worker rank {r} never started")
        elif status.exit is None:
            problems.append(f"worker rank {r} was stopped without a checkpoint (no exit of its own: stopped "
                            f"by the launcher after the grace period)")
        elif not status.exit.checkpointed:
            problems.append(rank_problem(status))
    return "; ".join(problems)
