"""Faults a training job survives (issue 32): preemption checkpoints and automatic restarts.

Real processes only: ``gmeta launch local`` (``gmeta ps serve`` plus ``horovodrun --gloo``) and
``gmeta train``. Each test asserts that the run ends at the requested step, that every
checkpoint left is complete, that nothing is left running (``no_orphans``), and, where the step
sequence is deterministic, that the model equals an uninterrupted run's.

Which runs are deterministic across a resume: one worker (with or without a PS) is, to the bit
(the PS applies one worker's updates in step order, and a resume restores rows, slots, dense
weights, optimizer state and the data position). Two workers are not, faults or none: each
applies its embedding gradients to the shared PS rows on its own (asynchronous sparse updates,
G-Meta's design), so the order in which two ranks' Adam updates land on a row differs from run
to run and the rows differ in the last bits. The two-worker tests assert what is exact there:
the step reached, 0 steps redone after a preemption, identical replicas.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from fault_helpers import (
    GMETA,
    REFERENCE_STEPS,
    TINY_SETS,
    _assert_all_complete,
    _cmd,
    _complete_steps,
    _finish,
    _kill_frozen_rank,
    _launch_argv,
    _output,
    _rank_pids,
    _resume_once_pending,
    _resume_once_stop_requested,
    _sets,
    _spawn,
    _wait_for,
    _wait_frozen,
    one_worker_argv,
    project_processes,
)

from gmeta_tf.errors import EXIT_CLUSTER_FAULT, EXIT_PREEMPTED
from launch.network.netns import list_namespaces, missing_privilege

# Every fault lands at an exact step: the rank freezes itself there (``pause_at``, the trainer's
# GMETA_PAUSE_AT_STEP), the test kills or signals, then lets it go on. So a run needs only the
# steps that cross the fault, not a margin for a loaded box, and the step redone is exact.
STEPS = REFERENCE_STEPS


def _final_state(run: Path, step: int = STEPS):
    """Dense digest and every table file's rows (sorted by key) of the checkpoint at ``step``."""
    summary = json.loads((run / "train_summary.json").read_text())
    tables = {}
    for f in sorted((run / "checkpoints" / f"ckpt-{step:08d}" / "tables").glob("*.npz")):
        with np.load(f) as z:
            order = np.argsort(z["keys"])
            tables[f.name] = (z["keys"][order], z["values"][order])
    return summary, tables


def _assert_same_model(run: Path, reference: Path):
    (got, got_tables), (want, want_tables) = _final_state(run), _final_state(reference)
    assert got["last_step"] == want["last_step"] == STEPS
    assert got["dense_digest"] == want["dense_digest"]  # bit-identical dense weights
    assert got_tables.keys() == want_tables.keys()
    for name, (keys, values) in want_tables.items():
        np.testing.assert_array_equal(got_tables[name][0], keys, err_msg=name)
        np.testing.assert_allclose(got_tables[name][1], values, atol=1e-5, err_msg=name)


# -- 0. SIGTERM to the embedded trainer: the same protocol in one process -------------------------
def test_sigterm_to_the_embedded_trainer_saves_the_step_it_reached(tiny_data, tmp_path):
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.train.trainer import train

    run = tmp_path / "run"
    argv = [*GMETA, "train", "--data", str(tiny_data), "--out", str(run), "--steps", str(STEPS),
            *_sets("train.checkpoint_every=1000")]
    proc = _spawn(argv, pause_at=10)
    _wait_frozen(lambda: [proc.pid], proc, what="the trainer to freeze after step 10")
    os.kill(proc.pid, signal.SIGTERM)
    _resume_once_pending(proc.pid, signal.SIGTERM)
    code, out = _finish(proc, timeout=60)
    assert code == EXIT_PREEMPTED, out[-3000:]  # SIGTERM's own code, as a platform expects
    steps = _complete_steps(run)
    # the next step's vote: the handler's record is read by the vote itself, not only by the
    # watcher thread, which could be scheduled a step late (tests/test_stop_delivery.py)
    assert steps == [11], (steps, out[-3000:])
    code, out = _finish(_spawn(argv), timeout=300)
    assert code == 0 and f"at step {steps[0]}" in out, out[-3000:]
    straight = train(load_config(None, [f"data.path={tiny_data}", f"train.steps={STEPS}", *TINY_SETS]),
                     tmp_path / "straight")
    assert json.loads((run / "train_summary.json").read_text())["dense_digest"] == straight["dense_digest"]


