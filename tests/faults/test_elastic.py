"""Elastic workers (issue 42): a killed worker's job finishes without a restart.

``gmeta launch local --elastic`` runs the workers as a Horovod Elastic ring over Gloo (real PS,
real horovodrun, real ranks). Rank 1 freezes itself after step 20 (its commit and checkpoint
done), is killed with SIGKILL, and rank 0, waiting for it in step 21's all-reduce, rolls back to
the commit of step 20 and trains on alone to the last step: no "[launch] restart" line, no
``restarts`` in ``train_summary.json``, every checkpoint complete, nothing left running. The
ring growing back when the host returns: test_elastic_regrow.py (a file of its own, so that
``--dist loadfile`` can run it beside these).
"""
from __future__ import annotations

import json

from fault_helpers import (
    REFERENCE_STEPS,
    _assert_all_complete,
    _complete_steps,
    _finish,
    _kill_frozen_rank,
    _launch_argv,
    _output,
    _spawn,
)

STEPS = REFERENCE_STEPS
# A lost worker's host that never comes back: the ring only shrinks (re-growing: test_elastic_regrow.py).
NEVER_RETURNS = ["--set", "cluster.elastic_cooldown_s=null"]


def test_a_killed_worker_leaves_the_survivor_to_finish_without_a_restart(tiny_data, tmp_path, no_orphans):
    run = tmp_path / "run"

    def checkpointed_20(proc):
        assert _complete_steps(run) == [10, 20], _output(proc)[-3000:]

    # null: the lost host never returns (cluster.elastic_cooldown_s), so the ring stays at one
    code, out = _kill_frozen_rank([*_launch_argv(tiny_data, run, steps=STEPS), "--elastic", *NEVER_RETURNS],
                                  no_orphans, timeout=300, while_frozen=checkpointed_20)
    assert code == 0, out[-3000:]
    launch_lines = [line for line in out.splitlines() if line.startswith("[launch]")]
    assert not [line for line in launch_lines if "restart" in line], launch_lines
    assert "[launch] worker rank 1 killed by SIGKILL: elastic, the other ranks go on" in out, out[-3000:]
    # the survivor rolled back to the commit rank 1 had made too, and went on as a ring of one
    assert "elastic: the ring re-formed; 1 worker(s) go on from the commit of step 20 (rank 0 of 1" in out, out[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["last_step"] == STEPS and summary["restarts"] == [], summary.get("restarts")
    assert summary["ranks"] == 1  # the job finished on the survivor: the lost worker was not replaced
    ranks = {f.name: json.loads(f.read_text()) for f in sorted((run / "ranks").glob("rank*.json"))}
    assert list(ranks) == ["rank0.json"], list(ranks)  # rank 1 never finished
    assert [r["last_step"] for r in ranks.values()] == [STEPS]
    assert len({r["dense_digest"] for r in ranks.values()}) == 1  # the replicas that finished agree
    assert _complete_steps(run)[-1] == STEPS
    _assert_all_complete(run)


def test_three_workers_lose_rank_0_and_the_two_survivors_stay_identical(tiny_data_3, tmp_path, no_orphans):
    """Rank 0 (Horovod's coordinator, the checkpoint writer) is the one lost: ranks 1 and 2 re-form
    as ranks 0 and 1 of 2, the new rank 0 writes the checkpoints and the summary, and both end with
    bit-identical dense weights. One survivor sees the death at once (its link to rank 0 closes);
    the other is waiting on that survivor, which left the ring without closing their link, and
    learns of it only at Gloo's time-out (``HOROVOD_GLOO_TIMEOUT_SECONDS``, 30 s by default; 12 s
    here, as in test_process_faults' stalled worker: a frozen peer trips it, the tiny steps do not).
    The dense weights cross a bfloat16 wire whose slices follow the ring's size as it runs
    (``HorovodSync.elastic``): a ring traced at 3 averages over 2 after the loss."""
    from launch.elastic_hosts import this_machine_names

    run = tmp_path / "run"
    argv = [*_launch_argv(tiny_data_3, run, steps=STEPS), "--elastic", *NEVER_RETURNS,
            "--set", "cluster.wire_dtype=bfloat16"]
    argv[argv.index("--workers") + 1] = "3"
    names = this_machine_names()
    if len(names) < 3:
        # A machine with fewer local host names cannot hold a ring of 3 (Horovod blacklists a lost
        # worker's host): the launch must say so by name and fail, not start a ring that dies whole.
        code, out = _finish(_spawn(argv), timeout=300)
        assert code != 0, out[-3000:]
        assert f"--elastic with --workers 3: this machine has {len(names)} distinct local host name" in out, out[-3000:]
        return
    code, out = _kill_frozen_rank(argv, no_orphans, rank=0, timeout=300, env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "12"})
    assert code == 0, out[-3000:]
    assert "wire bfloat16" in out, out[-3000:]  # through the shrink
    assert "[launch] worker rank 0 killed by SIGKILL: elastic, the other ranks go on" in out, out[-3000:]
    for now in (0, 1):
        assert f"2 worker(s) go on from the commit of step 20 (rank {now} of 2" in out, out[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())  # written by the new rank 0
    assert summary["last_step"] == STEPS and summary["restarts"] == [] and summary["ranks"] == 2
    ranks = {f.name: json.loads(f.read_text()) for f in sorted((run / "ranks").glob("rank*.json"))}
    assert list(ranks) == ["rank0.json", "rank1.json"], list(ranks)  # named by the ranks they ended as
    assert [r["last_step"] for r in ranks.values()] == [STEPS, STEPS]
    assert ranks["rank0.json"]["dense_digest"] == ranks["rank1.json"]["dense_digest"]
    assert _complete_steps(run)[-3:] == [40, 50, STEPS]  # the new rank 0 checkpoints
    _assert_all_complete(run)
