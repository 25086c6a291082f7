"""Baselines and the ranking view of ``gmeta eval``, checked against hand computations.

The unit tests use tiny literal data sets (numbers written out below, so the expected values
can be recomputed on paper); the end-to-end tests run ``gmeta train`` + ``gmeta eval`` on small
prepared data and recompute every baseline from the Parquet files with plain Python.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.evaluation import baselines, ranking
from gmeta_tf.evaluation.baselines import TaskItems
from gmeta_tf.evaluation.report import format_table

fast = pytest.mark.fast

A, B, C, D, E = 11, 22, 33, 44, 55  # item ids

# Training tasks, literally: (support [(item, label)], query [(item, label)]).
RATING_TRAIN = [
    ([(A, 5.0), (B, 3.0)], [(A, 4.0)]),
    ([(A, 4.0)], [(C, 2.0), (B, 1.0)]),
    ([(B, 2.0)], [(A, 3.0)]),
]
# By hand: A = 5+4+4+3 = 16 over 4, B = 3+1+2 = 6 over 3, C = 2 over 1; 8 samples summing to 24.
G = 24 / 8


def _write_prepared(root: Path, tasks, kind: str = "rating", item: str = "item") -> Path:
    """A minimal prepared directory (schema.json + one train part file) holding ``tasks``."""
    (root / "train").mkdir(parents=True)
    schema = {"format_version": 1, "label": {"name": "y", "kind": kind},
              "categorical": [{"name": item, "cardinality": 100, "hashed": False, "pooling": 1.0}],
              "multi_hot": [], "dense": []}
    (root / fmt.SCHEMA_FILE).write_text(json.dumps(schema))
    cols = {fmt.TASK_ID: [f"u{i}" for i in range(len(tasks))],
            fmt.N_SUPPORT: pa.array([len(s) for s, _ in tasks], pa.int32()),
            fmt.N_QUERY: pa.array([len(q) for _, q in tasks], pa.int32())}
    for which, pos in (("support", 0), ("query", 1)):
        cols[fmt.label_col(which)] = pa.array([[y for _, y in t[pos]] for t in tasks], pa.list_(pa.float32()))
        cols[fmt.cat_col(which, item)] = pa.array([[i for i, _ in t[pos]] for t in tasks], pa.list_(pa.int64()))
    pq.write_table(pa.table(cols), root / "train" / fmt.part_name(0, 1))
    return root


@pytest.fixture
def rating_stats(tmp_path):
    root = _write_prepared(tmp_path / "prep", RATING_TRAIN)
    schema = json.loads((root / fmt.SCHEMA_FILE).read_text())
    return baselines.train_item_stats(str(root), schema, "item")


# ------------------------------------------------------------------ baselines by hand

@fast
def test_train_statistics_by_hand(rating_stats):
    s = rating_stats
    assert s.samples == 8 and s.global_mean == pytest.approx(G)
    assert s.ids.tolist() == [A, B, C] and s.sums.tolist() == [16.0, 6.0, 2.0] and s.counts.tolist() == [4, 3, 1]


@fast
def test_rating_baselines_by_hand(rating_stats):
    # A cold user: support A=5 and D=4 (D never seen in training); query A, B, D, E.
    task = TaskItems(np.array([A, D]), np.array([5.0, 4.0]), np.array([A, B, D, E]))
    k, k_user = 2.0, 1.0
    item_a, item_b = (16 + k * G) / (4 + k), (6 + k * G) / (3 + k)  # shrunk toward G
    bias = ((5 - item_a) + (4 - G)) / (2 + k_user)                 # D is unseen: baseline G
    got = baselines.predict("rating", rating_stats, [task], k, k_user)
    assert set(got) == {"global_mean", "item_mean", "item_mean_user_bias"}
    np.testing.assert_allclose(got["global_mean"][0], [G, G, G, G])
    np.testing.assert_allclose(got["item_mean"][0], [item_a, item_b, G, G])
    np.testing.assert_allclose(got["item_mean_user_bias"][0], [item_a + bias, item_b + bias, G + bias, G + bias])
    # A user without support samples gets no bias.
    empty = TaskItems(np.array([], np.int64), np.array([]), np.array([C]))
    np.testing.assert_allclose(baselines.predict("rating", rating_stats, [empty], k, k_user)["item_mean_user_bias"][0],
                               [(2 + k * G) / (1 + k)])


@fast
def test_shrinkage_pulls_a_one_rating_item_toward_the_global_mean(rating_stats):
    # C has one rating (2.0). With k pseudo-ratings at G its mean is G + (2 - G) / (1 + k).
    for k, expected in ((0.0, 2.0), (1.0, (2 + G) / 2), (10.0, G + (2 - G) / 11)):
        assert rating_stats.item_means(np.array([C]), k)[0] == pytest.approx(expected)
    # The pull from its own rating is (G - 2) * k / (1 + k): with k = 10, 10/11 of the way to G.
    pulled = rating_stats.item_means(np.array([C]), 10.0)[0] - 2.0
    assert pulled == pytest.approx((G - 2.0) * 10 / 11)
    # A frequent item moves less than a rare one for the same k.
    assert abs(rating_stats.item_means(np.array([A]), 10.0)[0] - 4.0) < abs(
        rating_stats.item_means(np.array([C]), 10.0)[0] - 2.0)


@fast
def test_click_baselines_by_hand(tmp_path):
    train = [([(A, 1.0), (B, 0.0)], [(A, 1.0)]),
             ([(A, 0.0)], [(B, 0.0), (C, 1.0)]),
             ([(B, 0.0), (B, 0.0)], [(A, 1.0)])]
    root = _write_prepared(tmp_path / "prep", train, kind="click")
    stats = baselines.train_item_stats(str(root), json.loads((root / fmt.SCHEMA_FILE).read_text()), "item")
    # A: labels 1, 1, 0, 1 (4 samples, 3 clicks); B: 0, 0, 0, 0 (4, 0); C: 1 (1, 1). 9 samples, 4 clicks.
    g = 4 / 9
    assert stats.global_mean == pytest.approx(g)
    k, k_user = 1.0, 2.0
    ctr_a, ctr_b, ctr_c = (3 + k * g) / 5, (0 + k * g) / 5, (1 + k * g) / 2
    task = TaskItems(np.array([A, B]), np.array([1.0, 1.0]), np.array([A, B, C, D]))
    got = baselines.predict("click", stats, [task], k, k_user)
    assert set(got) == {"global_ctr", "item_ctr", "item_ctr_user_bias"}
    np.testing.assert_allclose(got["item_ctr"][0], [ctr_a, ctr_b, ctr_c, g])
    r = ((1 - ctr_a) + (1 - ctr_b)) / (2 + k_user)
    p_bar = (ctr_a + ctr_b) / 2

    def logit(p):
        return math.log(p / (1 - p))

    shift = logit(p_bar + r) - logit(p_bar)
    expected = [1 / (1 + math.exp(-(logit(p) + shift))) for p in (ctr_a, ctr_b, ctr_c, g)]
    np.testing.assert_allclose(got["item_ctr_user_bias"][0], expected)
    assert all(0 < p < 1 for p in got["item_ctr_user_bias"][0]) and shift > 0  # two clicks: a keener user


@fast
def test_item_feature_choice_and_errors(tmp_path):
    schema = {"categorical": [{"name": "movie"}, {"name": "year"}]}
    assert baselines.item_feature(schema, None, "/d") == "movie"
    assert baselines.item_feature(schema, "year", "/d") == "year"
    assert baselines.item_feature({"categorical": []}, None, "/d") is None
    with pytest.raises(DataError, match=r"eval\.item_feature.*'genre'.*movie, year"):
        baselines.item_feature(schema, "genre", "/d")
    for key, value in (("baseline_shrinkage", "-1"), ("baseline_user_shrinkage", "-0.5"),
                       ("relevance_threshold", "nan")):
        with pytest.raises(ConfigError, match=f"eval.{key}"):
            load_config("configs/quickstart.yaml", [f"eval.{key}={value}"])


# ------------------------------------------------------------------ ranking by hand

def d(p):
    return 1 / math.log2(p + 1)


@fast
def test_ranking_without_ties_by_hand():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    rel = np.array([1, 0, 1, 0, 0, 1], bool)
    hits, dcg = ranking.expected_hits_dcg(scores, rel)
    assert hits == pytest.approx(2) and dcg == pytest.approx(d(1) + d(3))
    assert ranking.ideal_dcg(3) == pytest.approx(d(1) + d(2) + d(3))
    assert ranking.ideal_dcg(7) == pytest.approx(sum(d(p) for p in range(1, 6)))  # capped at 5


@fast
def test_ranking_tie_spanning_the_cut_off_by_hand():
    # Positions 1 and 2 are certain; the 4-way tie holds positions 3..6, of which 3 are in the top 5.
    scores = np.array([5, 4, 3, 3, 3, 3, 1.0])
    rel = np.array([0, 1, 1, 0, 0, 0, 1], bool)
    hits, dcg = ranking.expected_hits_dcg(scores, rel)
    assert hits == pytest.approx(1 + 3 / 4)
    assert dcg == pytest.approx(d(2) + (d(3) + d(4) + d(5) + 0) / 4)
    # The answer does not depend on the order of the items.
    for seed in range(5):
        perm = np.random.default_rng(seed).permutation(scores.size)
        assert ranking.expected_hits_dcg(scores[perm], rel[perm]) == pytest.approx((hits, dcg))


@fast
def test_ranking_all_tied_is_the_random_expectation():
    rel = np.array([1, 0, 0, 1, 0, 0, 0, 0], bool)  # 2 of 8 relevant, every score equal
    hits, dcg = ranking.expected_hits_dcg(np.full(8, 3.5), rel)
    assert hits == pytest.approx(2 * 5 / 8)
    assert dcg == pytest.approx(2 * sum(d(p) for p in range(1, 6)) / 8)


@fast
def test_p_and_ndcg_over_users_by_hand():
    labels = [np.array([5, 3, 4, 2, 1, 4.5]),   # relevant (>= 4): items 0, 2, 5
              np.array([3, 2, 1.0]),            # no relevant item
              np.array([4, 1, 3.5])]            # 3 items: P@5 divides by 3
    scores = [np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]),
              np.array([1, 2, 3.0]),
              np.array([2, 2, 2.0])]            # all tied: item 0 lands anywhere in 1..3
    got = ranking.ranking_metrics("rating", labels, scores, 4.0)
    p = [2 / 5, 0 / 3, (1 * 3 / 3) / 3]
    ndcg = [(d(1) + d(3)) / (d(1) + d(2) + d(3)), ((d(1) + d(2) + d(3)) / 3) / d(1)]  # user 2 excluded
    assert got == pytest.approx({"p_at_5": sum(p) / 3, "ndcg_at_5": sum(ndcg) / 2})
    assert ranking.relevance_summary("rating", labels, 4.0) == {
        "k": 5, "relevance": "rating >= 4", "users": 3, "ndcg_users": 2}
    # Clicks: label 1 is relevant, whatever the threshold.
    assert ranking.relevant("click", np.array([1, 0, 1.0]), 4.0).tolist() == [True, False, True]


@fast
def test_table_shows_baselines_once_per_split():
    base = {"baselines": {"item_mean": {"mae": 0.7, "rmse": 0.9, "p_at_5": 0.5, "ndcg_at_5": 0.6}}}
    maml = {"algo": "maml", "split": "test", "tasks": 10, "mae": 0.6, "rmse": 0.8, "p_at_5": 0.55, **base}
    erm = {"algo": "erm", "split": "test", "tasks": 10, "mae": 0.65, "rmse": 0.85, **base}
    lines = format_table([maml, erm]).splitlines()
    assert lines[0].split() == ["metric", "maml", "(test)", "erm", "(test)", "item_mean", "(test)"]
    row = {ln.split()[0]: ln.split()[1:] for ln in lines[1:]}
    assert row["mae"] == ["0.6000", "0.6500", "0.7000"] and row["p_at_5"] == ["0.5500", "-", "0.5000"]
    assert row["tasks"] == ["10", "10", "10"]


# ------------------------------------------------------------------ end to end

def _read_sets(data: Path, split: str, item: str):
    """Per task, from the Parquet files: (support [(item, label)], query [(item, label)])."""
    tasks = []
    for f in sorted((data / split).glob("*.parquet")):
        t = pq.read_table(f).to_pylist()
        for row in t:
            tasks.append(tuple(list(zip(row[fmt.cat_col(w, item)], row[fmt.label_col(w)])) for w in fmt.SETS))
    return tasks


def _hand_baselines(data: Path, kind: str, item: str, S: int, Q: int, k: float, k_user: float):
    """Every baseline's query predictions and labels, with dicts and loops only."""
    n, s = defaultdict(int), defaultdict(float)
    for sup, qry in _read_sets(data, "train", item):
        for i, y in sup + qry:
            n[i] += 1
            s[i] += y
    g = sum(s.values()) / sum(n.values())

    def base(i):
        return (s[i] + k * g) / (n[i] + k) if n[i] else g

    def logit(p):
        p = min(max(p, 1e-6), 1 - 1e-6)
        return math.log(p / (1 - p))

    out = defaultdict(list)
    labels = []
    for sup, qry in _read_sets(data, "test", item):
        sup, qry = sup[-S:], qry[:Q]  # what the reader keeps: the last S support, the first Q query
        labels.append([y for _, y in qry])
        r = sum(y - base(i) for i, y in sup) / (len(sup) + k_user)
        if kind == "click":
            p_bar = sum(base(i) for i, _ in sup) / len(sup)
            shift = logit(p_bar + r) - logit(p_bar)
            names = ("global_ctr", "item_ctr", "item_ctr_user_bias")
            user = [1 / (1 + math.exp(-(logit(base(i)) + shift))) for i, _ in qry]
        else:
            names = ("global_mean", "item_mean", "item_mean_user_bias")
            user = [base(i) + r for i, _ in qry]
        out[names[0]].append([g] * len(qry))
        out[names[1]].append([base(i) for i, _ in qry])
        out[names[2]].append(user)
    return labels, out


