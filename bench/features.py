"""Prepared data with more features of one width: each feature copied ``copies`` times.

The step-time-against-features rows (``meta_step_features``) and the PS hash-op count at 14
tables need the same data with 2x, 4x the tables. ``widen`` writes a prepared dataset whose
every categorical and multi-hot column has ``copies - 1`` siblings ``<name>_x<k>``, ids XOR-ed
with a per-copy constant below 2^62 (so the copies' ids differ, stay non-negative, and the pad
stays the pad), and a ``schema.json`` listing them. Everything else (tasks, labels, dense
features, splits) is the source's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gmeta_tf.data import task_format as fmt


def _mask(k: int) -> int:
    return (0x9E3779B97F4A7C15 * k) & ((1 << 62) - 1)


def _xor_ids(col: pa.ChunkedArray, mask: int) -> pa.Array:
    arr = col.combine_chunks()
    depth, inner = 0, arr
    while pa.types.is_list(inner.type):
        inner = inner.flatten()
        depth += 1
    ids = inner.to_numpy(zero_copy_only=False).astype(np.int64)
    new = pa.array(np.where(ids >= 0, ids ^ np.int64(mask), ids), pa.int64())
    rebuilt = new
    levels = []
    level = arr
    for _ in range(depth):
        levels.append(level)
        level = level.flatten()
    for level in reversed(levels):
        rebuilt = pa.ListArray.from_arrays(level.offsets, rebuilt)
    return rebuilt


def widen(prepared: str, copies: int, out: str) -> str:
    """``out`` (made once; reused when its schema already lists the copies): ``prepared`` with
    every id feature ``copies`` times."""
    src, dst = Path(prepared), Path(out)
    schema = json.loads((src / fmt.SCHEMA_FILE).read_text())
    names = [("cat", c["name"]) for c in schema["categorical"]] + [("multi", c["name"]) for c in schema["multi_hot"]]
    if (dst / fmt.SCHEMA_FILE).is_file():
        return str(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for split in schema["splits"].values():
        for rel in split["files"]:
            table = pq.read_table(src / rel)
            for k in range(1, copies):
                for part, name in names:
                    for which in fmt.SETS:
                        col = f"{which}.{part}.{name}"
                        table = table.append_column(f"{which}.{part}.{name}_x{k}", _xor_ids(table[col], _mask(k)))
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, tmp / rel)
    for key in ("categorical", "multi_hot"):
        schema[key] = schema[key] + [dict(c, name=f"{c['name']}_x{k}") for k in range(1, copies) for c in schema[key]]
    for key in ("table_stats", "id_counts"):  # per-feature extras the copies would lack
        schema.pop(key, None)
    (tmp / fmt.SCHEMA_FILE).write_text(json.dumps(schema, indent=1))
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return str(dst)
