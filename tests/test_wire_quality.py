"""bench/wire_quality.py's summary on made-up per-user scores: each option against ``exact``
paired over the same users, the verdict read with the metric's direction, and the issue's rule
(a default only where the interval contains 0 or favours the option). The trainings themselves
run in ``make bench`` (section ``wire_quality``)."""
import numpy as np
import pytest

from bench.wire_quality import DATASETS, format_table, may_default, summarize
from gmeta_tf.evaluation.paired import Bootstrap
from gmeta_tf.evaluation.per_task import TaskScores

USERS = 200
BOOT = Bootstrap(resamples=500)


def _scores(metric, per_user, ids=None):
    """One scorer ``model`` whose pooled ``metric`` is the mean of ``per_user`` (den 1 each)."""
    ids = ids if ids is not None else [f"u{i}" for i in range(USERS)]
    kind = "click" if metric == "auc" else "rating"
    t = TaskScores(kind, list(ids), {"split": "valid", "support": 16, "query": 16},
                   {"query_size": np.full(len(ids), 16.0)})
    t.scorers = {"model": {metric: (np.asarray(per_user, np.float64), np.ones(len(ids)))}}
    t.roles = {"model": "model"}
    return t


def test_auc_options_read_better_worse_and_cant_tell():
    rng = np.random.default_rng(0)
    exact = rng.uniform(0.6, 0.8, USERS)
    scores = {"exact": _scores("auc", exact),
              "bf16": _scores("auc", exact + rng.normal(0, 0.01, USERS)),  # noise around 0
              "stale": _scores("auc", exact - 0.02 + rng.normal(0, 0.005, USERS)),  # clearly lower AUC
              "lean": _scores("auc", exact + 0.02 + rng.normal(0, 0.005, USERS)),  # clearly higher
              "exact_repeat": _scores("auc", exact + rng.normal(0, 0.002, USERS)),
              "exact_seed1": _scores("auc", exact - 0.02 + rng.normal(0, 0.005, USERS))}
    out = summarize("auc", "model", scores, BOOT)
    assert out["exact"] == {"value": pytest.approx(exact.mean()), "users": USERS}
    assert out["bf16"]["verdict"] == "can't tell" and out["bf16"]["low"] < 0 < out["bf16"]["high"]
    assert out["bf16"]["may_default"] is True
    assert out["stale"]["verdict"] == "worse" and out["stale"]["may_default"] is False
    assert out["stale"]["diff"] == pytest.approx(-0.02, abs=0.003) and out["stale"]["high"] < 0
    assert out["lean"]["verdict"] == "better" and out["lean"]["may_default"] is True
    # the noise floor: an interval, no verdict or rule (it is not an option)
    assert set(out["exact_repeat"]) == {"value", "diff", "low", "high"}
    assert out["exact_repeat"]["low"] <= out["exact_repeat"]["diff"] <= out["exact_repeat"]["high"]
    assert set(out["exact_seed1"]) == {"value", "diff", "low", "high"} and out["exact_seed1"]["high"] < 0


def test_mae_reads_a_higher_error_as_worse():
    rng = np.random.default_rng(1)
    exact = rng.uniform(0.5, 1.0, USERS)
    out = summarize("mae", "model", {"exact": _scores("mae", exact),
                                     "bf16": _scores("mae", exact + 0.03 + rng.normal(0, 0.005, USERS)),
                                     "stale": _scores("mae", exact - 0.03 + rng.normal(0, 0.005, USERS))}, BOOT)
    assert out["bf16"]["diff"] > 0 and out["bf16"]["verdict"] == "worse" and not out["bf16"]["may_default"]
    assert out["stale"]["diff"] < 0 and out["stale"]["verdict"] == "better" and out["stale"]["may_default"]
    assert "lean" not in out and "exact_repeat" not in out and "exact_seed1" not in out  # only the runs present


def test_users_pair_by_id_not_by_position():
    rng = np.random.default_rng(2)
    exact = rng.uniform(0.6, 0.8, USERS)
    ids = [f"u{i}" for i in range(USERS)]
    order = rng.permutation(USERS)
    # the same per-user values, read in another order: a difference of exactly 0
    shuffled = _scores("auc", exact[order], [ids[i] for i in order])
    out = summarize("auc", "model", {"exact": _scores("auc", exact, ids), "bf16": shuffled}, BOOT)
    assert out["bf16"]["diff"] == pytest.approx(0.0, abs=1e-12)
    assert out["bf16"]["low"] == pytest.approx(0.0, abs=1e-12) and out["bf16"]["high"] == pytest.approx(0.0, abs=1e-12)
    other_users = _scores("auc", exact, [f"v{i}" for i in range(USERS)])
    with pytest.raises(ValueError, match="not the same users"):
        summarize("auc", "model", {"exact": _scores("auc", exact, ids), "bf16": other_users}, BOOT)


def test_rule_and_table():
    assert may_default("can't tell") and may_default("better") and not may_default("worse")
    rng = np.random.default_rng(3)
    exact = rng.uniform(0.6, 0.8, USERS)
    res = summarize("auc", "model", {"exact": _scores("auc", exact),
                                     "stale": _scores("auc", exact - 0.02 + rng.normal(0, 0.005, USERS))}, BOOT)
    table = format_table({"synthetic": res}, DATASETS)
    assert f"| synthetic (auc, {USERS} users) | exact |" in table
    stale = next(line for line in table.splitlines() if "| stale |" in line)
    assert "| worse | no |" in stale and "-0.02" in stale
    assert "movielens" not in table  # a dataset without results has no rows


def test_pick_names_datasets_or_refuses():
    from bench.wire_quality import pick

    assert [d.name for d in pick(None)] == [d.name for d in DATASETS]
    assert [d.name for d in pick("movielens")] == ["movielens"]
    with pytest.raises(ValueError, match="unknown wire_quality dataset"):
        pick("movielens,imagenet")


def test_every_run_has_its_settings():
    from bench.wire_quality import FLOORS, OPTIONS, run_sets
    from gmeta_tf.config.loader import load_config

    # exact is float32 on the wire whatever the default is (bfloat16 since issue 41)
    assert run_sets("exact") == run_sets("exact_repeat") == ["cluster.wire_dtype=float32"]
    assert load_config(None, run_sets("exact")).cluster.wire_dtype == "float32"
    hot = ["hot.budget=2MiB"]  # the datasets' own settings hold a hot tier
    lean, stale = load_config(None, [*hot, *run_sets("lean")]), load_config(None, [*hot, *run_sets("stale")])
    assert (lean.cluster.wire_dtype, lean.model.hot_sync_every, lean.cluster.dense_compression) == ("bfloat16", 4, "int8")
    int8 = load_config(None, [*hot, *run_sets("int8")]).cluster
    assert (int8.wire_dtype, int8.dense_compression) == ("float32", "int8")  # the option alone
    assert (stale.cluster.wire_dtype, stale.model.hot_sync_every) == ("float32", 4)
    assert "model.seed=1" in run_sets("exact_seed1")
    assert set(OPTIONS) | set(FLOORS) == {"exact", "bf16", "stale", "int8", "lean", "exact_repeat", "exact_seed1"}


def test_make_bench_runs_the_guard_only_when_named():
    """``make bench`` (no section named) keeps within its 45 minutes: the guard's ten minutes of
    2-worker trainings run when asked for, ``python -m bench.run wire_quality``."""
    from bench.run import SECTIONS, default_sections

    assert "wire_quality" in SECTIONS and "wire_quality" not in default_sections()
    assert "network" in default_sections() and "faults" in default_sections()
