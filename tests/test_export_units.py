"""Units of ``gmeta_tf.export``: reading table files, and the stock-TF static table."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.errors import CheckpointError
from gmeta_tf.export.checkpoint_reader import read_table
from gmeta_tf.export.static_table import StaticTable


def _write(path, keys, values):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, keys=np.asarray(keys, np.int64), values=np.asarray(values, np.float32))


def test_read_table_whole_and_joined_from_column_blocks(tmp_path):
    rng = np.random.default_rng(0)
    keys = np.array([5, 1, 9, 4], np.int64)
    rows = rng.normal(size=(4, 6)).astype(np.float32)
    _write(tmp_path / "whole" / "tables" / "item.npz", keys, rows)
    got_keys, got_rows = read_table(str(tmp_path / "whole"), "item")
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_rows, rows)

    # The planner's column split: two blocks of dim 3, each exported in its own key order,
    # next to their optimizer slots (which the export never reads).
    split = tmp_path / "split" / "tables"
    for i, order in enumerate([[2, 0, 3, 1], [1, 3, 0, 2]]):
        _write(split / f"item.c{i}of2.npz", keys[order], rows[order][:, 3 * i:3 * i + 3])
        _write(split / f"item.c{i}of2.m.npz", keys[order], np.full((4, 3), 7.0))
    got_keys, got_rows = read_table(str(tmp_path / "split"), "item")
    by_key = dict(zip(got_keys.tolist(), got_rows))
    for k, r in zip(keys.tolist(), rows):
        np.testing.assert_array_equal(by_key[k], r)
    assert got_rows.shape == (4, 6)


def test_missing_table_names_the_file(tmp_path):
    _write(tmp_path / "tables" / "item.m.npz", [1], [[0.0]])  # a slot alone is no table
    with pytest.raises(CheckpointError, match=r"no rows of table 'item' \(no item\.npz"):
        read_table(str(tmp_path), "item")


def test_static_table_rows_zero_for_unknown_and_pad_ids_and_ids_stay_out_of_the_graph(tmp_path):
    rng = np.random.default_rng(1)
    ids = rng.integers(1 << 40, 1 << 50, size=500).astype(np.int64)
    rows = rng.normal(size=(500, 4)).astype(np.float32)
    table = StaticTable("item", ids, rows)
    query = tf.constant([[ids[3], -1], [12345, ids[3]], [ids[499], ids[0]]], tf.int64)
    expected = np.stack([rows[3], np.zeros(4), np.zeros(4), rows[3], rows[499], rows[0]])

    def looked(t):
        got = t.lookup_unique([query])
        return tf.gather(got.rows, got.index).numpy()

    np.testing.assert_array_equal(looked(table), expected)

    module = tf.Module()
    module.table = table
    module.lookup = tf.function(lambda x: table.index.lookup(x), input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    graph = (tmp_path / "sm" / "saved_model.pb").read_bytes()
    assert ids[:4].tobytes() not in graph and ids[-4:].tobytes() not in graph  # in variables/, not the graph
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_array_equal(loaded.lookup(tf.constant([ids[7], 5, -1], tf.int64)).numpy(), [7, 500, 500])


def test_rare_ids_and_target_encoding_in_the_graph_equal_meta_ios(tmp_path):
    """The graph's remap and target-encoding features equal ``rare_ids.remap`` and the fitted
    table's valid/test features (nothing left out) for frequent, rare, unseen and pad ids."""
    from gmeta_tf.data import target_encoding as te
    from gmeta_tf.data import task_format as fmt
    from gmeta_tf.export.input_transforms import InputTransforms
    from gmeta_tf.metaio.rare_ids import remap

    train_ids = np.array([3, 3, 3, 7, 7, 11, 42, 42, 42, 42], np.int64)
    labels = np.array([4, 5, 3, 1, 2, 5, 3, 3, 4, 2], np.float64)
    table = te.fit("item", train_ids, labels, prior=2.5)
    (entry,) = te.write_tables(tmp_path, [table])
    counts = te.write_id_counts(tmp_path, {"item": train_ids, "tags": np.array([1, 1, 2], np.int64)})
    schema = {"categorical": [{"name": "item"}], "multi_hot": [{"name": "tags"}], "id_counts": counts,
              "target_encoding": [entry],
              "dense": [{"name": "x"}, {"name": "te.item.mean"}, {"name": "te.item.log_count"}, {"name": "z"}]}
    got = InputTransforms(str(tmp_path), schema, {"item": 3, "tags": 2})
    assert got.input_dense == ["x", "z"] and got.computed_dense == ["te.item.mean", "te.item.log_count"]
    ids = np.array([3, 7, 11, 42, 99, fmt.PAD_ID], np.int64)
    np.testing.assert_array_equal(got.ids("item", tf.constant(ids)).numpy(), remap(ids, np.array([3, 42])))
    assert got.ids("item", tf.constant(ids)).numpy().tolist() == [3, fmt.RARE_ID, fmt.RARE_ID, 42, fmt.RARE_ID, -1]
    tags = np.array([[1, 2, -1]], np.int64)
    assert got.ids("tags", tf.constant(tags)).numpy().tolist() == [[1, fmt.RARE_ID, -1]]
    real = ids[:5]
    raw = np.array([[10.0, 20.0]] * 5, np.float32)
    dense = got.dense(tf.constant(raw), {"item": tf.constant(real)}).numpy()
    want = table.features(real, np.zeros(5), np.zeros(5, bool))
    np.testing.assert_array_equal(dense[:, [0, 3]], raw)  # schema.json's order: x, te.., te.., z
    np.testing.assert_array_equal(dense[:, 1:3], want)
    assert dense[4, 1:3].tolist() == [0.0, 0.0]  # unseen id
    assert got.describe()["rare_ids"]["item"]["frequent_ids"] == 2
    # A k above every count pools the whole feature (the MovieLens example's movie_id): no
    # frequent id at all, which a hash table cannot be built from; every real id reads RARE_ID.
    everything = InputTransforms(str(tmp_path), schema, {"item": 1000})
    assert everything.ids("item", tf.constant(ids)).numpy().tolist() == [fmt.RARE_ID] * 5 + [fmt.PAD_ID]
    np.testing.assert_array_equal(everything.ids("item", tf.constant(ids)).numpy(), remap(ids, np.array([], np.int64)))
    assert everything.describe()["rare_ids"]["item"]["frequent_ids"] == 0


