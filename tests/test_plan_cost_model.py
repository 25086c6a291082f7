"""The PS cost model: synthetic skew, access model, shipped default, calibration on a real PS."""
from __future__ import annotations

import json

import numpy as np
import pytest

from gmeta_tf.plan.access import IdSampler, expected_distinct, lookups_per_step
from gmeta_tf.plan.cost_model import REGRESSORS, CostModel, CostModelError, fit_document, load_cost_model, ratio_error
from gmeta_tf.plan.spec import Shard, skew_histogram
from gmeta_tf.plan.synthetic_tables import DIMS, META_SKEW, skew_shares, synthetic_tables


def test_synthetic_tables_match_meta_skew():
    tables = synthetic_tables(120, seed=3)
    shares = skew_shares(np.concatenate([t.counts for t in tables]))
    for key, (rows, lookups) in META_SKEW.items():
        got_rows, got_lookups = shares[key]
        assert got_rows == pytest.approx(rows, rel=0.2), key
        assert got_lookups == pytest.approx(lookups, rel=0.2), key
    # ... and tables differ from each other around those numbers
    once_lookups = [skew_shares(t.counts)["once"][1] for t in tables]
    assert np.std(once_lookups) > 0.005
    stats = [t.stats for t in tables]
    assert {s.dim for s in stats} == set(DIMS)
    assert min(s.rows for s in stats) >= 100 and max(s.rows for s in stats) <= 10**7
    assert max(s.rows for s in stats) > 10**6 and min(s.rows for s in stats) < 10**3
    assert min(s.pooling for s in stats) >= 1.0 and max(s.pooling for s in stats) > 10
    for t in tables[:5]:
        assert t.stats.skew == skew_histogram(t.counts)


def test_expected_distinct_matches_sampled_ids():
    for t in synthetic_tables(6, seed=5):
        s = t.stats
        n = lookups_per_step(s.pooling, 512)
        ids = IdSampler(s.rows, s.skew, seed=1).draw(n)
        assert ids.min() >= 0
        assert len(np.unique(ids)) == pytest.approx(expected_distinct(s.rows, s.skew, n), rel=0.1)
        assert expected_distinct(s.rows, s.skew, n) <= min(s.rows, n) + 1e-9


def _shard(name, rows=100_000, dim=32, pooling=4.0, seed=0):
    skew = synthetic_tables(1, seed=seed)[0].stats.skew
    return Shard(name, "table", 0, 1, rows, dim, pooling, skew)


def test_default_model_loads_and_predicts_sensible_costs():
    model = load_cost_model(None)
    assert model.algo in REGRESSORS
    assert 0.0 < model.error < 1.0
    a, b = _shard("a"), _shard("b", dim=64, pooling=10.0, seed=1)
    assert model.ps_cost([], 512) == 0.0
    one, two = model.ps_cost([a], 512), model.ps_cost([a, b], 512)
    assert one > 0.0 and two > one  # another table never makes a PS cheaper
    assert model.ps_cost([_shard("a", pooling=20.0)], 512) >= one  # more lookups
    assert model.ps_cost([_shard("a", dim=128)], 512) >= one  # wider rows
    assert model.ps_cost([a], 1024) >= one  # more samples per step
    ten = [_shard(f"t{i}", seed=i) for i in range(10)]
    assert model.ps_cost(ten, 512) > model.ps_cost(ten[:5], 512)
    assert model.ps_costs([[a], [a, b], []], 512) == pytest.approx([one, two, 0.0])


def test_cost_model_file_errors_name_the_file(tmp_path):
    with pytest.raises(CostModelError, match="nope.json"):
        load_cost_model(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelError, match="bad.json: not JSON"):
        load_cost_model(str(bad))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"version": 0, "algo": "linear", "rows": []}))
    with pytest.raises(CostModelError, match="re-run 'gmeta plan calibrate'"):
        load_cost_model(str(old))


def test_fit_recovers_an_additive_cost_and_reports_its_error():
    rng = np.random.default_rng(0)
    rows = []
    for g in range(30):
        terms = [[float(rng.integers(100, 20000)), 0.0, float(rng.choice(DIMS)), 1e5] for _ in range(rng.integers(1, 20))]
        for t in terms:
            t[1] = t[0] * 0.4
        ms = 2.0 + 1.5 * len(terms) + sum(t[1] * t[2] for t in terms) * 2e-5
        rows.append({"group": g, "samples_per_step": 512, "ms": ms, "terms": terms})
    doc = fit_document(rows, algos=("linear",))
    assert doc["algo"] == "linear"
    assert doc["held_out_error"] < 0.01
    model = CostModel(json.loads(json.dumps(doc)))
    assert model.predict_terms([rows[0]["terms"]])[0] == pytest.approx(rows[0]["ms"], rel=0.01)
    assert ratio_error(np.array([1.1, 0.9]), np.array([1.0, 1.0])) == pytest.approx(np.sqrt(1.1 / 0.9) - 1)


@pytest.mark.integration  # starts a real PS
def test_calibration_on_a_real_ps_gives_a_fittable_model(tmp_path, monkeypatch):
    from gmeta_tf.calibration.calibrate import Settings, calibrate
    from gmeta_tf.plan.cost_model import save_model
    from tests.cluster_helpers import LAUNCH_ID_ENV, processes_with_env

    monkeypatch.setenv(LAUNCH_ID_ENV, "calib-test-ok")
    tiny = Settings(configs=3, variants=2, max_tables=3, warmup=1, steps=2)
    doc = calibrate(1, settings=tiny, seed=1, log=lambda m: None)
    assert processes_with_env(LAUNCH_ID_ENV, "calib-test-ok") == []  # PS and client are gone
    assert len(doc["rows"]) == 6
    assert all(r["ms"] > 0 and r["wall_ms"] > 0 and 1 <= len(r["shards"]) <= 3 for r in doc["rows"])
    assert doc["cost"] == "ps_cpu_ms"
    assert doc["calibration"]["sets"] == 6 and np.isfinite(doc["held_out_error"])
    path = tmp_path / "model.json"
    save_model(doc, str(path))
    model = load_cost_model(str(path))
    assert model.ps_cost([_shard("a")], 512) > 0


