"""The embedding package's own promises: checkpoint table files readable without TFRA, a hot
table that forwards nothing, and a typed error (not matched message text) for an id outside a
local-only hot set."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

ROOT = Path(__file__).resolve().parents[1]


def _write(tables: Path, key: str, keys, values) -> None:
    tables.mkdir(parents=True, exist_ok=True)
    np.savez(tables / f"{key}.npz", keys=np.asarray(keys, np.int64), values=np.asarray(values, np.float32))


def test_read_table_joins_column_blocks_and_reads_slots_without_tfra(tmp_path):
    ckpt = tmp_path / "ckpt-00000007"
    tables = ckpt / "tables"
    # item saved as two column blocks, rows in different orders; city saved whole.
    _write(tables, "item.c0of2", [5, 1, 9], [[50.0], [10.0], [90.0]])
    _write(tables, "item.c1of2", [9, 5, 1], [[91.0], [51.0], [11.0]])
    _write(tables, "item.c0of2.m", [1, 5, 9], [[0.1], [0.5], [0.9]])
    _write(tables, "item.c1of2.m", [1, 5, 9], [[1.1], [1.5], [1.9]])
    _write(tables, "city", [3, 2], [[3.0, 3.5], [2.0, 2.5]])
    code = (
        "import json, sys\n"
        "from gmeta_tf.embedding.table_files import read_table\n"
        f"ck = {str(ckpt)!r}\n"
        "out = {t: [a.tolist() for a in read_table(ck, t)] for t in ('item', 'item.m', 'city')}\n"
        "out['tfra_loaded'] = 'tensorflow_recommenders_addons' in sys.modules\n"
        "print(json.dumps(out))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["item"] == [[1, 5, 9], [[10.0, 11.0], [50.0, 51.0], [90.0, 91.0]]]
    assert got["item.m"][0] == [1, 5, 9]
    np.testing.assert_allclose(got["item.m"][1], [[0.1, 1.1], [0.5, 1.5], [0.9, 1.9]], rtol=1e-6)
    assert got["city"] == [[3, 2], [[3.0, 3.5], [2.0, 2.5]]]
    assert got["tfra_loaded"] is False  # export tools read checkpoints without TFRA


def test_read_table_names_the_checkpoint_when_a_table_is_missing(tmp_path):
    from gmeta_tf.embedding.table_files import read_table
    from gmeta_tf.errors import CheckpointError

    _write(tmp_path / "ckpt-1" / "tables", "item.c0of2", [1], [[1.0]])  # block 1 of 2 is missing
    with pytest.raises(CheckpointError, match=r"ckpt-1 has no rows of table 'item'"):
        read_table(str(tmp_path / "ckpt-1"), "item")
    with pytest.raises(CheckpointError, match="'tags'"):
        read_table(str(tmp_path / "ckpt-1"), "tags")


def _hot_table(local_only: bool):
    from gmeta_tf.embedding.hot_cold import HotColdTable
    from gmeta_tf.embedding.naming import local_namespace
    from gmeta_tf.embedding.table import EmbeddingTable

    base = EmbeddingTable("device", 2, ["/CPU:0"], local_namespace("emb"), 0.05, seed=0)
    return HotColdTable(base, np.arange(4, dtype=np.int64), local_only=local_only)


def test_hot_table_offers_the_table_surface_and_forwards_nothing():
    t = _hot_table(local_only=False)
    assert (t.name, t.dim, t.storage()) == ("device", 2, [t.base])
    assert not hasattr(t, "variable") and not hasattr(t, "shadow") and not hasattr(t, "slot_variables")


def test_an_id_outside_a_local_only_hot_set_is_a_typed_error_naming_the_table():
    from gmeta_tf.embedding.collection import Embeddings
    from gmeta_tf.errors import DataError, HotSetMissError

    table = _hot_table(local_only=True)
    emb = Embeddings([table], ["device"], [])

    @tf.function
    def look(ids):
        return table.lookup_unique([ids]).rows

    with emb.step_errors("rank 0, step 3"):
        assert look(tf.constant([[0, 3, -1]], tf.int64)).shape == (3, 2)  # hot ids and a pad: fine
    with pytest.raises(HotSetMissError, match=r"^rank 0, step 3: hot table device: an id outside the hot set.*"
                                              r"gmeta data profile.*\(2 such id"):
        with emb.step_errors("rank 0, step 3"):
            look(tf.constant([[0, 7, 8, -1]], tf.int64))
    assert issubclass(HotSetMissError, DataError)
    with pytest.raises(tf.errors.InvalidArgumentError):  # other failures pass through unchanged
        with emb.step_errors("rank 0, step 4"):
            look(tf.constant([[0, 1]], tf.int64))  # no miss now ...
            raise tf.errors.InvalidArgumentError(None, None, "something else")  # ... another failure
