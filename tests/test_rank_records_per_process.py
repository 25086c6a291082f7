"""An elastic ring's status records are one per process (issue 52, item 3).

A worker horovodrun starts on a returned host gets a slot rank that can be the rank a live
process started as; a record named by rank alone was then written by both. Here two processes
share a starting rank, and each keeps its own record. The full launch (kill -9, rejoin):
tests/faults/test_elastic_records.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import ExitReason, Phase, RankStatus, StatusWriter

REPO = Path(__file__).resolve().parents[1]


def test_two_processes_that_started_as_one_rank_keep_a_record_each(tmp_path):
    d = str(tmp_path)
    lost = StatusWriter(d, rank=1, process=rank_status.record_id({}))
    lost.update(phase=Phase.TRAINING, step=20, ring=[[0, 1, 2]], ring_rank=1)
    rank_status.record_exit(d, 1, 4242, -9, lost.process)  # its agent: killed
    joiner = StatusWriter(d, rank=1, process=rank_status.record_id({}))  # a new worker in the same slot
    joiner.update(phase=Phase.TRAINING, step=30, ring=[[30, 1, 2]], ring_rank=1, joined_step=30)
    assert lost.process != joiner.process
    records = {r.process: r for r in rank_status.read_processes(d)}
    assert set(records) == {lost.process, joiner.process}
    assert records[lost.process].exit.reason is ExitReason.KILLED and records[lost.process].step == 20
    assert records[joiner.process].exit is None and records[joiner.process].joined_step == 30
    assert rank_status.read_all(d)[1].process == joiner.process  # by rank: the newer
    # the joiner's agent writes its exit into the joiner's record alone
    joiner.exited(ExitReason.DONE, 0, "trained to step 60")
    rank_status.record_exit(d, 1, 5151, 0, joiner.process)
    again = {r.process: r for r in rank_status.read_processes(d)}
    assert again[lost.process].exit.reason is ExitReason.KILLED
    assert again[joiner.process].exit.reason is ExitReason.DONE
    rank_status.clear(d)
    assert os.listdir(d) == []


def test_without_elastic_a_record_keeps_its_rank_name(tmp_path):
    StatusWriter(str(tmp_path), rank=2).flush()
    assert os.listdir(tmp_path) == ["rank2.json"]
    assert rank_status.read(str(tmp_path), 2).process is None


def test_the_agent_of_an_elastic_rank_names_its_record_and_writes_its_kill_there(tmp_path):
    """Two agents of one slot rank (a killed worker, then its replacement): two records."""
    from launch.rank_agent import RANK_ARGV_ENV, agent_argv

    rank = [sys.executable, "-c",
            "import os, signal\n"
            "from gmeta_tf.train.rank_status import StatusWriter, record_id\n"
            f"StatusWriter({str(tmp_path)!r}, rank=1, process=record_id()).flush()\n"
            "os.kill(os.getpid(), signal.SIGKILL)"]
    env = {**os.environ, "PYTHONPATH": str(REPO), RANK_ARGV_ENV: json.dumps(rank),
           rank_status.STATUS_DIR_ENV: str(tmp_path), "HOROVOD_RANK": "1", "HOROVOD_ELASTIC": "1"}
    for _ in range(2):
        r = subprocess.run(agent_argv(), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 137, r.stderr
    records = rank_status.read_processes(str(tmp_path))
    assert len(records) == 2 and len({r.process for r in records}) == 2, os.listdir(tmp_path)
    assert [(r.rank, r.exit.reason) for r in records] == [(1, ExitReason.KILLED)] * 2
    assert sorted(os.listdir(tmp_path)) == sorted(f"rank1.{r.process}.json" for r in records)
    assert all(isinstance(r, RankStatus) for r in records)
