"""The planner's tables from a prepared directory and the config: ``schema.json`` x ``model``.

Rows, pooling and the access-skew histogram come from ``schema.json``'s ``table_stats``
(written by ``prepare`` / ``gmeta data stats``), the dim from ``model.embedding_dim``. A
directory prepared before those statistics existed gets them computed on the fly from its
train split (``gmeta data stats DIR`` stores them).

Multi-hot pooling is capped at ``data.max_multi_hot``: the reader keeps at most that many ids
per sample, so that is all a PS ever sees.
"""
from __future__ import annotations

from typing import List

from gmeta_tf.config.schema import Config
from gmeta_tf.data import table_stats
from gmeta_tf.data.task_format import load_schema
from gmeta_tf.errors import DataError
from gmeta_tf.plan.spec import N_SKEW_BINS, TableStats


def tables_from_schema(schema: dict, cfg: Config, stats: dict, source: str = "schema.json") -> List[TableStats]:
    multi = {c["name"] for c in schema["multi_hot"]}
    out = []
    for name in table_names(schema):
        st = stats.get(name)
        if not isinstance(st, dict) or not {"rows", "pooling", "skew"} <= set(st):
            raise DataError(f"{source}: table_stats has no rows/pooling/skew for table {name!r}; "
                            "run 'gmeta data stats DIR'")
        skew = tuple(float(x) for x in st["skew"])
        if len(skew) != N_SKEW_BINS:
            raise DataError(f"{source}: table_stats[{name!r}].skew has {len(skew)} bins, expected {N_SKEW_BINS}")
        pooling = float(st["pooling"])
        if name in multi:
            pooling = min(pooling, float(cfg.data.max_multi_hot))
        out.append(TableStats(name, int(st["rows"]), int(cfg.model.embedding_dim), pooling, skew))
    return out


def table_names(schema: dict) -> List[str]:
    return table_stats.table_names(schema)


def tables_from_data(data_dir: str, cfg: Config) -> List[TableStats]:
    schema = load_schema(data_dir)
    stats = schema.get(table_stats.KEY)
    if not stats:
        stats = table_stats.compute(data_dir)
    return tables_from_schema(schema, cfg, stats, f"{data_dir}/schema.json")
