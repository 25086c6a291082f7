"""The synthetic generator: deterministic, production-like shapes, and per-user signal."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.data_cmd import data
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.synth import generate, synth


def test_deterministic_for_a_seed():
    a = generate(40, seed=3)
    b = generate(40, seed=3)
    c = generate(40, seed=4)
    assert a.equals(b)
    assert not a.equals(c)


def test_synth_writes_files_and_sidecar(synth_dir, tmp_path, read_table):
    side = json.loads((synth_dir / fmt.COLUMNS_SIDECAR).read_text())
    assert side["task_col"] == "user_id"
    assert side["label_col"] == "click" and side["label_kind"] == "click"
    assert side["time_col"] == "ts"
    assert side["categorical"] == ["item_id", "item_category", "user_city", "user_segment", "device", "hour"]
    assert side["multi_hot"] == ["item_tags"]
    assert side["dense"] == ["price", "item_age_days", "user_activity"]

    t = read_table(synth_dir)
    assert len(list(synth_dir.glob("samples-*.parquet"))) >= 2  # rows_per_file=5000
    roles = [side["task_col"], side["label_col"], side["time_col"]] + side["categorical"] + side["multi_hot"] + side["dense"]
    assert sorted(t.column_names) == sorted(roles)
    assert t.schema.field("device").type == pa.string()
    assert t.schema.field("item_tags").type == pa.list_(pa.int64())
    assert t.schema.field("ts").type == pa.int64()
    assert t.schema.field("item_id").type == pa.int64()
    assert set(np.unique(t.column("click").to_numpy())) == {0, 1}
    # Same seed through the file writer → identical content.
    again = synth(str(tmp_path / "again"), tasks=200, seed=1, rows_per_file=5000)
    assert read_table(tmp_path / "again").equals(t)
    assert again["rows"] == t.num_rows


def test_item_popularity_is_zipf_like():
    t = generate(400, seed=0, zipf=1.15)
    _, counts = np.unique(t.column("item_id").to_numpy(), return_counts=True)
    counts = np.sort(counts)[::-1]
    rank = np.arange(1, counts.size + 1)
    head = counts >= 5  # the well-estimated part of the rank/frequency curve
    assert head.sum() >= 20
    slope = np.polyfit(np.log(rank[head]), np.log(counts[head]), 1)[0]
    assert -1.35 <= slope <= -0.95, slope


def test_cardinalities_and_task_sizes(synth_dir, read_table):
    t = read_table(synth_dir)
    side = json.loads((synth_dir / fmt.COLUMNS_SIDECAR).read_text())
    distinct = {c: len(set(t.column(c).to_pylist())) for c in side["categorical"]}
    assert distinct["device"] == 10
    assert distinct["hour"] == 24
    assert 150 <= distinct["item_category"] <= 200
    assert side["id_space"]["item_id"] >= 10**5 and side["id_space"]["device"] <= 10
    assert t.column("item_id").to_numpy().max() >= 10**5  # ids really come from a huge space
    assert distinct["item_id"] > 1000
    tags = t.column("item_tags").to_pylist()
    assert min(map(len, tags)) >= 1 and max(map(len, tags)) <= 6
    assert max(max(x) for x in tags) < 5000

    users = t.column("user_id").to_numpy()
    _, sizes = np.unique(users, return_counts=True)
    assert sizes.size == 200
    assert sizes.min() >= 8 and sizes.max() <= 600
    assert sizes.max() / sizes.min() >= 10


def test_time_increases_within_each_user_and_rows_are_a_log(synth_dir, read_table):
    t = read_table(synth_dir)
    users, ts = t.column("user_id").to_numpy(), t.column("ts").to_numpy()
    assert np.all(np.diff(ts) >= 0)  # ordered by time across users, like an event log
    order = np.lexsort((ts, users))
    same_user = users[order][1:] == users[order][:-1]
    assert np.all(np.diff(ts[order])[same_user] > 0)  # strictly increasing within a user


def test_labels_vary_by_user_so_adaptation_matters(synth_dir, read_table):
    t = read_table(synth_dir)
    y = t.column("click").to_numpy().astype(float)
    assert 0.2 <= y.mean() <= 0.5
    users, cats = t.column("user_id").to_numpy(), t.column("item_category").to_numpy()
    # Users disagree about the same category: per (user, category) CTRs of the most common
    # category spread far beyond binomial noise.
    top = np.bincount(cats).argmax()
    m = cats == top
    u_ids, inv = np.unique(users[m], return_inverse=True)
    n = np.bincount(inv)
    ctr = np.bincount(inv, weights=y[m]) / n
    enough = n >= 8
    assert enough.sum() >= 20
    assert (ctr[enough] <= 0.2).mean() > 0.15 and (ctr[enough] >= 0.6).mean() > 0.15
    # Per-user CTRs are heterogeneous (binomial noise alone would give std ≈ 0.07 at n >= 40).
    u_all, inv_all = np.unique(users, return_inverse=True)
    n_all = np.bincount(inv_all)
    user_ctr = np.bincount(inv_all, weights=y) / n_all
    assert user_ctr[n_all >= 40].std() > 0.12


def test_rating_kind():
    t = generate(30, seed=2, kind="rating")
    r = t.column("rating").to_numpy()
    assert set(np.unique(r)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert len(np.unique(r)) == 5
    assert 2.5 <= r.mean() <= 3.5


def test_bad_arguments():
    with pytest.raises(ValueError):
        generate(0)
    with pytest.raises(ValueError):
        generate(5, kind="ctr")


def test_cli_synth(tmp_path):
    out = tmp_path / "raw"
    r = CliRunner().invoke(data, ["synth", "--out", str(out), "--tasks", "20", "--seed", "7", "--kind", "rating"])
    assert r.exit_code == 0, r.output
    assert "tasks (rating" in r.output and "20 tasks" in r.output
    assert json.loads((out / fmt.COLUMNS_SIDECAR).read_text())["label_col"] == "rating"
    again = CliRunner().invoke(data, ["synth", "--out", str(out), "--tasks", "20"])
    assert again.exit_code == 2
    assert again.output.startswith("error: ") and "already exists" in again.output
    assert "Traceback" not in again.output
    ok = CliRunner().invoke(data, ["synth", "--out", str(out), "--tasks", "20", "--overwrite"])
    assert ok.exit_code == 0
    assert json.loads((out / fmt.COLUMNS_SIDECAR).read_text())["label_col"] == "click"
    assert not list(tmp_path.glob("raw.tmp-*")) and not list(tmp_path.glob("raw.old-*"))