@pytest.fixture(scope="module")
def prepared(prepared_kinds):
    return prepared_kinds


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["rating", "click"])
def test_cli_eval_writes_baselines_equal_to_a_hand_computation(prepared, tmp_path, kind):
    from gmeta_tf.cli.main import cli

    data, run = prepared[kind], tmp_path / "run"
    # Support 8 < max_support 12: the baselines must see the reader's truncated support, like the model.
    sets = ["data.tasks_per_batch=8", "data.support=8", "data.query=6", "train.log_every=2",
            "train.checkpoint_every=2", "eval.baseline_shrinkage=3", "eval.baseline_user_shrinkage=2"]
    runner = CliRunner()
    args = ["train", "--config", "configs/quickstart.yaml", "--data", str(data), "--out", str(run), "--steps", "2"]
    r = runner.invoke(cli, args + [a for kv in sets for a in ("--set", kv)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["eval", "--run", str(run)])
    assert r.exit_code == 0, r.output
    result = json.loads((run / "eval.json").read_text())

    item = json.loads((data / fmt.SCHEMA_FILE).read_text())["categorical"][0]["name"]
    assert result["baseline_setup"]["item_feature"] == item == "item_id"
    labels, preds = _hand_baselines(data, kind, item, S=8, Q=6, k=3.0, k_user=2.0)
    assert result["tasks"] == len(labels) > 20
    ys = [np.array(y) for y in labels]
    for name, p in preds.items():
        got = result["baselines"][name]
        flat_p, flat_y = np.concatenate(p), np.concatenate(ys)
        if kind == "rating":
            assert got["mae"] == pytest.approx(np.mean(np.abs(flat_p - flat_y)), rel=1e-9), name
            assert got["rmse"] == pytest.approx(np.sqrt(np.mean((flat_p - flat_y) ** 2)), rel=1e-9), name
        else:
            ll = -np.mean(flat_y * np.log(flat_p) + (1 - flat_y) * np.log(1 - flat_p))
            assert got["logloss"] == pytest.approx(ll, rel=1e-6), name
        expect = ranking.ranking_metrics(kind, ys, [np.array(x) for x in p], 4.0)
        assert got["p_at_5"] == pytest.approx(expect["p_at_5"]) and got["ndcg_at_5"] == pytest.approx(expect["ndcg_at_5"])
    # The model gets the same ranking keys, adapted and not, and the table shows the baselines.
    for key in ("p_at_5", "ndcg_at_5", "p_at_5_no_adapt", "ndcg_at_5_no_adapt"):
        assert 0.0 <= result[key] <= 1.0
    assert result["ranking"]["users"] == len(labels)
    assert all(name in r.output for name in preds) and "p_at_5" in r.output

    # A misnamed item feature fails with one line naming the key, and leaves eval.json alone.
    before = (run / "eval.json").read_text()
    r = runner.invoke(cli, ["eval", "--run", str(run), "--set", "eval.item_feature=nope"])
    assert r.exit_code == 2 and "eval.item_feature" in r.output and "Traceback" not in r.output
    assert (run / "eval.json").read_text() == before


@fast
@pytest.mark.parametrize("damage", ["truncated", "no item column"])
def test_an_unreadable_train_file_is_named(tmp_path, damage):
    """A train part the baselines cannot read (cut short, or without the item column) is a
    ``DataError`` naming that file, not a pyarrow trace; the statistics are read in batches."""
    from gmeta_tf.errors import DataError

    root = _write_prepared(tmp_path / "prep", RATING_TRAIN)
    part = root / "train" / fmt.part_name(0, 1)
    if damage == "truncated":
        part.write_bytes(part.read_bytes()[:-20])
    item = "item" if damage == "truncated" else "genre"
    why = "" if damage == "truncated" else ": no column 'support.cat.genre'"
    with pytest.raises(DataError, match=f"{part}: cannot read the train split's labels for the baselines{why}"):
        baselines.train_item_stats(str(root), json.loads((root / fmt.SCHEMA_FILE).read_text()), item)
