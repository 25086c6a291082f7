"""``launch/horovodrun.py``: horovodrun, asking Horovod whether it has Gloo once per build."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.horovodrun import CACHE_DIR_ENV, argv, build_key, remembered_gloo_built

REPO = Path(__file__).resolve().parents[1]


def _fake_horovod(root: Path) -> Path:
    (root / "tensorflow").mkdir(parents=True)
    (root / "tensorflow" / "mpi_lib.cpython-311-x86_64-linux-gnu.so").write_bytes(b"x" * 10)
    return root


def _counting(answer):
    calls = []

    def probe(verbose=False):
        calls.append(verbose)
        return answer
    return probe, calls


def test_a_yes_is_asked_once_per_build_and_a_rebuild_asks_again(tmp_path):
    hvd = _fake_horovod(tmp_path / "horovod")
    probe, calls = _counting(True)
    for _ in range(3):  # three launches: three processes, one file
        assert remembered_gloo_built(probe, str(hvd), tmp_path / "cache")() is True
    assert len(calls) == 1
    so = hvd / "tensorflow" / "mpi_lib.cpython-311-x86_64-linux-gnu.so"
    key = build_key(str(hvd))
    so.write_bytes(b"y" * 11)  # Horovod rebuilt
    assert build_key(str(hvd)) != key
    assert remembered_gloo_built(probe, str(hvd), tmp_path / "cache")() is True
    assert len(calls) == 2


@pytest.mark.parametrize("answer", [False, None])
def test_a_no_is_never_kept(tmp_path, answer):
    """Without Gloo horovodrun's own probe must run every time, and fail with its own message."""
    hvd = _fake_horovod(tmp_path / "horovod")
    probe, calls = _counting(answer)
    for _ in range(2):
        assert remembered_gloo_built(probe, str(hvd), tmp_path / "cache")() is answer
    assert len(calls) == 2 and not list((tmp_path / "cache").glob("*"))


def test_an_unusable_cache_means_asking_every_time(tmp_path):
    hvd = _fake_horovod(tmp_path / "horovod")
    (tmp_path / "file").write_text("not a directory")
    probe, calls = _counting(True)
    for _ in range(2):
        assert remembered_gloo_built(probe, str(hvd), tmp_path / "file" / "cache")() is True
    assert len(calls) == 2
    (tmp_path / "cache").mkdir()
    bad = tmp_path / "cache" / f"horovod-gloo-{build_key(str(hvd))}.json"
    bad.write_text("{half")  # a damaged answer file is asked again and rewritten
    assert remembered_gloo_built(probe, str(hvd), tmp_path / "cache")() is True
    assert len(calls) == 3 and '"gloo_built": true' in bad.read_text()


@pytest.mark.integration
def test_it_is_horovodrun_two_ranks_and_their_exit_code(tmp_path):
    """Real Horovod, two ranks on loopback: each gets its rank's environment, a failing rank's
    status is the run's, and the Gloo answer is written for the next launch."""
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache")}
    show = "import os; print('rank', os.environ['HOROVOD_RANK'], 'of', os.environ['HOROVOD_SIZE'])"
    r = subprocess.run([*argv(), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", show],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "rank 0 of 2" in r.stdout and "rank 1 of 2" in r.stdout, r.stdout
    assert [p.name for p in (tmp_path / "cache").iterdir()][0].startswith("horovod-gloo-")
    fail = "import os, sys; sys.exit(3 if os.environ['HOROVOD_RANK'] == '1' else 0)"
    r = subprocess.run([*argv(), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", fail],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "exit with status code 3" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
