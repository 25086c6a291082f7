"""Stops that cannot be lost (issue 42, item 3), the parts that need no cluster: handlers that only
record, the launcher's stop file read by a rank that starts after it was written, and a grace
period that ends with the run. The launch itself (a SIGTERM while the ranks start) is in
tests/faults/test_launcher_state.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gmeta_tf.stop_signals import StopSignals
from gmeta_tf.train import rank_status
from gmeta_tf.train.preemption import PreemptionWatch
from gmeta_tf.train.rank_status import ExitReason, StatusWriter, StopRequest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.fast


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_stop_signal_is_recorded_and_nothing_else_happens_in_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # no exception, no exit: the handler only records
        deadline = time.monotonic() + 5
        while not signals.received and time.monotonic() < deadline:
            time.sleep(0.01)
        assert signals.received == [signal.SIGTERM] and signals.first == signal.SIGTERM
        assert signals.wait(1.0) == [signal.SIGTERM]  # the wake-up byte a watcher thread reads
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_watch_outside_the_main_thread_installs_nothing():
    got = []
    t = threading.Thread(target=lambda: got.append(StopSignals().__enter__().installed))
    t.start()
    t.join()
    assert got == [False]


def test_a_rank_that_starts_after_the_stop_file_starts_stopping(tmp_path):
    stop = tmp_path / "status" / rank_status.STOP_FILE
    StopRequest(int(signal.SIGTERM), time.time()).write(str(stop))
    status = StatusWriter(str(tmp_path / "status"), rank=1)
    lines = []
    with PreemptionWatch(60.0, lines.append, rank=1, stop_file=str(stop), status=status) as watch:
        assert watch.requested and watch.signum == signal.SIGTERM  # before its first step
        assert PreemptionWatch.current() is watch
    assert PreemptionWatch.current() is None
    assert lines and "the launcher was sent SIGTERM" in lines[0]
    assert rank_status.read(str(tmp_path / "status"), 1).stop_signal == "SIGTERM"


def test_the_grace_timer_ends_with_the_run():
    """An in-process caller (gmeta tune, the demo) outlives its run: a signal during the run must
    not end the caller later (it did: the timer outlived the watch and called os._exit(143))."""
    r = _python("""
        import os, signal, time
        from gmeta_tf.train.preemption import PreemptionWatch
        with PreemptionWatch(1.0, rank=0) as w:
            os.kill(os.getpid(), signal.SIGTERM)
            while not w.requested:
                time.sleep(0.01)
        time.sleep(2.5)  # past the grace period
        print("the caller lives on")
    """)
    assert r.returncode == 0 and "the caller lives on" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_a_grace_time_out_is_recorded_as_such_not_as_a_checkpoint(tmp_path):
    """The launcher's stop came long ago and no step is reached: the rank exits 143, and its
    record says the grace period ran out (the same code as a checkpointed stop, not the same end)."""
    status = tmp_path / "status"
    StopRequest(int(signal.SIGTERM), time.time() - 1.0).write(str(status / rank_status.STOP_FILE))
    r = _python(f"""
        import time
        from gmeta_tf.train.preemption import PreemptionWatch
        from gmeta_tf.train.rank_status import StatusWriter
        with PreemptionWatch(0.5, rank=0, stop_file={str(status / rank_status.STOP_FILE)!r},
                             status=StatusWriter({str(status)!r}, 0)):
            time.sleep(30)  # a step that never comes
    """)
    assert r.returncode == 143, (r.returncode, r.stdout, r.stderr)
    rec = rank_status.read(str(status), 0)
    assert rec.exit.reason is ExitReason.GRACE_EXPIRED and not rec.exit.checkpointed and rec.checkpoint is None
    assert "grace period" in r.stdout


def test_the_next_vote_sees_a_signal_before_the_watcher_thread_has_run(monkeypatch):
    """The vote right after a signal carries it, whether or not the watcher thread was scheduled
    in between. It did not: the vote read only what the watcher had noted, so a rank let go just
    after its signal (SIGCONT) could vote "no" once and checkpoint a step later than its peers
    expected (CI of stop 47: step 22 agreed where 21 was due). Here the watcher never runs."""
    def unscheduled(self, timeout_s):
        time.sleep(min(timeout_s, 0.05))
        return []
    monkeypatch.setattr(StopSignals, "wait", unscheduled)
    lines = []
    with PreemptionWatch(60.0, lines.append, rank=1) as watch:
        assert not watch.poll()
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs in this thread before kill returns
        assert watch.poll() and watch.signum == signal.SIGTERM
        assert watch.exit_signal() == signal.SIGTERM
    assert len(lines) == 1 and "SIGTERM" in lines[0], lines
