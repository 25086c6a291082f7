"""Every exit code a gmeta process or job ends with, and the signals that ask it to stop: one
table, read by the trainer, the launcher, the TFJob renderer and the bench.

Why one table: a scheduler decides from the code alone whether to try again. Kubeflow's
``restartPolicy: ExitCode`` restarts a pod whose container exits 128-255 and leaves one that
exits 1-127 failed, so a code's *retryable* column must agree with its range, and the same fault
must end with the same code whichever command ran it (a dead PS is 200 from ``gmeta train``, from
a TFJob pod and from ``gmeta launch local``). ``tests/test_exit_codes.py`` holds the table to
both rules.

Signals follow the shell: a process stopped by signal N exits ``128 + N``; ``Popen`` reports the
same death as ``-N``. ``signal_of`` reads both, ``describe`` names them.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Optional, Tuple

# What asks a gmeta process to stop (a platform's SIGTERM, Ctrl-C, a closed terminal): a trainer
# checkpoints at the next step every rank agrees on, a launcher passes the request to its ranks.
STOP_SIGNALS: Tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class ExitCode:
    """One row of the table: the code, whether a scheduler should run the job again, and why."""

    name: str
    code: int
    retryable: bool
    meaning: str


def signal_exit(signum: int) -> int:
    """The code of a process that ends because of signal ``signum`` (the shell's ``128 + N``)."""
    return 128 + int(signum)


DONE = ExitCode("done", 0, False, "finished (or stopped early by validation)")
FAILED = ExitCode("failed", 1, False, "an unexpected error, a bug: the traceback says where")
USER_ERROR = ExitCode("user_error", 2, False,
                      "a mistake of the user's (bad config, data, flag or address): never retried")
TIMED_OUT = ExitCode("timed_out", 124, False,
                     "gmeta launch local --timeout ran out (a re-run resumes from the last checkpoint)")
HUNG_UP = ExitCode("hung_up", signal_exit(signal.SIGHUP), True,
                   "stopped by SIGHUP (a closed terminal); see the rank's status record for a checkpoint")
INTERRUPTED = ExitCode("interrupted", signal_exit(signal.SIGINT), True,
                       "stopped by SIGINT (Ctrl-C); see the rank's status record for a checkpoint")
KILLED = ExitCode("killed", signal_exit(signal.SIGKILL), True,
                  "killed by SIGKILL (a kill -9, the OOM killer, a platform after its grace period)")
PREEMPTED = ExitCode("preempted", signal_exit(signal.SIGTERM), True,
                     "stopped by SIGTERM (a preemption); the rank's status record says whether every rank "
                     "checkpointed the agreed step or the grace period ran out first")
CLUSTER_FAULT = ExitCode("cluster_fault", 200, True,
                         "a lost or restarted PS, or a peer worker that died or stopped answering: retry "
                         "(it resumes from the last complete checkpoint); no signal's code")

# The codes Kubeflow's ``restartPolicy: ExitCode`` (the rendered TFJob's, launch/k8s_render.py)
# restarts a pod for: a signal's or a fault's. Each row's retryable column is this test.
RETRIED_CODES = range(128, 256)

TABLE: Tuple[ExitCode, ...] = (DONE, FAILED, USER_ERROR, TIMED_OUT, HUNG_UP, INTERRUPTED, KILLED, PREEMPTED,
                               CLUSTER_FAULT)


def signal_of(code: Optional[int]) -> Optional[int]:
    """The signal a process died of, from its ``Popen`` code (``-N``) or its shell code
    (``128 + N``); None for an ordinary exit."""
    if code is None:
        return None
    if code < 0:
        return -code
    if 128 < code < 128 + 65:  # 64 signals on Linux; 200 (CLUSTER_FAULT) is not one
        return code - 128
    return None


def normalized(code: int) -> int:
    """A ``Popen`` code in the shell's form: ``-9`` -> 137."""
    return signal_exit(-code) if code < 0 else code


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe(code: int) -> str:
    """``killed by SIGKILL`` for a signal's code (either form), else ``exit code N``."""
    sig = signal_of(code)
    return f"killed by {signal_name(sig)}" if sig else f"exit code {code}"


def lookup(code: int) -> Optional[ExitCode]:
    """The table's row for ``code`` (either form of a signal's code), or None."""
    code = normalized(code)
    return next((e for e in TABLE if e.code == code), None)


def retryable(code: int) -> bool:
    """Whether a scheduler should run the job again: the table's word, and for a code the table
    does not list, whether it is a signal's (a process killed from outside)."""
    row = lookup(code)
    return row.retryable if row is not None else signal_of(code) is not None
