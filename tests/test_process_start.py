"""``gmeta_tf/process.py``: when a process started, precisely enough to order a restart's moments."""
from __future__ import annotations

import subprocess
import sys
import time

from gmeta_tf.process import process_start_unix

_REPORT = "import time; from gmeta_tf.process import process_start_unix as s; print(s(), time.time())"


def test_a_process_starts_after_it_was_spawned_and_before_it_runs():
    """Ten fresh processes: each one's start lies between the moment before it was spawned and
    its own first statement (psutil's create_time, a boot time in whole seconds plus the start,
    missed by up to a second and put a restarted rank's start before its relaunch)."""
    for _ in range(10):
        before = time.time()
        out = subprocess.run([sys.executable, "-c", _REPORT], capture_output=True, text=True, timeout=60)
        started, running = map(float, out.stdout.split())
        assert before - 0.02 <= started <= running, (before, started, running)


def test_this_process_started_before_now_and_its_start_does_not_move():
    first = process_start_unix()
    assert first < time.time()
    assert abs(process_start_unix() - first) < 0.05