# -- 1. SIGTERM to the launcher: a preemption checkpoint, then 0 steps redone ----------------------
def test_sigterm_to_the_launcher_checkpoints_every_step_and_resumes_exactly(tiny_data, tmp_path, no_orphans,
                                                                           reference_run):
    run = tmp_path / "run"
    # no periodic checkpoint before the end: whatever is saved, the preemption saved it
    argv = one_worker_argv(tiny_data, run, "train.checkpoint_every=1000", "train.preemption_grace_s=60")
    proc = _spawn(argv, pause_at=10)
    rank0 = _wait_frozen(lambda: _rank_pids(no_orphans, 0), proc, what="rank 0 to freeze after step 10")
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)  # the launcher alone, as a platform would
    _resume_once_stop_requested(rank0)  # once the launcher has written the stop request
    code, out = _finish(proc, timeout=120)
    took = time.monotonic() - sent
    assert code == EXIT_PREEMPTED, out[-3000:]
    assert took < 60, took  # within the grace period
    steps = _complete_steps(run)
    assert steps == [11], (steps, out[-3000:])
    assert f"checkpointed step {steps[0]}" in out, out[-3000:]
    _assert_all_complete(run)
    _wait_for(lambda: not project_processes(no_orphans), 30, "every process of the launch to exit")

    code, out = _finish(_spawn(one_worker_argv(tiny_data, run)), timeout=400)
    assert code == 0, out[-3000:]
    assert f"at step {steps[0]}" in out, out[-3000:]  # resumed where it was stopped: nothing redone
    _assert_same_model(run, reference_run)


