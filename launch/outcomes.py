"""How a launch ends other than with a process's code: a stop signal before (or without) a
preemption checkpoint, or its time-out. Types, not numbers, so neither can be read as a process's
own exit code; every module of the launcher raises and catches these same two.
"""
from __future__ import annotations

from gmeta_tf import exit_codes
from gmeta_tf.errors import ClusterError


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
