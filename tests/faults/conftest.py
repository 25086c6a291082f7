"""The fault-injection suite (``pytest -m faults`` or ``pytest tests/faults``).

Every test here injects one fault (kill -9, SIGSTOP, a damaged file, a full disk, bad input)
and asserts that the next command either resumes to the same result or fails with one line
that names what to do. The ``no_orphans`` fixture proves no process a test started survives it.
"""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import List

import pytest
from fault_helpers import FAULT_ENV, TINY_SETS, _finish, _spawn, one_worker_argv, project_processes
from session_share import once_per_session

ORPHAN_GRACE_S = 30.0  # a PS notices a dead launcher within a second; give slow boxes room

HERE = Path(__file__).parent


# Whole modules of real trainings and launches: the integration tier (not in make test-fast).
INTEGRATION_MODULES = {"test_process_faults.py", "test_run_dir.py", "test_restarts.py", "test_elastic.py",
                       "test_elastic_regrow.py"}


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        if HERE in path.parents:
            item.add_marker(pytest.mark.faults)
            if path.name in INTEGRATION_MODULES:
                item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def no_orphans(monkeypatch):
    """Fail the test if any project process it started is still running after it."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(FAULT_ENV, tag)
    yield tag
    deadline = time.monotonic() + ORPHAN_GRACE_S
    left = project_processes(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = project_processes(tag)
    if left:
        cmds = {}
        for pid in left:
            try:
                cmds[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:120]
                os.kill(pid, signal.SIGKILL)  # clean up, then fail
            except OSError:
                pass
        pytest.fail(f"processes outlived the test: {cmds}")


def _tiny_prepared(tmp_path_factory, shards: int, name: str) -> Path:
    """300 synthetic users prepared into ``shards`` shards (once per session)."""
    from gmeta_tf.config.schema import PrepareConfig
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    def make(root: Path):
        synth(str(root / "raw"), tasks=300, seed=3, rows_per_file=10000)
        cfg = PrepareConfig(query=4, max_support=8, min_task_size=12, valid_frac=0.1, test_frac=0.2,
                            shards=shards, seed=0)
        prepare([str(root / "raw")], str(root / "prepared"), cfg)
    return once_per_session(tmp_path_factory, name, make) / "prepared"


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """300 synthetic users prepared into 2 shards: enough for 2 workers, seconds to train."""
    return _tiny_prepared(tmp_path_factory, 2, "faults_data")


@pytest.fixture(scope="session")
def tiny_data_3(tmp_path_factory) -> Path:
    """The same users in 3 shards: enough for 3 workers (tests/faults/test_elastic.py)."""
    return _tiny_prepared(tmp_path_factory, 3, "faults_data_3")


@pytest.fixture(scope="session")
def reference_run(tiny_data, tmp_path_factory) -> Path:
    """One worker + one PS on loopback, uninterrupted, to ``REFERENCE_STEPS``: the model every
    one-worker fault test must end at (test_restarts.py) and the losses an emulated link must
    reproduce (test_emulated_hosts.py). Trained once per session, whichever test asks first."""
    def make(root: Path):
        code, out = _finish(_spawn(one_worker_argv(tiny_data, root / "run")), timeout=400)
        assert code == 0, out[-3000:]
    return once_per_session(tmp_path_factory, "reference", make) / "run"


@pytest.fixture
def tiny_args(tiny_data):
    """``gmeta train`` arguments for a small, fast run (add --out and --steps)."""
    def args(*extra: str) -> List[str]:
        out = ["--data", str(tiny_data)]
        for s in [*TINY_SETS, *extra]:
            out += ["--set", s]
        return out
    return args
