"""The fault tests' step trigger (gmeta_tf/train/fault_pause.py): parsed strictly, and a frozen
process really is frozen until SIGCONT."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gmeta_tf.errors import UserError
from gmeta_tf.train.fault_pause import PAUSE_ENV, PausePoint, pause_point

pytestmark = pytest.mark.fast


def test_unset_is_no_pause_and_values_parse_to_step_and_rank():
    assert pause_point({}) is None and pause_point({PAUSE_ENV: " "}) is None
    every = pause_point({PAUSE_ENV: "20"})
    assert every == PausePoint(20, None) and every.due(20, 0) and every.due(20, 3) and not every.due(21, 0)
    one = pause_point({PAUSE_ENV: "20:1"})
    assert one == PausePoint(20, 1) and one.due(20, 1) and not one.due(20, 0)


def test_a_restarted_rank_does_not_pause_again():
    """The launcher restarts ranks with the environment the first attempt had: a pause past the
    last checkpoint would freeze the resumed rank when it redoes that step (issue 42's kept-PS
    restart looked hung for exactly this reason)."""
    from gmeta_tf.train.restarts import RESTARTS_ENV

    assert pause_point({PAUSE_ENV: "25", RESTARTS_ENV: "[]"}) is not None  # no restart recorded yet
    assert pause_point({PAUSE_ENV: "25", RESTARTS_ENV: '[{"attempt": 1}]'}) is None


@pytest.mark.parametrize("raw", ["x", "20:", "20:a", "0", "5:-1", "1.5"])
def test_a_bad_value_names_the_variable(raw):
    with pytest.raises(UserError, match=PAUSE_ENV):
        pause_point({PAUSE_ENV: raw})


def test_freeze_stops_the_process_until_sigcont():
    code = "from gmeta_tf.train.fault_pause import freeze; freeze(); print('resumed', flush=True)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _state(p.pid) != "T":
            assert p.poll() is None and time.monotonic() < deadline, "never froze"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGCONT)
        out, _ = p.communicate(timeout=60)
        assert out.strip() == "resumed" and p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