@pytest.mark.integration  # starts a real PS
def test_a_failing_microbenchmark_is_one_error_and_leaves_no_process(monkeypatch):
    from gmeta_tf.calibration.calibrate import CalibrationError, _run_chunk
    from tests.cluster_helpers import LAUNCH_ID_ENV, processes_with_env

    monkeypatch.setenv(LAUNCH_ID_ENV, "calib-test-fail")
    config = {"dims": [8], "variants": [{"index": 0, "samples_per_step": 8, "shards": [
        {"rows": 10, "pooling": 1.0, "skew": [1.0] + [0.0] * 16}]}]}
    # The client cannot even import TensorFlow in 1 s: it is killed, with the PS.
    with pytest.raises(CalibrationError, match="timed out after 1 s"):
        _run_chunk([config], warmup=1, steps=1, timeout_s=1.0, log=lambda m: None)
    assert processes_with_env(LAUNCH_ID_ENV, "calib-test-fail") == []


def _numpy_features(terms):
    """``set_features`` as numpy computes it (what the plain-Python and batched versions must equal)."""
    t = np.asarray(terms, dtype=np.float64)
    n, u, d, r = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    return {"count": float(len(t)), "groups": float(len(np.unique(d))), "sum_n": float(n.sum()),
            "sum_u": float(u.sum()), "sum_ud_logr": float((u * d * np.log2(np.maximum(r, 2.0))).sum()),
            "sum_ud": float((u * d).sum()), "sum_nd": float((n * d).sum()), "sum_d": float(d.sum()),
            "max_ud": float((u * d).max()), "max_n": float(n.max())}


def test_shard_set_features_equal_numpys_to_the_last_bit():
    """The search's fast features (plain Python, and batched by set size) must be numpy's
    floats exactly: a last-bit difference can reorder moves and change a plan."""
    from gmeta_tf.plan.cost_model import TREE_FEATURES, ShardColumns, pairwise_sum, set_features, shard_terms

    rng = np.random.default_rng(4)
    tables = synthetic_tables(40, seed=9)
    pool = [shard_terms(t.stats.rows // k, t.stats.dim, t.stats.pooling / k, t.stats.skew, 512)
            for t in tables for k in (1, 3)]
    cols = ShardColumns()
    for i, terms in enumerate(pool):
        cols.put(i, terms)
    sets = [list(rng.integers(len(pool), size=k)) for k in (0, 1, 2, 7, 8, 9, 16, 23, 64, 129, 150) for _ in range(3)]
    want = [[_numpy_features([pool[i] for i in s])[f] if s else 0.0 for f in TREE_FEATURES] for s in sets]
    assert cols.matrix(sets, TREE_FEATURES).tolist() == want
    assert [[set_features([pool[i] for i in s])[f] for f in TREE_FEATURES] for s in sets if s] == [w for w, s in zip(want, sets) if s]
    x = rng.uniform(0, 1e6, 300) * 10.0 ** rng.integers(-6, 6, 300)
    assert all(pairwise_sum(list(x[:k])) == float(x[:k].sum()) for k in range(301))


@pytest.mark.integration  # a real PS and client on two emulated hosts
@pytest.mark.skipif(__import__("launch.network.netns", fromlist=["x"]).missing_privilege() is not None,
                    reason="emulated network: needs root or CAP_NET_ADMIN")
def test_calibration_on_emulated_links_measures_across_them(monkeypatch):
    """``gmeta plan calibrate --network``'s path: the PS on one emulated host, the client on
    another, every request crossing a 1 Mbit/s link. Whatever else travels, each step sends the
    PS its 1,024 int64 ids (8 kB: 66 ms at 1 Mbit/s), so the client's step takes at least that
    (on loopback: ~6 ms). How much the link changes what is fitted, the PS's CPU, is the
    ``sharding_network`` bench's question (bench/sharding/calibrate_links.py)."""
    from gmeta_tf.calibration.calibrate import COST, measure_configs
    from tests.cluster_helpers import LAUNCH_ID_ENV, processes_with_env

    monkeypatch.setenv(LAUNCH_ID_ENV, "calib-test-links")
    shard = {"rows": 5000, "pooling": 4.0, "skew": [1.0] + [0.0] * 16}
    config = {"dims": [16], "variants": [{"index": 0, "samples_per_step": 256, "seed": 0, "shards": [shard]}]}
    links = measure_configs([config], 1, 3, log=lambda m: None, network="rate=1mbit")[0]
    assert processes_with_env(LAUNCH_ID_ENV, "calib-test-links") == []  # PS and client are gone
    ids_ms = 1024 * 8 * 8 / 1e6 * 1000
    assert links["wall_ms"] > 0.6 * ids_ms, links
    assert links[COST] > 0


def test_calibrate_cli_names_a_bad_network_profile():
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli

    r = CliRunner().invoke(cli, ["plan", "calibrate", "--quick", "--network", "rate=20mbps"])
    assert r.exit_code != 0 and "20mbps" in r.output and "Traceback" not in r.output