# -- 2. kill -9 of the PS under --max-restarts: a fresh cluster resumes ----------------------------
def test_killed_ps_restarts_the_cluster_and_resumes_to_the_same_model(tiny_data, tmp_path, no_orphans,
                                                                      reference_run):
    run = tmp_path / "run"
    proc = _spawn(one_worker_argv(tiny_data, run, restarts=1, steps=STEPS), pause_at=20)
    rank0 = _wait_frozen(lambda: _rank_pids(no_orphans, 0), proc, what="rank 0 to freeze after step 20")
    assert _complete_steps(run) == [10, 20], _output(proc)[-2000:]
    victims = [p for p in project_processes(no_orphans) if b"ps serve" in _cmd(p)]
    assert len(victims) == 1 and proc.poll() is None, (victims, _output(proc)[-2000:])
    os.kill(victims[0], signal.SIGKILL)
    os.kill(rank0, signal.SIGCONT)  # its next request finds the PS gone
    code, out = _finish(proc, timeout=400)
    assert code == 0, out[-3000:]
    assert "[launch] restart 1/1: ps:0 (127.0.0.1:" in out and "died (killed by SIGKILL)" in out, out[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    (restart,) = summary["restarts"]
    assert restart["cause"].startswith("ps:0 (127.0.0.1:") and restart["exit_code"] == -9, restart
    assert restart["resumed_from_step"] == 20 and 0 <= restart["steps_redone"] <= 1, restart
    assert restart["recovery_s"] > 0, restart
    _assert_all_complete(run)
    _assert_same_model(run, reference_run)


def test_a_killed_worker_restarts_on_the_same_ps_and_resumes_to_the_same_model(tiny_data, tmp_path, no_orphans,
                                                                            reference_run):
    """A lost worker leaves the PS running and they are kept (no PS start in the recovery). The
    worker is killed five steps past its checkpoint, so the PS hold rows and slots the resumed
    run must not see: the restore replaces them, and the model ends where the reference does."""
    run = tmp_path / "run"
    proc = _spawn(one_worker_argv(tiny_data, run, restarts=1, steps=STEPS), pause_at=25)
    rank0 = _wait_frozen(lambda: _rank_pids(no_orphans, 0), proc, what="rank 0 to freeze after step 25")
    ps_before = [p for p in project_processes(no_orphans) if b"ps serve" in _cmd(p)]
    assert _complete_steps(run) == [10, 20] and len(ps_before) == 1, _output(proc)[-2000:]
    os.kill(rank0, signal.SIGKILL)
    code, out = _finish(proc, timeout=400)
    assert code == 0, out[-3000:]
    assert "restart 1/1: worker rank 0 failed (killed by SIGKILL)" in out and "(the PS kept" in out, out[-3000:]
    (restart,) = json.loads((run / "train_summary.json").read_text())["restarts"]
    assert restart["resumed_from_step"] == 20 and restart["steps_redone"] <= 5, restart  # a lower bound
    assert "ps_ready" not in restart["timeline_s"], restart  # no PS was started for the restart
    _assert_all_complete(run)
    _assert_same_model(run, reference_run)


# -- 3. SIGTERM to one of two workers: both agree on one step; the restart redoes none --------------
def test_sigterm_to_one_worker_makes_both_checkpoint_one_step(tiny_data, tmp_path, no_orphans):
    run = tmp_path / "run"
    argv = [*_launch_argv(tiny_data, run, steps=STEPS), "--max-restarts", "1", "--restart-backoff", "0.5",
            *_sets("train.checkpoint_every=1000")]
    proc = _spawn(argv, pause_at="20:1")  # rank 1 freezes after step 20; rank 0 waits for it in step 21
    rank1 = _wait_frozen(lambda: _rank_pids(no_orphans, 1), proc, what="rank 1 to freeze after step 20")
    os.kill(rank1, signal.SIGTERM)
    _resume_once_pending(rank1, signal.SIGTERM)
    code, out = _finish(proc, timeout=400)
    assert code == 0, out[-3000:]
    agreed = {int(m.group(1)) for m in re.finditer(r"preempted .*checkpointed step (\d+)", out)}
    assert len(agreed) == 1, out[-3000:]  # every rank named the same step
    assert agreed == {21}, out[-3000:]  # the step whose all-reduce carried rank 1's vote
    (step,) = agreed
    # every rank exits 143 once the agreed step is saved; the first to exit is the one named
    assert re.search(r"restart 1/1: worker rank [01] was stopped by SIGTERM and checkpointed", out), out[-3000:]
    (restart,) = json.loads((run / "train_summary.json").read_text())["restarts"]
    assert restart["resumed_from_step"] == step and restart["steps_redone"] == 0, restart
    ranks = [json.loads(f.read_text()) for f in sorted((run / "ranks").glob("rank*.json"))]
    assert [r["last_step"] for r in ranks] == [STEPS, STEPS]
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]  # replicas identical after the restart
    _assert_all_complete(run)


# -- 4. kill -9 of a worker under --max-restarts ---------------------------------------------------
def test_killed_worker_restarts_the_cluster(tiny_data, tmp_path, no_orphans):
    run = tmp_path / "run"
    argv = [*_launch_argv(tiny_data, run, steps=STEPS), "--max-restarts", "1", "--restart-backoff", "0.5"]
    code, out = _kill_frozen_rank(argv, no_orphans)
    assert code == 0, out[-3000:]
    assert "restart 1/1: worker rank 1 failed (killed by SIGKILL)" in out, out[-3000:]
    # the launcher read rank 1's death from its agent's record and ended rank 0 itself, rather
    # than wait for rank 0's next collective to fail and horovodrun to notice (issue 42)
    assert "[launch] worker rank 1 killed by SIGKILL: ending the other 1 rank(s) now" in out, out[-3000:]
    (restart,) = json.loads((run / "train_summary.json").read_text())["restarts"]
    assert restart["resumed_from_step"] == 20 and restart["steps_redone"] <= 1, restart
    # where the recovery went: every moment, launcher's and rank 0's, in the order they happen
    from gmeta_tf.train.restarts import MOMENTS
    timeline = restart["timeline_s"]
    assert list(timeline) == [m for m in MOMENTS if m != "ps_ready"], timeline  # the PS kept: none started
    assert list(timeline.values()) == sorted(timeline.values()), timeline
    assert timeline["first_step"] == pytest.approx(restart["recovery_s"], abs=0.01) and timeline["workers_exited"] >= 0
    ranks = [json.loads(f.read_text()) for f in sorted((run / "ranks").glob("rank*.json"))]
    assert [r["last_step"] for r in ranks] == [STEPS, STEPS]
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]
    _assert_all_complete(run)


