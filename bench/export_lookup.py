"""``make bench`` section ``export``: the exported tables' per-id lookup cost, next to TFRA's.

An export turns every TFRA table into a stock ``StaticHashTable`` (id → row number) plus a rows
variable (``gmeta_tf/export/static_table.py``). This measures one lookup of a batch of ids
(hash-table find + gather of the rows) in the *loaded* SavedModel, for ids the table holds and
for unknown ids, against a local TFRA table's read-only lookup of the same ids; and the size of
the graph protobuf, which must not grow with the table (the ids live in ``variables/``).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict

import numpy as np
import tensorflow as tf

ROWS = 1_000_000
DIM = 16
BATCH = 100_000
REPEATS = 20
# ``smoke`` (bench/run.py --smoke): the same save, load and lookups on a small table
SMOKE_ROWS, SMOKE_BATCH, SMOKE_REPEATS = 10_000, 1_000, 2


def _ns_per_id(fn, ids: tf.Tensor, repeats: int = REPEATS) -> float:
    fn(ids)  # trace / warm up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(ids)
    return (time.perf_counter() - t0) / repeats / int(ids.shape[0]) * 1e9


def measure(work: Path, smoke: bool = False) -> Dict:
    from gmeta_tf.embedding.naming import local_namespace
    from gmeta_tf.embedding.table import EmbeddingTable
    from gmeta_tf.embedding.table_files import import_variable
    from gmeta_tf.export.static_table import StaticTable

    n_rows, batch, repeats = (SMOKE_ROWS, SMOKE_BATCH, SMOKE_REPEATS) if smoke else (ROWS, BATCH, REPEATS)
    rng = np.random.default_rng(0)
    ids = rng.choice(1 << 40, n_rows, replace=False).astype(np.int64)
    rows = rng.normal(size=(n_rows, DIM)).astype(np.float32)
    module = tf.Module()
    module.table = StaticTable("item", ids, rows)
    spec = tf.TensorSpec([None], tf.int64)
    module.lookup = tf.function(lambda x: tf.gather(module.table.rows, module.table.index.lookup(x)),
                                input_signature=[spec])
    out = work / "export_lookup"
    tf.saved_model.save(module, str(out))
    loaded = tf.saved_model.load(str(out))
    hits = tf.constant(rng.choice(ids, batch), tf.int64)
    misses = tf.constant(rng.integers(1 << 41, 1 << 42, batch), tf.int64)

    tfra = EmbeddingTable("item", DIM, ["/CPU:0"], local_namespace("bench"), 0.01, seed=0, expected_rows=n_rows)
    import_variable(tfra.variable, ids, rows)
    tfra_lookup = tf.function(lambda x: tfra.variable.lookup(x), input_signature=[spec])

    static_hit = _ns_per_id(loaded.lookup, hits, repeats)
    tfra_hit = _ns_per_id(tfra_lookup, hits, repeats)
    return {
        "rows": n_rows, "dim": DIM, "batch": batch,
        "static_ns_per_id_hit": static_hit,
        "static_ns_per_id_miss": _ns_per_id(loaded.lookup, misses, repeats),
        "tfra_ns_per_id_hit": tfra_hit,
        "static_over_tfra": static_hit / tfra_hit,
        "saved_model_pb_bytes": (out / "saved_model.pb").stat().st_size,
    }
