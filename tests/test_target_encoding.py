"""Target encoding (``prepare.target_encoding``) and rare ids (``data.min_id_count``) by hand.

The unit tests use literal numbers; the prepare tests recompute every feature from the written
Parquet files with plain Python, and show that no valid / test label reaches a feature.
"""
from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, DataConfig, PrepareConfig
from gmeta_tf.data import target_encoding as te
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.prepare import prepare
from gmeta_tf.data.synth import synth
from gmeta_tf.errors import DataError
from gmeta_tf.metaio import rare_ids

fast = pytest.mark.fast
A, B, C = 7, 8, 9


# ------------------------------------------------------------------ target encoding by hand

@fast
def test_encode_by_hand_leave_one_out_and_unseen():
    # Rows 0-3 are train samples (A=4, A=2, B=5, A=3), rows 4-5 test samples (A, C unseen).
    ids = {"item": np.array([A, A, B, A, A, C])}
    labels = np.array([4.0, 2.0, 5.0, 3.0, 1.0, 5.0], np.float32)
    k = 2.0
    feats, names, (table,) = te.encode(["item"], ids, labels, np.array([0, 1, 2, 3]), k)
    assert names == ["te.item.mean", "te.item.log_count"]
    g = (4 + 2 + 5 + 3) / 4  # train labels only: the test labels 1 and 5 never count
    assert table.global_mean == pytest.approx(g)
    assert table.ids.tolist() == [A, B] and table.sums.tolist() == [9.0, 5.0] and table.counts.tolist() == [3, 1]
    want = [
        ((2 + 3 + k * g) / (2 + k) - g, np.log(3)),  # row 0: A without its own 4
        ((4 + 3 + k * g) / (2 + k) - g, np.log(3)),
        ((0 + k * g) / (0 + k) - g, np.log(1)),       # B's only sample: nothing left, the prior
        ((4 + 2 + k * g) / (2 + k) - g, np.log(3)),
        ((9 + k * g) / (3 + k) - g, np.log(4)),        # test row: the full train statistics
        (0.0, 0.0),                                    # unseen in training
    ]
    np.testing.assert_allclose(feats, np.array(want), rtol=1e-6, atol=1e-7)


@fast
def test_encode_clicks_is_the_shrunk_ctr():
    # Train: A clicked 1 of 3 times, B 1 of 1; the test sample of A sees 1 click in 3, CTR g = 2/4.
    feats, _, _ = te.encode(["item"], {"item": np.array([A, A, A, B, A])}, np.array([1, 0, 0, 1, 1], np.float32),
                            np.array([0, 1, 2, 3]), 1.0)
    g = 0.5
    assert feats[0, 0] == pytest.approx((0 + g) / (2 + 1) - g)  # its own click left out
    assert feats[4, 0] == pytest.approx((1 + g) / (3 + 1) - g) and feats[4, 1] == pytest.approx(np.log(4))


def _hand_features(prep: Path, col: str, k: float):
    """Per split, per sample (support then query, task by task): the two features by hand."""
    rows = {}
    for split in fmt.SPLITS:
        t = pq.read_table(prep / split)
        rows[split] = [(i, y) for w in fmt.SETS
                       for i, y in zip(pc.list_flatten(t[fmt.cat_col(w, col)]).to_pylist(),
                                       pc.list_flatten(t[fmt.label_col(w)]).to_pylist())]
    s, n = defaultdict(float), defaultdict(int)
    for i, y in rows["train"]:
        s[i] += y
        n[i] += 1
    g = sum(y for _, y in rows["train"]) / len(rows["train"])
    out = {}
    for split, samples in rows.items():
        loo = split == "train"
        out[split] = np.array([((s[i] - (y if loo else 0) + k * g) / (n[i] - loo + k) - g, np.log1p(n[i] - loo))
                               for i, y in samples])
    return out


def _written_features(prep: Path, names):
    schema = json.loads((prep / fmt.SCHEMA_FILE).read_text())
    dense = [d["name"] for d in schema["dense"]]
    at = [dense.index(n) for n in names]
    out = {}
    for split in fmt.SPLITS:
        t = pq.read_table(prep / split)
        out[split] = np.concatenate([np.array([x for r in t[fmt.dense_col(w)].to_pylist() for x in r])[:, at]
                                     for w in fmt.SETS])
    return out


PREP = dict(query=4, max_support=12, min_task_size=8, test_frac=0.3, valid_frac=0.2, shards=1,
            target_encoding=["item_id"], target_encoding_prior=3.0)


@pytest.fixture(scope="module")
def synth_raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("te")
    synth(str(root / "raw"), tasks=60, seed=5, kind="rating")
    return root


