"""Preemption: a stop request turned into a checkpoint at one step every rank agrees on.

A cluster takes machines away with SIGTERM and a grace period (Kubernetes'
``terminationGracePeriodSeconds``, a spot instance's notice). Exiting at once loses every step
since the last periodic checkpoint; saving at once, rank by rank, would save different steps
on different ranks. So a stop only *asks*: the next step's dense all-reduce carries each rank's
vote (``TrainStep.vote_stop``: one more scalar in a collective that runs anyway, so asking costs
no extra round trip), and after that step every rank sees the same verdict and saves the same
step. This is TensorFlow's ``PreemptionCheckpointHandler`` protocol without its coordination
service.

A stop comes two ways: a stop signal (``exit_codes.STOP_SIGNALS``) to this process, or the
launcher's stop file (``rank_status.StopRequest``, named by ``GMETA_STOP_FILE``), which a rank
reads when the watch starts and at every vote: a stop the launcher got before this rank existed
is still delivered.

The signal handler only records (``gmeta_tf/stop_signals.py``). A watcher thread, woken by the
signal's byte on the wake-up pipe even while the main thread is blocked in a TensorFlow call,
does the rest: it logs the request, and ends the process (``os._exit``) on a second signal or
when the grace period runs out, after writing why into the rank's status record, so nobody
reads that exit as a checkpoint. The thread ends with the watch: an in-process caller (``gmeta
tune``, the demo) is never exited by a timer of a run that is over. The checkpoint protocol
(``train/checkpoint.py``: complete or absent) keeps the run directory readable whichever moment
the process ends.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, ClassVar, Optional

from gmeta_tf import exit_codes
from gmeta_tf.stop_signals import StopSignals
from gmeta_tf.train.rank_status import ExitReason, Phase, StatusWriter, StopRequest

_POLL_S = 0.5  # how often the watcher looks at the stop file while no signal wakes it


class PreemptionWatch:
    """Installed for the length of a training process or run (a context manager), in the main
    thread; elsewhere it installs nothing and never asks to stop. ``current()`` is the installed
    one: ``gmeta train`` installs it before Horovod and the PS connections start, and the
    trainer uses it rather than a second one."""

    _current: ClassVar[Optional["PreemptionWatch"]] = None

    def __init__(self, grace_s: float, log: Callable[[str], None] = print, rank: int = 0,
                 stop_file: Optional[str] = None, status: Optional[StatusWriter] = None):
        self.grace_s = grace_s
        self.log = log
        self.rank = rank
        self.stop_file = stop_file
        self.status = status or StatusWriter(None, rank)
        self.signum: Optional[int] = None
        self.received_at: Optional[float] = None
        self._deadline: Optional[float] = None
        self._lock = threading.Lock()
        self._signals = StopSignals()
        self._closing = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._outer: Optional[PreemptionWatch] = None
        self._signals_seen = 0

    @classmethod
    def current(cls) -> Optional["PreemptionWatch"]:
        return cls._current

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at

    def __enter__(self) -> "PreemptionWatch":
        self._signals.__enter__()
        if self._signals.installed:
            self._outer, PreemptionWatch._current = PreemptionWatch._current, self
            self._thread = threading.Thread(target=self._watch, name=f"preemption-watch-r{self.rank}", daemon=True)
            self._thread.start()
            self.poll()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._signals.wake()
        if self._thread is not None:
            self._thread.join(timeout=2 * _POLL_S + 1.0)
            self._thread = None
            PreemptionWatch._current = self._outer
        self._signals.__exit__()

    def poll(self) -> bool:
        """Whether this rank asks to stop: a signal it got, or the launcher's stop file. The
        trainer calls it before each step's vote. A signal is read from the handler's record as
        well as by the watcher: the handler runs in this (the main) thread as soon as the signal
        arrives, while the watcher may not have been scheduled yet, and a vote that waited for it
        could miss the step the signal came before (a flaky agreed step in CI, stop 47)."""
        if self.signum is None and self._signals.first is not None:
            self._note(self._signals.first, exit_codes.signal_name(self._signals.first))
        if self.signum is None and self.stop_file:
            request = StopRequest.read(self.stop_file)
            if request is not None:
                self._note(request.signal, f"the launcher was sent {exit_codes.signal_name(request.signal)}",
                           since=max(time.time() - request.at_unix, 0.0))
        return self.requested

    def exit_signal(self) -> int:
        """The signal whose code this rank exits with: its own, or SIGTERM when a peer asked."""
        return self.signum or int(exit_codes.STOP_SIGNALS[0])

    # -- the watcher thread (never a signal handler) ---------------------------------------------
    def _watch(self) -> None:
        while not self._closing.is_set():
            wait = _POLL_S if self._deadline is None else min(_POLL_S, self._deadline - time.monotonic())
            for signum in self._signals.wait(wait):
                self._signals_seen += 1
                if self._signals_seen > 1:
                    self._exit_now(ExitReason.SECOND_SIGNAL, f"rank {self.rank}: second stop signal "
                                   f"({exit_codes.signal_name(signum)}): exiting now")
                self._note(signum, exit_codes.signal_name(signum))
            if self._closing.is_set():
                return
            self.poll()
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self._exit_now(ExitReason.GRACE_EXPIRED,
                               f"rank {self.rank}: no preemption checkpoint within the grace period "
                               f"({self.grace_s:g} s, train.preemption_grace_s): exiting now; the run resumes "
                               f"from its last complete checkpoint")

    def _note(self, signum: int, what: str, since: float = 0.0) -> None:
        """A stop request: a signal, or the stop file (``since``: seconds since the launcher got it,
        which the grace period counts from)."""
        with self._lock:
            if self.signum is not None:
                return
            self.signum, self.received_at = signum, time.monotonic() - since
            self._deadline = self.received_at + self.grace_s
        self.status.update(stop_signal=exit_codes.signal_name(signum))
        self.log(f"rank {self.rank}: {what}: checkpoint at the next step every rank agrees on, "
                 f"then exit (grace {self.grace_s:g} s)")

    def _exit_now(self, reason: ExitReason, message: str) -> None:
        """The way out that does not wait for a step: the record says why, so that this exit
        (the stop signal's code, as a checkpointed one) is never read as a checkpoint."""
        code = exit_codes.signal_exit(self.exit_signal())
        self.log(message)
        self.status.exited(reason, code, message, signal=exit_codes.signal_name(self.exit_signal()))
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def stopping(watch: PreemptionWatch) -> None:
    """The trainer's note that this rank is checkpointing the agreed step."""
    watch.status.update(phase=Phase.STOPPING)
