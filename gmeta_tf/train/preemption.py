"""Preemption: a stop request turned into a checkpoint at one step every rank agrees on.

A cluster takes machines away with SIGTERM and a grace period (Kubernetes'
``terminationGracePeriodSeconds``, a spot instance's notice). Exiting at once loses every step
since the last periodic checkpoint; saving at once, rank by rank, would save different steps
on different ranks. So a signal only *asks*: the handler records it, the next step's dense
all-reduce carries each rank's vote (``TrainStep.vote_stop``: one more scalar in a collective
that runs anyway, so asking costs no extra round trip), and after that step every rank sees the
same verdict and saves the same step. This is TensorFlow's ``PreemptionCheckpointHandler``
protocol without its coordination service.

Two ways out stay open while that happens: a second signal, or the grace period running out,
exit at once (``os._exit``), and the checkpoint protocol (``train/checkpoint.py``: complete or
absent) keeps the run directory readable whichever moment that is.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Dict, Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionWatch:
    """Installed for the length of a training run (a context manager); main thread only."""

    def __init__(self, grace_s: float, log: Callable[[str], None] = print, rank: int = 0):
        self.grace_s = grace_s
        self.log = log
        self.rank = rank
        self.signum: Optional[int] = None
        self.received_at: Optional[float] = None
        self._previous: Dict[int, object] = {}
        self._timer: Optional[threading.Timer] = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at

    def __enter__(self) -> "PreemptionWatch":
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        # After a signal the grace timer stays: it bounds the exit itself (Horovod's shutdown,
        # a PS that no longer answers) as the platform's SIGKILL would, only sooner.

    def _on_signal(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.log(f"rank {self.rank}: second stop signal ({name}): exiting now")
            os._exit(128 + self.signum)
        self.signum, self.received_at = signum, time.monotonic()
        self.log(f"rank {self.rank}: {name}: checkpoint at the next step every rank agrees on, "
                 f"then exit (grace {self.grace_s:g} s)")
        self._timer = threading.Timer(self.grace_s, self._out_of_time)
        self._timer.daemon = True
        self._timer.start()

    def _out_of_time(self) -> None:
        self.log(f"rank {self.rank}: no preemption checkpoint within the grace period "
                 f"({self.grace_s:g} s, train.preemption_grace_s): exiting now; the run resumes "
                 f"from its last complete checkpoint")
        os._exit(128 + (self.signum or signal.SIGTERM))

    def exit_signal(self) -> int:
        """The signal whose code this rank exits with: its own, or SIGTERM when a peer asked."""
        return self.signum or int(signal.SIGTERM)
