"""The launcher round 2 (issue 42) with real processes: a stop that arrives while the ranks start,
a grace period that runs out, a dead PS's exit code from both entry points.

Each test waits on events (a rank's process appearing, a checkpoint's ``meta.json``), never on a
sleep, and bounds every wait; ``no_orphans`` (conftest) proves nothing outlives it.
"""
from __future__ import annotations

import os
import signal
import time

import pytest
from fault_helpers import (
    GMETA,
    _ckpt_done,
    _cmd,
    _finish,
    _launch_argv,
    _output,
    _rank_pids,
    _sets,
    _spawn,
    _wait_for,
    project_processes,
)

from gmeta_tf import exit_codes
from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import ExitReason

pytestmark = pytest.mark.integration


def _records(run):
    return rank_status.read_all(str(run / rank_status.STATUS_DIR))


def test_a_sigterm_while_the_ranks_start_reaches_every_rank(tiny_data, tmp_path, no_orphans):
    """SIGTERM to the launcher as soon as horovodrun has started a rank (the other may not exist
    yet, neither has trained): both ranks stop at the first step they agree on, checkpointed, and
    none is killed after the grace period. Before: the signal went only to the rank processes
    that existed, which had no handler yet (default action) or were never asked, and were
    killed after grace + 5 s with nothing saved."""
    run = tmp_path / "run"
    proc = _spawn([*_launch_argv(tiny_data, run, steps=400), *_sets("train.checkpoint_every=1000",
                                                                     "train.preemption_grace_s=120")])
    try:
        _wait_for(lambda: _rank_pids(no_orphans, 0) or _rank_pids(no_orphans, 1) or proc.poll() is not None,
                  300, "horovodrun to start a rank")
        assert proc.poll() is None, _output(proc)[-3000:]
        assert not (run / "checkpoints").exists() or not any((run / "checkpoints").glob("ckpt-*"))
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code, out = _finish(proc, timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - sent
    assert code == exit_codes.PREEMPTED.code, out[-4000:]
    assert "[launch] stopped by SIGTERM: the workers checkpointed and exited" in out, out[-4000:]
    assert "after the grace period" not in out, out[-4000:]
    assert took < 120, took
    records = _records(run)
    assert sorted(records) == [0, 1], records
    assert {r.exit.reason for r in records.values()} == {ExitReason.PREEMPTED}, records
    (step,) = {r.checkpoint for r in records.values()}
    assert step == 1, records  # the first step: nothing was trained before the stop
    assert _ckpt_done(run, 1), out[-3000:]


def test_a_grace_time_out_is_not_reported_as_checkpointed(tiny_data, tmp_path, no_orphans):
    """Rank 1 frozen (SIGSTOP), then SIGTERM to the launcher with a 3 s grace period: rank 0 votes
    and waits in the all-reduce for rank 1 until its grace runs out, then exits 143, the code of
    a checkpointed stop. Before: the launcher read "143" off horovodrun's line and said
    "stopped by SIGTERM and checkpointed"."""
    run = tmp_path / "run"
    proc = _spawn([*_launch_argv(tiny_data, run, steps=5000), *_sets("train.preemption_grace_s=3")])
    frozen = []
    try:
        _wait_for(lambda: _ckpt_done(run, 10) or proc.poll() is not None, 300, "checkpoint 10")
        assert proc.poll() is None, _output(proc)[-3000:]
        frozen = _rank_pids(no_orphans, 1)
        assert len(frozen) == 1, frozen
        os.kill(frozen[0], signal.SIGSTOP)
        os.kill(proc.pid, signal.SIGTERM)
        code, out = _finish(proc, timeout=200)
    finally:
        for pid in frozen:  # a stopped process cannot act on SIGTERM; let it go
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == exit_codes.PREEMPTED.code, out[-4000:]
    (said,) = [line for line in out.splitlines() if line.startswith("[launch] stopped by SIGTERM")]
    assert "checkpointed" not in said, said
    assert "worker rank 0 was stopped by SIGTERM without a checkpoint (the grace period ran out)" in said, said
    records = _records(run)
    assert records[0].exit.reason is ExitReason.GRACE_EXPIRED and records[0].exit.code == 143, records
    assert not any(r.exit is not None and r.exit.checkpointed for r in records.values()), records


def test_a_dead_ps_exits_200_from_gmeta_train_and_from_gmeta_launch_local(tiny_data, tmp_path, no_orphans):
    """The same fault, the same code: ``ClusterFaultError``'s 200 (retryable) from the trainer run
    by hand against a PS, and from the launcher that started both (it exited 2 before)."""
    from launch.local_cluster import LocalCluster

    codes = {}
    cluster = LocalCluster(log=lambda m: None)
    try:
        (addr,) = cluster.start_ps(1)
        run = tmp_path / "train"
        worker = _spawn([*GMETA, "train", "--data", str(tiny_data), "--out", str(run), "--steps", "5000",
                         "--ps", addr, *_sets()])
        try:
            _wait_for(lambda: _ckpt_done(run, 10) or worker.poll() is not None, 300, "checkpoint 10 (gmeta train)")
            cluster.ps_children()[0].proc.kill()
            codes["gmeta train"], out = _finish(worker, timeout=120)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
    finally:
        cluster.teardown()
    assert "lost ps:0" in out, out[-3000:]

    run = tmp_path / "launch"
    argv = _launch_argv(tiny_data, run, steps=5000)
    argv[argv.index("--workers") + 1] = "1"
    launcher = _spawn(argv)
    try:
        _wait_for(lambda: _ckpt_done(run, 10) or launcher.poll() is not None, 300, "checkpoint 10 (launch local)")
        (ps,) = [p for p in project_processes(no_orphans) if b"ps serve" in _cmd(p)]
        os.kill(ps, signal.SIGKILL)
        codes["gmeta launch local"], out = _finish(launcher, timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert "launch failed: ps:0 (127.0.0.1:" in out, out[-3000:]
    assert codes == {"gmeta train": exit_codes.CLUSTER_FAULT.code, "gmeta launch local": exit_codes.CLUSTER_FAULT.code}, (
        codes, out[-3000:])
    (rank0,) = _records(run).values()
    assert rank0.exit.reason is ExitReason.CLUSTER_FAULT and rank0.step >= 10, rank0
