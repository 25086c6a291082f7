"""Start-order fuzz: ranks started in a random order with random delays never crash a PS.

The PS crash this guards against (docs/startup.md) needed two ranks' *first* eager contexts on a
fresh PS to overlap, so every run gets fresh PS processes (a reused PS keeps the previous run's
contexts and could no longer show it). Ranks are started by hand, each with its own delay, as
Kubernetes pods start; every run must end with both PS alive and every rank's training done.
"""
import random

import pytest
from cluster_helpers import LocalCluster, rank_summaries, start_ranks_manually, stop_manual_ranks

RUNS = 20
SEED = 1414


@pytest.fixture(scope="module")
def data_dir(prepared_2500):
    return prepared_2500


def _args(data_dir, run_dir):
    return ["--config", "configs/quickstart.yaml", "--data", str(data_dir), "--out", str(run_dir),
            "--steps", "2", "--set", "data.tasks_per_batch=4", "--set", "train.log_every=1",
            "--set", "train.checkpoint_every=1000"]


def _one_run(data_dir, run_dir, workers, delays):
    cluster = LocalCluster(log=lambda m: None)
    try:
        cluster.start_ps(2)
        procs = start_ranks_manually(cluster, _args(data_dir, run_dir), workers, delays)
        codes = [p.wait(timeout=300) for p in procs]
        ps_alive = [c.proc.poll() is None for c in cluster.ps_children()]
        lines = [line for ch in cluster.children for line in ch.lines]
    finally:
        stop_manual_ranks(cluster)
        cluster.teardown()
    return codes, ps_alive, lines


@pytest.mark.integration
@pytest.mark.soak
@pytest.mark.timeout(2400)
def test_random_rank_start_order_never_crashes_a_ps(data_dir, tmp_path):
    rng = random.Random(SEED)
    outcomes = []
    for run in range(RUNS):
        workers = rng.choice([2, 3])
        # Half the runs start every rank within 50 ms (the overlap that crashed the PS); the rest
        # spread them over up to 3 s, in a random order.
        spread = 0.05 if run % 2 == 0 else 3.0
        delays = [rng.uniform(0.0, spread) for _ in range(workers)]
        run_dir = tmp_path / f"run{run}"
        codes, ps_alive, lines = _one_run(data_dir, run_dir, workers, delays)
        outcomes.append((run, workers, [round(d, 2) for d in delays], codes, ps_alive))
        errors = "\n".join(line for line in lines if "Error" in line or "error:" in line)[-3000:] or "\n".join(lines[-40:])
        assert ps_alive == [True, True], (outcomes[-1], errors)
        assert codes == [0] * workers, (outcomes[-1], errors)
        ranks = rank_summaries(run_dir)
        assert sorted(ranks) == list(range(workers)) and all(r["steps"] == 2 for r in ranks.values())
        assert len({r["dense_digest"] for r in ranks.values()}) == 1  # the ranks trained together
    assert len(outcomes) == RUNS