@fast
def test_prepare_writes_the_hand_computed_features_and_tables(synth_raw, tmp_path):
    prep = tmp_path / "prep"
    prepare([str(synth_raw / "raw")], str(prep), PrepareConfig(**PREP))
    names = te.feature_names("item_id")
    got, want = _written_features(prep, names), _hand_features(prep, "item_id", 3.0)
    for split in fmt.SPLITS:
        np.testing.assert_allclose(got[split], want[split], rtol=1e-5, atol=1e-5, err_msg=split)
    schema = json.loads((prep / fmt.SCHEMA_FILE).read_text())
    assert [d["name"] for d in schema["dense"]][-2:] == names  # after the input's dense columns
    (entry,) = schema["target_encoding"]
    assert entry["column"] == "item_id" and entry["prior"] == 3.0 and entry["features"] == names
    with np.load(prep / entry["file"]) as z:
        t = pq.read_table(prep / "train")
        ids = np.concatenate([pc.list_flatten(t[fmt.cat_col(w, "item_id")]).to_numpy() for w in fmt.SETS])
        u, c = np.unique(ids, return_counts=True)
        assert z["ids"].tolist() == u.tolist() and z["counts"].tolist() == c.tolist()
    # id counts for every id feature, train split only
    with np.load(prep / schema["id_counts"]["item_id"]) as z:
        assert z["ids"].tolist() == u.tolist() and z["counts"].tolist() == c.tolist()
    assert set(schema["id_counts"]) == {c["name"] for c in schema["categorical"] + schema["multi_hot"]}


@fast
def test_valid_and_test_labels_never_reach_a_feature(synth_raw, tmp_path):
    base = tmp_path / "a"
    prepare([str(synth_raw / "raw")], str(base), PrepareConfig(**PREP))
    held_out = np.concatenate([pc.list_flatten(pq.read_table(base / s)[fmt.SAMPLE_INDEX]).to_numpy()
                               for s in ("valid", "test")])
    raw2 = tmp_path / "raw2"
    raw2.mkdir()
    shutil.copy(synth_raw / "raw" / fmt.COLUMNS_SIDECAR, raw2)
    (file,) = sorted((synth_raw / "raw").glob("*.parquet"))
    t = pq.read_table(file)
    y = t["rating"].to_numpy().copy()
    y[held_out] = 5.0 - y[held_out] + 0.5  # every valid / test label changed
    pq.write_table(t.set_column(t.schema.get_field_index("rating"), "rating", pa.array(y, t["rating"].type)), raw2 / file.name)
    other = tmp_path / "b"
    prepare([str(raw2)], str(other), PrepareConfig(**PREP))
    names = te.feature_names("item_id")
    fa, fb = _written_features(base, names), _written_features(other, names)
    for split in fmt.SPLITS:
        np.testing.assert_array_equal(fa[split], fb[split], err_msg=split)
    assert pq.read_table(base / "test")[fmt.label_col("query")] != pq.read_table(other / "test")[fmt.label_col("query")]


@fast
def test_bad_target_encoding_column_names_the_key(synth_raw, tmp_path):
    with pytest.raises(DataError, match=r"prepare\.target_encoding: 'nope' is not a categorical"):
        prepare([str(synth_raw / "raw")], str(tmp_path / "p"), PrepareConfig(**{**PREP, "target_encoding": ["nope"]}))
    assert not (tmp_path / "p").exists()
    with pytest.raises(ConfigError, match="prepare.target_encoding_prior"):
        PrepareConfig(target_encoding_prior=0.0)
    from gmeta_tf.cli.main import cli
    r = CliRunner().invoke(cli, ["data", "prepare", "--input", str(synth_raw / "raw"), "--out", str(tmp_path / "q"),
                                 "--set", "prepare.target_encoding=[user_id]"])
    assert r.exit_code == 2 and "prepare.target_encoding" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------ rare ids by hand

@fast
def test_remap_by_hand():
    frequent = np.array([3, 10, 42], np.int64)
    ids = np.array([[3, 4, fmt.PAD_ID], [42, 0, 10]], np.int64)
    R = fmt.RARE_ID
    assert rare_ids.remap(ids, frequent).tolist() == [[3, R, fmt.PAD_ID], [42, R, 10]]
    assert rare_ids.remap(ids, np.zeros(0, np.int64)).tolist() == [[R, R, fmt.PAD_ID], [R, R, R]]


def _id_counts(root: Path, ids, counts):
    root.mkdir()
    (root / "id_counts").mkdir()
    np.savez(root / "id_counts" / "item.npz", ids=np.array(ids, np.int64), counts=np.array(counts, np.int64))
    return {"categorical": [{"name": "item"}], "multi_hot": [{"name": "tags"}], "id_counts": {"item": "id_counts/item.npz"}}