def test_unreadable_or_misshapen_table_file_names_the_table(tmp_path):
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "item.npz").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match=r"tables: table 'item' cannot be read"):
        read_table(str(tmp_path), "item")
    _write(tables / "item.npz", [1, 2, 3], [[0.0], [1.0]])  # 3 ids, 2 rows
    with pytest.raises(CheckpointError, match=r"table 'item' has ids of shape \(3,\) and rows of shape \(2, 1\)"):
        read_table(str(tmp_path), "item")


def test_missing_dense_weights_name_the_file(tmp_path):
    from gmeta_tf.export.checkpoint_reader import read_dense

    with pytest.raises(CheckpointError, match=rf"{tmp_path}/dense: the dense weights cannot be read"):
        read_dense(str(tmp_path), ["top/0/w"])


def test_two_features_with_one_input_name_are_refused_naming_both():
    from types import SimpleNamespace

    from gmeta_tf.errors import DataError
    from gmeta_tf.export.signatures import sample_inputs

    model = SimpleNamespace(cat_names=["item-id", "item.id"], multi_names=[], n_input_dense=0)
    with pytest.raises(DataError, match=r"features 'item-id' and 'item\.id' both become the signature input 'item_id'"):
        sample_inputs(model)


def test_input_transforms_name_a_damaged_table_or_an_inconsistent_schema(tmp_path):
    from gmeta_tf.errors import DataError
    from gmeta_tf.export.input_transforms import InputTransforms

    (tmp_path / "target_encoding").mkdir()
    entry = {"column": "item", "prior": 5.0, "global_mean": 3.0,
             "features": ["te.item.mean", "te.item.log_count"], "file": "target_encoding/item.npz"}
    schema = {"categorical": [{"name": "item"}], "multi_hot": [], "target_encoding": [entry],
              "dense": [{"name": "price"}, {"name": "te.item.mean"}]}  # log_count missing from dense
    (tmp_path / "target_encoding" / "item.npz").write_bytes(b"oops")
    with pytest.raises(DataError, match=r"target_encoding/item\.npz: cannot read the target encoding table of 'item'"):
        InputTransforms(str(tmp_path), schema, {})
    np.savez(tmp_path / "target_encoding" / "item.npz", ids=np.array([1], np.int64),
             sums=np.array([4.0]), counts=np.array([1], np.int64))
    with pytest.raises(DataError, match=r"adds dense feature 'te\.item\.log_count', which its dense list lacks"):
        InputTransforms(str(tmp_path), schema, {})
