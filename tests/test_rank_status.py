"""Each rank's state as data (issue 42, item 1): the status records, and the launcher reading them
instead of log text. The real processes are in tests/faults/test_launcher_state.py."""
from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest

from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import ExitReason, Phase, RankExit, RankStatus, StatusWriter, StopRequest

REPO = Path(__file__).resolve().parents[1]


class _Proc:
    def __init__(self, code):
        self.returncode = code
        self.pid = 4242

    def poll(self):
        return self.returncode


def _cluster(status_dir, ps_codes=()):
    from launch.local_cluster import Child, LocalCluster

    cluster = LocalCluster(log=lambda m: None)
    cluster.watch_stops(None, 25.0, str(status_dir))
    for i, code in enumerate(ps_codes):
        cluster.children.append(Child(f"ps:{i} (127.0.0.1:{7000 + i})", _Proc(code)))
    return cluster


def _exit(directory, rank, reason, code, at, step=0, checkpoint=None, signal=None):
    rank_status.write(str(directory), RankStatus(rank, 100 + rank, Phase.EXITED, step=step, checkpoint=checkpoint,
                                                 exit=RankExit(reason, code, "m", signal), updated_unix=at))


@pytest.mark.fast
def test_a_record_round_trips_and_is_replaced_whole(tmp_path):
    s = RankStatus(1, 77, Phase.TRAINING, step=12, start_step=10, checkpoint=10, stop_signal="SIGTERM",
                   exit=RankExit(ExitReason.PREEMPTED, 143, "x", "SIGTERM", 0.5), updated_unix=5.0)
    assert RankStatus.from_json(s.to_json()) == s
    rank_status.write(str(tmp_path), s)
    assert rank_status.read_all(str(tmp_path)) == {1: s}
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    StopRequest(15, 1.0).write(str(tmp_path / rank_status.STOP_FILE))
    (tmp_path / "rank9.json").write_text("{not json")  # half a file from elsewhere: not ours, skipped
    assert set(rank_status.read_all(str(tmp_path))) == {1}
    rank_status.clear(str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.fast
def test_an_exit_is_the_last_word_and_a_parent_writes_what_a_killed_rank_could_not(tmp_path):
    w = StatusWriter(str(tmp_path), rank=0)
    w.update(phase=Phase.TRAINING, step=5)
    w.exited(ExitReason.PREEMPTED, 143, "saved", signal="SIGTERM", checkpoint=5)
    w.update(step=6)  # a late writer (the watch thread) changes nothing after the exit
    w.exited(ExitReason.GRACE_EXPIRED, 143, "late")
    got = rank_status.read(str(tmp_path), 0)
    assert (got.step, got.checkpoint, got.exit.reason, got.phase) == (5, 5, ExitReason.PREEMPTED, Phase.EXITED)
    assert rank_status.record_exit(str(tmp_path), 0, 1, 143).exit.reason is ExitReason.PREEMPTED  # agrees: kept
    killed = rank_status.record_exit(str(tmp_path), 0, 1, -9)  # it said so, then died by SIGKILL all the same
    assert (killed.exit.reason, killed.exit.code, killed.exit.message, killed.checkpoint) == (
        ExitReason.KILLED, 137, "killed by SIGKILL", 5)
    fresh = rank_status.record_exit(str(tmp_path), 3, 99, 2)  # no record at all: died in start-up
    assert (fresh.rank, fresh.pid, fresh.exit.reason, fresh.exit.code) == (3, 99, ExitReason.EXITED, 2)


@pytest.mark.fast
def test_the_launcher_blames_the_dead_ps_first_then_the_first_rank_to_exit(tmp_path):
    from launch.supervisor import _failure

    _exit(tmp_path, 0, ExitReason.CLUSTER_FAULT, 200, at=2.0, step=37)
    _exit(tmp_path, 1, ExitReason.CLUSTER_FAULT, 200, at=1.0, step=36)
    cluster = _cluster(tmp_path, ps_codes=[-9, None])
    f = _failure(cluster, 1, None)
    assert f.problems == ["ps:0 (127.0.0.1:7000) died (killed by SIGKILL)", "worker rank 1 failed (exit code 200)"]
    assert (f.exit_code, f.job_code) == (-9, 200)
    assert cluster.last_step_seen() == 37
    assert _failure(_cluster(tmp_path / "none"), 0, None) is None


@pytest.mark.fast
def test_checkpointed_is_said_only_where_a_record_says_so(tmp_path):
    """Exit 143 is also the grace period's: only the record tells them apart (the issue's bug:
    "stopped by SIGTERM and checkpointed" for a rank that saved nothing)."""
    from launch.supervisor import _failure, _stop_outcome

    ok, late = tmp_path / "ok", tmp_path / "late"
    for r in (0, 1):
        _exit(ok, r, ExitReason.PREEMPTED, 143, at=1.0 + r, step=20, checkpoint=20, signal="SIGTERM")
    _exit(late, 0, ExitReason.GRACE_EXPIRED, 143, at=1.0, step=20, signal="SIGTERM")
    _exit(late, 1, ExitReason.PREEMPTED, 143, at=2.0, step=20, signal="SIGTERM")
    f = _failure(_cluster(ok), 1, None)
    assert f.cause == "worker rank 0 was stopped by SIGTERM and checkpointed" and f.job_code == 143
    assert _stop_outcome(_cluster(ok), 2) == "the workers checkpointed and exited"
    f = _failure(_cluster(late), 1, None)
    assert "checkpointed" not in f.cause and "grace period" in f.cause, f.cause
    said = _stop_outcome(_cluster(late), 2)
    assert "worker rank 0 was stopped by SIGTERM without a checkpoint (the grace period ran out)" in said, said
    assert "the workers checkpointed" not in said
    assert "worker rank 1" not in said  # it did checkpoint
    assert "worker rank 2 never started" in _stop_outcome(_cluster(ok), 3)


@pytest.mark.fast
def test_a_rank_killed_by_a_signal_is_named_from_its_parents_record(tmp_path):
    from launch.supervisor import _failure

    rank_status.record_exit(str(tmp_path), 1, 55, -9)  # what rank_agent / the emulated launcher write
    f = _failure(_cluster(tmp_path), 1, None)
    assert f.cause == "worker rank 1 failed (killed by SIGKILL)" and f.job_code == 200


def test_the_exit_record_follows_the_exceptions_type_not_its_text():
    from gmeta_tf.config.schema import ConfigError
    from gmeta_tf.errors import ClusterFaultError, DataError, Preempted
    from gmeta_tf.train.rank_life import exit_of

    rec, ckpt = exit_of(Preempted("anything at all", 40, 15, save_s=0.25))
    assert (rec.reason, rec.code, rec.signal, rec.checkpoint_s, ckpt) == (ExitReason.PREEMPTED, 143, "SIGTERM", 0.25, 40)
    assert exit_of(ClusterFaultError("preempted checkpointed"))[0].reason is ExitReason.CLUSTER_FAULT
    assert (exit_of(DataError("x"))[0].reason, exit_of(DataError("x"))[0].code) == (ExitReason.USER_ERROR, 2)
    assert exit_of(ConfigError("x"))[0].reason is ExitReason.USER_ERROR
    assert (exit_of(ValueError("bad"))[0].reason, exit_of(ValueError("bad"))[0].code) == (ExitReason.CRASHED, 1)


@pytest.mark.fast
def test_no_regular_expression_reads_a_process_output_in_launch():
    """What the launcher knows it reads from records. Its regexes validate what a user or a spec
    writes (host names, fault specs, Kubernetes names and quantities), nothing a process prints."""
    allowed = {("launch/network/netns.py", "_HOST_NAME"), ("launch/network/faults.py", "_SPEC"),
               ("launch/k8s_render.py", "_DNS1123_LABEL"), ("launch/k8s_render.py", "_DNS1035_LABEL"),
               ("launch/k8s_render.py", "_DNS1123_SUBDOMAIN"), ("launch/k8s_render.py", "_URI"),
               ("launch/k8s_render.py", "_check_quantity")}
    found = set()
    for path in sorted((REPO / "launch").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child._parent = node
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "re"
                    and node.attr in ("compile", "search", "match", "fullmatch", "finditer", "findall", "sub")):
                owner = node
                while not isinstance(owner, (ast.Assign, ast.FunctionDef, ast.Module)):
                    owner = owner._parent
                name = (owner.targets[0].id if isinstance(owner, ast.Assign) else
                        owner.name if isinstance(owner, ast.FunctionDef) else "<module>")
                found.add((rel, name))
    assert found <= allowed, found - allowed
    from launch import local_cluster

    for gone in ("_RANK_EXIT", "_STEP_SEEN", "_FIRST_FAILURE", "failed_ranks"):
        assert not hasattr(local_cluster, gone) and not hasattr(local_cluster.LocalCluster, gone), gone


@pytest.mark.fast
def test_a_restart_history_survives_the_record_round_trip_to_the_summary():
    from gmeta_tf.train import restarts

    r = restarts.Restart(1, "worker rank 1 failed (killed by SIGKILL)", 137, 27, time.time())
    assert restarts.from_env({restarts.RESTARTS_ENV: restarts.encode([r])}) == [r]


def test_the_rank_agent_writes_the_exit_of_a_rank_killed_by_a_signal(tmp_path):
    """Under horovodrun the rank is the agent's child: the agent reaps it and writes what a rank
    killed by SIGKILL could not, then exits with the rank's code (horovodrun sees what it did)."""
    import json
    import subprocess
    import sys

    from launch.rank_agent import RANK_ARGV_ENV, agent_argv

    rank = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    env = {**os.environ, "PYTHONPATH": str(REPO), RANK_ARGV_ENV: json.dumps(rank),
           rank_status.STATUS_DIR_ENV: str(tmp_path), "HOROVOD_RANK": "1"}
    r = subprocess.run(agent_argv(), cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 137, r.stderr
    got = rank_status.read(str(tmp_path), 1)
    assert (got.exit.reason, got.exit.code, got.exit.signal) == (ExitReason.KILLED, 137, "SIGKILL")
    assert b"train" not in " ".join(agent_argv()).encode()  # a rank is found by its command line alone


def test_a_bad_input_leaves_no_run_directory_behind_but_a_run_that_wrote_keeps_its_record(tmp_path, monkeypatch):
    """A command refused for bad input leaves the run directory as it found it (the record was the
    only thing it wrote); a run that wrote anything else keeps the record of why it ended."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.errors import DataError
    from gmeta_tf.train.rank_life import rank_life

    monkeypatch.delenv("GMETA_STATUS_DIR", raising=False)
    cfg = load_config("configs/quickstart.yaml")
    with pytest.raises(DataError):
        with rank_life(cfg, str(tmp_path / "new" / "run"), log=lambda m: None):
            raise DataError("bad rows")
    assert not (tmp_path / "new").exists()
    with pytest.raises(DataError):
        with rank_life(cfg, str(tmp_path / "wrote"), log=lambda m: None):
            (tmp_path / "wrote" / "config.yaml").write_text("x")
            raise DataError("bad rows")
    assert (tmp_path / "wrote" / "status" / "rank0.json").exists()