@fast
def test_frequent_ids_threshold_and_errors(tmp_path):
    schema = _id_counts(tmp_path / "d", [1, 5, 9, 12], [4, 5, 1, 7])
    path = str(tmp_path / "d")
    assert rare_ids.frequent_ids(path, schema, {"item": 5})["item"].tolist() == [5, 12]
    assert rare_ids.frequent_ids(path, schema, {"item": 1})["item"].tolist() == [1, 5, 9, 12]
    with pytest.raises(DataError, match=r"data\.min_id_count: 'nope' is not a categorical or multi-hot"):
        rare_ids.frequent_ids(path, schema, {"nope": 5})
    with pytest.raises(DataError, match=r"data\.min_id_count\.tags: .* re-run 'gmeta data prepare'"):
        rare_ids.frequent_ids(path, schema, {"tags": 5})
    with pytest.raises(ConfigError, match=r"data\.min_id_count\.item"):
        DataConfig(min_id_count={"item": 0})
    clash = _id_counts(tmp_path / "e", [1, fmt.RARE_ID], [9, 9])
    with pytest.raises(DataError, match="RARE_ID"):
        rare_ids.frequent_ids(str(tmp_path / "e"), clash, {"item": 2})
    (tmp_path / "d" / "id_counts" / "item.npz").write_bytes(b"not an npz")  # damaged counts
    with pytest.raises(DataError, match=r"id_counts/item\.npz: cannot read the id counts for data\.min_id_count\.item"):
        rare_ids.frequent_ids(path, schema, {"item": 5})


@fast
def test_reader_pools_rare_ids_and_keeps_raw_ids(synth_raw, tmp_path):
    from gmeta_tf.metaio.reader import make_dataset

    prep = tmp_path / "prep"
    prepare([str(synth_raw / "raw")], str(prep), PrepareConfig(**PREP))
    schema = json.loads((prep / fmt.SCHEMA_FILE).read_text())
    with np.load(prep / schema["id_counts"]["item_id"]) as z:
        counts = dict(zip(z["ids"].tolist(), z["counts"].tolist()))
    k = 3
    c = DataConfig(path=str(prep), tasks_per_batch=4, support=12, query=4, min_id_count={"item_id": k, "item_tags": k})
    n_rare = n_ids = 0
    for batch in make_dataset(str(prep), "test", c, training=False, raw_ids=True):
        for w in fmt.SETS:
            raw, seen = batch[w]["raw_cat"]["item_id"].numpy(), batch[w]["cat"]["item_id"].numpy()
            hand = np.vectorize(lambda x: x if x == fmt.PAD_ID or counts.get(x, 0) >= k else fmt.RARE_ID,
                                otypes=[np.int64])(raw)
            np.testing.assert_array_equal(seen, hand)
            n_rare += int((seen == fmt.RARE_ID).sum())
            n_ids += int((raw >= 0).sum())
            assert not (batch[w]["multi"]["item_tags"].numpy() == fmt.RARE_ID).all()
    assert 0 < n_rare < n_ids  # the threshold actually splits the ids
    # Without the key the reader hands out the real ids and no raw_cat.
    plain = next(iter(make_dataset(str(prep), "test", DataConfig(path=str(prep), tasks_per_batch=4, support=12, query=4),
                                   training=False)))
    assert "raw_cat" not in plain["query"] and not (plain["query"]["cat"]["item_id"].numpy() == fmt.RARE_ID).any()


@pytest.mark.integration
def test_eval_baselines_do_not_change_with_min_id_count(synth_raw, tmp_path):
    from gmeta_tf.cli.main import cli

    prep, run = tmp_path / "prep", tmp_path / "run"
    prepare([str(synth_raw / "raw")], str(prep), PrepareConfig(**PREP))
    runner = CliRunner()
    sets = ["data.tasks_per_batch=4", "data.support=12", "data.query=4", "data.min_id_count.item_id=3",
            "train.log_every=2", "train.checkpoint_every=2"]
    r = runner.invoke(cli, ["train", "--config", "configs/quickstart.yaml", "--data", str(prep), "--out", str(run),
                            "--steps", "2"] + [a for kv in sets for a in ("--set", kv)])
    assert r.exit_code == 0, r.output
    assert load_config(str(run / "config.yaml")).data.min_id_count == {"item_id": 3}
    results = []
    for extra in ([], ["--set", "data.min_id_count={}"]):
        r = runner.invoke(cli, ["eval", "--run", str(run)] + extra)
        assert r.exit_code == 0, r.output
        results.append(json.loads((run / "eval.json").read_text()))
    pooled, real = results
    assert pooled["baselines"] == real["baselines"]
    assert pooled["baseline_setup"]["item_feature"] == "item_id"
    assert pooled["mae"] != real["mae"]  # the model itself does see the pooled ids


@fast
def test_min_id_count_works_without_target_encoding(synth_raw, tmp_path):
    """Id counts are written whatever ``prepare.target_encoding`` says: rare ids are a reader
    choice and must not need target encoding at prepare time."""
    from gmeta_tf.metaio.reader import make_dataset

    prep = tmp_path / "prep"
    prepare([str(synth_raw / "raw")], str(prep), PrepareConfig(**{**PREP, "target_encoding": []}))
    schema = json.loads((prep / fmt.SCHEMA_FILE).read_text())
    assert schema["target_encoding"] == [] and not (prep / te.TE_DIR).exists()
    assert set(schema["id_counts"]) == {c["name"] for c in schema["categorical"] + schema["multi_hot"]}
    c = DataConfig(path=str(prep), tasks_per_batch=4, support=12, query=4, min_id_count={"item_id": 3})
    batch = next(iter(make_dataset(str(prep), "test", c, training=False)))
    assert (batch["query"]["cat"]["item_id"].numpy() == fmt.RARE_ID).any()
