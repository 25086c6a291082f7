"""Elastic workers (issue 42): the ring grows back when a lost worker's host returns.

``gmeta launch local --elastic`` with a cool-down (``cluster.elastic_cooldown_s``): after a
worker is killed, its host comes back, horovodrun starts a new worker there, rank 0's next
commit re-forms the ring and it grows back to two (real PS, real horovodrun, real ranks). The
shrink-only cases: test_elastic.py.
"""
from __future__ import annotations

import json

from fault_helpers import _assert_all_complete, _complete_steps, _kill_frozen_rank, _launch_argv

# The survivor must still have commits ahead when the host's cool-down (1 s) and the driver's next
# look at the hosts (every 1 s) are over: about 60 steps a second at most on this box, alone.
REGROW_STEPS = 300


def test_a_lost_workers_host_returns_and_the_ring_grows_back(tiny_data, tmp_path, no_orphans):
    """Rank 1 is killed after step 20; rank 0 rolls back to step 20 and goes on alone. Horovod
    blacklists rank 1's host for its cool-down (``cluster.elastic_cooldown_s: [1, 1]``, 1 s),
    then tells rank 0, whose next commit re-forms the ring; horovodrun starts a new worker on that
    host, whose start-up does no collective (``StartGate``), and which takes rank 0's dense state
    and step from the ring's first sync and reads shard 1 of 2 from there. The job ends with 2
    ranks and bit-identical dense weights, no restart. Gloo's time-out stays at Horovod's 30 s:
    rank 0 learns of the loss at once (its link to rank 1 closes), and it waits in the re-formed
    ring's rendezvous for the new worker to start, which a small time-out would cut short."""
    run = tmp_path / "run"
    argv = [*_launch_argv(tiny_data, run, steps=REGROW_STEPS), "--elastic",
            "--set", "cluster.elastic_cooldown_s=[1,1]"]
    code, out = _kill_frozen_rank(argv, no_orphans, timeout=150)
    assert code == 0, out[-4000:]
    launch_lines = [line for line in out.splitlines() if line.startswith("[launch]")]
    assert not [line for line in launch_lines if "restart" in line], launch_lines
    assert "[launch] worker rank 1 killed by SIGKILL: elastic, the other ranks go on" in out, out[-4000:]
    assert "elastic: the ring re-formed; 1 worker(s) go on from the commit of step 20 (rank 0 of 1" in out, out[-4000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["last_step"] == REGROW_STEPS and summary["restarts"] == [], summary.get("restarts")
    assert summary["ranks"] == 2, summary["ranks"]  # the ring at the end: grown back to two
    ring = summary["elastic"]["ring"]
    assert [r["ranks"] for r in ring] == [2, 1, 2] and ring[1]["step"] == 20, ring
    joined_at = ring[2]["step"]
    assert 20 < joined_at < REGROW_STEPS and joined_at % 10 == 0, ring  # at one of rank 0's commits
    [joined] = summary["elastic"]["joined"]  # from the new worker's status record
    assert (joined["step"], joined["rank"], joined["ranks"]) == (joined_at, 1, 2), joined
    assert (f"[launch] a new worker (pid {joined['pid']}) joined the elastic ring as rank 1 of 2 at the commit of "
            f"step {joined_at}: the ring grew back") in out, out[-4000:]
    assert f"elastic: joined the running ring at the commit of step {joined_at} as rank 1 of 2" in out, out[-4000:]
    assert "[launch] elastic: the ring finished with 2 rank(s); 1 worker(s) lost, 1 joined" in out, out[-4000:]
    ranks = {f.name: json.loads(f.read_text()) for f in sorted((run / "ranks").glob("rank*.json"))}
    assert list(ranks) == ["rank0.json", "rank1.json"], list(ranks)  # rank1.json: the new worker's
    assert [r["last_step"] for r in ranks.values()] == [REGROW_STEPS, REGROW_STEPS]
    assert ranks["rank1.json"]["ring"] == [[joined_at, 1, 2]]
    assert ranks["rank0.json"]["dense_digest"] == ranks["rank1.json"]["dense_digest"]  # bit-identical replicas
    assert _complete_steps(run)[-1] == REGROW_STEPS
    _assert_all_complete(run)