# -- 5. a PS restarted behind the same address is never trained against ----------------------------
def test_ps_restarted_at_the_same_address_stops_the_worker(tiny_data, tmp_path, no_orphans):
    from launch.local_cluster import free_ports
    from ps.server import wait_ready

    run = tmp_path / "run"
    port, health = free_ports(2)
    addr = f"127.0.0.1:{port}"

    def start_ps(h):
        ps = _spawn([*GMETA, "ps", "serve", "--ps-hosts", addr, "--index", "0", "--health-port", str(h)])
        wait_ready(f"http://127.0.0.1:{h}/ready", 120, ps)
        return ps

    train = [*GMETA, "train", "--data", str(tiny_data), "--out", str(run), "--ps", addr, *_sets()]
    ps = start_ps(health)
    worker = second = None
    try:
        worker = _spawn([*train, "--steps", "5000"], pause_at=20)
        # frozen, so that its next request reaches the new PS, not a dead port
        _wait_frozen(lambda: [worker.pid], worker, what="the worker to freeze after step 20")
        before = _complete_steps(run)
        assert before == [10, 20], before
        os.kill(ps.pid, signal.SIGKILL)
        ps.wait()
        second = start_ps(free_ports(1)[0])  # the same PS address, a fresh process with no tables
        os.kill(worker.pid, signal.SIGCONT)
        code, out = _finish(worker, timeout=120)
        assert code == EXIT_CLUSTER_FAULT, out[-3000:]  # retryable: ExitCode restart policies retry 128-255
        said = [line for line in out.splitlines() if line.startswith("error: ")]  # the CLI's one line
        assert len(said) == 1, out[-3000:]
        assert f"lost ps:0 ({addr})" in said[0] and "restarted" in said[0], out[-3000:]
        assert "Graph execution error" not in said[0], said  # TensorFlow's cause, not its header
        assert _complete_steps(run) == before, out[-3000:]  # nothing saved from the empty PS
        _assert_all_complete(run)
        code, out = _finish(_spawn([*train, "--steps", str(before[-1] + 10)]), timeout=300)
        assert code == 0, out[-3000:]
        assert f"at step {before[-1]}" in out, out[-3000:]  # tables refilled into the new PS
    finally:
        for p in (worker, ps, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


# -- 6. emulated links: a PS cut off for 5 s, then 2% loss on a worker's link ----------------------
@pytest.mark.skipif(missing_privilege() is not None, reason=f"emulated network: {missing_privilege()}")
def test_a_cut_off_ps_and_a_lossy_link_ride_through_or_restart(tiny_data, tmp_path, no_orphans, reference_run):
    """On emulated hosts (``--network``): ps0's link down for 5 s at step 20, then 2% of the packets
    on worker0's link dropped from step 40. TCP rides through both (or, if a connection gives
    up, one restart resumes): the run must end at its step, never hang past the time-out, leave
    no namespace, and train the model the uninterrupted loopback run trained (one worker)."""
    run = tmp_path / "run"
    argv = [*one_worker_argv(tiny_data, run, restarts=1), "--network", "rate=100mbit",
            "--network-fault", "ps0:cut=5@20", "--network-fault", "worker0:loss=0.02@40",
            "--set", "cluster.wire_dtype=float32"]  # the loopback run's (auto: bfloat16 at 100 Mbit/s)
    proc = _spawn(argv)
    code, out = _finish(proc, timeout=600)
    assert code == 0, out[-3000:]
    assert "[launch] step 2" in out and "network fault ps0 cut=5" in out and "ps0: link restored" in out, out[-3000:]
    assert "network fault worker0 loss=0.02" in out, out[-3000:]
    assert not [n for n in list_namespaces() if n.startswith(f"gm-{proc.pid}-")]
    _assert_all_complete(run)
    _assert_same_model(run, reference_run)
