"""Per-table access statistics of a prepared directory (``schema.json`` ``table_stats``).

``prepare`` records them while it writes; ``gmeta data stats`` recomputes them from the train
split of an already-prepared directory (one written before they existed, or to refresh them)
and rewrites ``schema.json`` atomically. Both count exactly the ids the reader will feed
training: the train split's support and query samples as written.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gmeta_tf.atomic_file import replace_file
from gmeta_tf.data import stats
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.task_format import load_schema
from gmeta_tf.errors import DataError

KEY = "table_stats"


def table_names(schema: dict) -> List[str]:
    return list(fmt.table_id_columns(schema))


def compute(data_dir: str) -> Dict[str, Dict]:
    """``{table: access_stats}`` over the train split of ``data_dir``."""
    schema = load_schema(data_dir)
    files = [Path(data_dir) / f for f in schema["splits"]["train"]["files"]]
    columns = fmt.table_id_columns(schema)
    ids: Dict[str, List[np.ndarray]] = {n: [] for n in columns}
    n_samples = 0
    for f in files:
        try:
            t = pq.read_table(f, columns=[c for cols in columns.values() for c in cols] + [fmt.N_SUPPORT, fmt.N_QUERY])
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{f}: cannot read the train split's id columns: {str(e).splitlines()[0]}") from None
        n_samples += int(pc.sum(t[fmt.N_SUPPORT]).as_py() or 0) + int(pc.sum(t[fmt.N_QUERY]).as_py() or 0)
        for n, cols in columns.items():
            ids[n].extend(fmt.flat_ids(t[c].combine_chunks()) for c in cols)
    return {n: stats.access_stats(np.concatenate(v) if v else np.zeros(0, np.int64), n_samples)
            for n, v in ids.items()}


def update_schema(data_dir: str) -> Dict[str, Dict]:
    """Recompute and store ``table_stats`` in ``schema.json`` (temp file + rename)."""
    table = compute(data_dir)
    schema = load_schema(data_dir)
    schema[KEY] = table
    path = Path(data_dir) / fmt.SCHEMA_FILE
    replace_file(path, json.dumps(schema, indent=2) + "\n")
    return table
