"""Stop signals recorded, and nothing more done inside a signal handler.

Why: a Python signal handler runs between two bytecodes of the main thread, wherever that thread
is: inside a ``finally``, half-way through a log line, in a lock the handler may need. Raising or
logging there (what the launcher and the trainer used to do) can tear the code it interrupts.
So the handler here only appends the signal to ``received``; the main loop reads it at its next
turn, and a watcher thread can learn of it at once through the wake-up pipe: the interpreter's
C-level handler writes the signal's number to ``signal.set_wakeup_fd`` the moment it arrives,
even while the main thread is blocked in C code (a TensorFlow op, a collective) where no Python
handler runs until the call returns.
"""
from __future__ import annotations

import os
import select
import signal
import threading
from typing import Dict, List, Optional, Sequence

from gmeta_tf.exit_codes import STOP_SIGNALS


class StopSignals:
    """Installed for the length of a ``with`` block, in the main thread (elsewhere it installs
    nothing and ``installed`` is False: ``signal.signal`` only works there)."""

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS):
        self.signals = tuple(int(s) for s in signals)
        self.received: List[int] = []  # appended by the handler, in arrival order
        self.installed = False
        self._previous: Dict[int, object] = {}
        self._old_wakeup = -1
        self._r: Optional[int] = None
        self._w: Optional[int] = None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._old_wakeup = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._record)
        self.installed = True
        return self

    def __exit__(self, *exc) -> None:
        if not self.installed:
            return
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        signal.set_wakeup_fd(self._old_wakeup)
        self.installed = False
        for fd in (self._r, self._w):
            os.close(fd)
        self._r = self._w = None

    def _record(self, signum: int, _frame) -> None:
        self.received.append(signum)  # the whole handler: the work is the main loop's

    @property
    def first(self) -> Optional[int]:
        return self.received[0] if self.received else None

    def wake(self) -> None:
        """Wake a thread blocked in ``wait`` (with no signal: it returns an empty list)."""
        if self._w is not None:
            try:
                os.write(self._w, b"\0")
            except OSError:  # the pipe is full: the thread has bytes to wake up to already
                pass

    def wait(self, timeout_s: float) -> List[int]:
        """For a watcher thread: the stop signals that arrived since the last call, waiting up to
        ``timeout_s`` for one (read from the wake-up pipe, so it returns even while the main
        thread is blocked)."""
        r = self._r
        if r is None:
            return []
        try:
            ready, _, _ = select.select([r], [], [], max(timeout_s, 0.0))
            data = os.read(r, 512) if ready else b""
        except (OSError, ValueError):  # closed by __exit__ while waiting
            return []
        return [b for b in data if b in self.signals]
