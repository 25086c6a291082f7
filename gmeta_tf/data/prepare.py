"""``gmeta data prepare``: sample-level tables → the task-major Meta-IO format (``task_format.py``).

Why task-major: a meta step needs, per task, a support set and a query set. Grouping samples
by task once, offline, turns the reader's job into "read one row per task", which is cheap,
shardable by file and identical on every rank.

Pipeline (each step is a small module, all vectorized over samples):

1. ``read_input``  resolve files, the column mapping (sidecar + explicit options), read Arrow;
2. ``convert``     typed numpy columns; bad rows reported (``error``) or dropped (``skip``);
3. ``split``       drop too small / too large tasks, assign tasks to splits and shards, sort
                   samples by (task, time) once and pick each task's support and query;
4. here            build the list columns with ``ListArray.from_arrays(offsets, values)``
                   and write every split's shards plus ``schema.json`` into a temp dir that
                   ``atomic`` renames into place only when complete;
5. ``stats``       cardinalities, pooling, dense and label statistics (train split), and
                   the per-table access statistics the sharding planner uses.

That is the in-memory engine (``prepare.engine=memory``): simple, and the reference, but it holds
every input row (~400 B each). The default, ``prepare.engine=duckdb`` (``ooc.py``), runs the same
steps streamed, with the sort on disk in DuckDB, and writes the same files; only it can prepare one
part of N (``prepare.part``, ``parts.py``).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import stats
from gmeta_tf.data import target_encoding as te
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.atomic import atomic_dir, check_target
from gmeta_tf.data.convert import REASONS, Samples, convert
from gmeta_tf.data.read_input import Mapping, read_inputs, resolve_inputs, resolve_mapping
from gmeta_tf.data.split import Selection, SplitLayout, assign_splits, filter_tasks, sort_samples, support_query
from gmeta_tf.errors import DataError


def prepare(inputs: Sequence[str], out: str, cfg: PrepareConfig, overwrite: bool = False,
            progress: bool = False) -> Dict:
    """Prepare ``inputs`` into ``out``; return the summary (also stored in ``schema.json``).

    ``cfg.engine`` picks how: ``duckdb`` (``ooc.py``) holds only the task list in memory and sorts
    on disk, ``memory`` holds every input row (the reference the other is tested against).
    ``progress``: a progress line of input rows read on stderr (when it is a terminal).
    Raises ``DataError`` for any bad input; ``out`` is then left as it was.
    """
    out_p = Path(out)
    check_target(out_p, overwrite)
    inputs = [str(p) for p in inputs]
    files = resolve_inputs(inputs)
    if out_p.exists():
        resolved_out = out_p.resolve()
        for f in files:
            if resolved_out in f.resolve().parents:
                raise DataError(f"input {f} is inside the output directory {out}; choose another --out")
    mapping = resolve_mapping(cfg, inputs)
    if cfg.engine == "memory":
        if cfg.part is not None:
            raise DataError("prepare.part needs prepare.engine=duckdb")
        return _prepare_memory(files, mapping, out_p, cfg, overwrite)
    from gmeta_tf.data import ooc  # imports duckdb, which the memory engine does not need

    with atomic_dir(out_p, overwrite) as tmp:
        schema, result = ooc.prepare_ooc(files, mapping, cfg, tmp, progress)
        _write_schema(tmp, schema)
    return dict(result, out=str(out_p))


def _prepare_memory(files, mapping: Mapping, out_p: Path, cfg: PrepareConfig, overwrite: bool) -> Dict:
    rows = read_inputs(files, mapping.columns())
    samples, skipped = convert(rows, mapping, cfg.on_bad_rows)
    if len(samples) == 0:
        raise DataError(f"no rows left in {len(files)} input file(s) after skipping bad rows ({_kv(skipped)})")

    # Compact task codes to the tasks that still have rows.
    used, task = np.unique(samples.task, return_inverse=True)
    names = samples.task_names[used]
    sizes = np.bincount(task, minlength=used.size)
    kept, dropped = filter_tasks(sizes, cfg.min_task_size, cfg.max_task_size)
    layout = assign_splits(
        np.flatnonzero(kept), names, cfg.valid_frac, cfg.test_frac, cfg.shards, cfg.seed, dropped,
        folds=cfg.folds, fold=cfg.fold,
    )
    n_tasks = int(layout.order.size)
    task_rank = np.full(used.size, -1, dtype=np.int64)
    task_rank[layout.order] = np.arange(n_tasks)
    rank = task_rank[task]
    idx = np.flatnonzero(rank >= 0)
    local = sort_samples(
        rank[idx], None if samples.time is None else samples.time[idx], samples.row[idx], cfg.split_by, cfg.seed
    )
    order = idx[local]
    sel = support_query(rank[order], order, n_tasks, cfg.query, cfg.max_support)
    train_rows = _train_rows(layout, sel)
    te.check_columns(cfg.target_encoding, mapping.categorical, mapping.dense)
    extra, te_names, te_tables = te.encode(
        cfg.target_encoding, samples.cats, samples.label, train_rows, cfg.target_encoding_prior
    )
    if te_names:  # appended after the input's dense columns, so everything downstream treats them alike
        samples = dataclasses.replace(samples, dense=np.concatenate([samples.dense, extra], axis=1))
        mapping = dataclasses.replace(mapping, dense=list(mapping.dense) + te_names)

    summary = {
        "input_rows": rows.num_rows,
        "tasks_in": int(used.size),
        "tasks_kept": n_tasks,
        "dropped": dropped,
        "rows_skipped": skipped,
        "samples_truncated": sel.truncated,
    }
    with atomic_dir(out_p, overwrite) as tmp:
        split_info = _write_splits(tmp, samples, mapping, names, layout, sel, cfg)
        schema = _schema(samples, mapping, layout, sel, cfg, split_info, summary)
        schema["target_encoding"] = te.write_tables(tmp, te_tables)
        schema["id_counts"] = te.write_id_counts(tmp, {
            **{c: samples.cats[c][train_rows] for c in mapping.categorical},
            **{c: samples.multi[c].take(pa.array(train_rows)).flatten().to_numpy(zero_copy_only=False)
               for c in mapping.multi_hot},
        })
        _write_schema(tmp, schema)
    return dict(
        summary,
        out=str(out_p),
        samples=int(sum(s["samples"] for s in split_info.values())),
        splits={k: {"tasks": v["tasks"], "samples": v["samples"]} for k, v in split_info.items()},
    )


class _Columns:
    """Support or query values of every kept task, concatenated in output order."""

    def __init__(self, s: Samples, m: Mapping, idx: np.ndarray, counts: np.ndarray):
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.label = s.label[idx]
        self.dense = s.dense[idx]
        self.time = None if s.time is None else s.time[idx]
        self.cats = {c: s.cats[c][idx] for c in m.categorical}
        self.multi = {c: s.multi[c].take(pa.array(idx)) for c in m.multi_hot}
        self.n_dense = len(m.dense)


def _lists(offsets: np.ndarray, a: int, b: int, values: pa.Array) -> pa.ListArray:
    lo = offsets[a]
    rel = (offsets[a:b + 1] - lo).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(rel, pa.int32()), values)


def _set_columns(which: str, c: _Columns, m: Mapping, a: int, b: int) -> Dict[str, pa.Array]:
    lo, hi = int(c.offsets[a]), int(c.offsets[b])
    inner = pa.ListArray.from_arrays(
        pa.array(np.arange(hi - lo + 1, dtype=np.int64) * c.n_dense, pa.int32()),
        pa.array(c.dense[lo:hi].reshape(-1), pa.float32()),
    )
    cols = {
        fmt.label_col(which): _lists(c.offsets, a, b, pa.array(c.label[lo:hi], pa.float32())),
        fmt.dense_col(which): _lists(c.offsets, a, b, inner),
    }
    if m.time_col:
        cols[fmt.time_col(which)] = _lists(c.offsets, a, b, pa.array(c.time[lo:hi], pa.int64()))
    for name in m.categorical:
        cols[fmt.cat_col(which, name)] = _lists(c.offsets, a, b, pa.array(c.cats[name][lo:hi], pa.int64()))
    for name in m.multi_hot:
        vals = pa.concat_arrays([c.multi[name].slice(lo, hi - lo)])  # re-based copy of the slice
        cols[fmt.multi_col(which, name)] = _lists(c.offsets, a, b, vals)
    return cols


def shard_table(task_ids: np.ndarray, n_support: np.ndarray, n_query: np.ndarray, sup: "_Columns", qry: "_Columns",
                m: Mapping, sample_index: np.ndarray, all_off: np.ndarray, a: int, b: int) -> pa.Table:
    """Tasks ``a:b`` as the Parquet table of ``task_format`` (both engines build it here)."""
    return pa.table(
        {
            fmt.TASK_ID: pa.array(task_ids[a:b], pa.string()),
            fmt.N_SUPPORT: pa.array(n_support[a:b], pa.int32()),
            fmt.N_QUERY: pa.array(n_query[a:b], pa.int32()),
            **_set_columns("support", sup, m, a, b),
            **_set_columns("query", qry, m, a, b),
            fmt.SAMPLE_INDEX: _lists(all_off, a, b, pa.array(sample_index[all_off[a]:all_off[b]], pa.int64())),
        }
    )


def _write_splits(
    tmp: Path, s: Samples, m: Mapping, names: np.ndarray, layout: SplitLayout, sel: Selection, cfg: PrepareConfig
) -> Dict[str, Dict]:
    sup = _Columns(s, m, sel.rows[~sel.is_query], sel.n_support)
    qry = _Columns(s, m, sel.rows[sel.is_query], sel.n_query)
    all_off = np.concatenate([[0], np.cumsum(sel.n_support + sel.n_query)])
    sample_index = s.row[sel.rows]
    task_ids = names[layout.order].astype(str)
    info: Dict[str, Dict] = {}
    for split in fmt.SPLITS:
        ranges = layout.shards[split]
        (tmp / split).mkdir()
        files: List[str] = []
        n_t = n_s = 0
        for shard, a, b in ranges:
            table = shard_table(task_ids, sel.n_support, sel.n_query, sup, qry, m, sample_index, all_off, a, b)
            rel = f"{split}/{fmt.part_name(shard, cfg.shards)}"
            pq.write_table(table, tmp / rel, row_group_size=cfg.rows_per_group)
            files.append(rel)
            n_t += b - a
            n_s += int(all_off[b] - all_off[a])
        info[split] = {"tasks": n_t, "samples": n_s, "files": files}
    return info


def _schema(
    s: Samples, m: Mapping, layout: SplitLayout, sel: Selection, cfg: PrepareConfig, split_info: Dict, summary: Dict
) -> Dict:
    written = sel.rows
    train_rows = _train_rows(layout, sel)
    return {
        "format_version": fmt.FORMAT_VERSION,
        "task_col": m.task_col,
        "label": {"name": m.label_col, "kind": m.label_kind},
        "time_col": m.time_col,
        "categorical": [stats.categorical_stats(c, s.cats[c][written], s.hashed[c]) for c in m.categorical],
        "multi_hot": [
            stats.multi_hot_stats(c, s.multi[c].take(pa.array(written)), s.hashed[c]) for c in m.multi_hot
        ],
        "dense": stats.dense_stats(m.dense, s.dense[train_rows]),
        "label_stats": stats.label_stats(s.label[train_rows]),
        "table_stats": {  # for the sharding planner (``data/table_stats.py``)
            **{c: stats.access_stats(s.cats[c][train_rows], train_rows.size) for c in m.categorical},
            **{c: stats.access_stats(s.multi[c].take(pa.array(train_rows)).flatten().to_numpy(zero_copy_only=False),
                                     train_rows.size) for c in m.multi_hot},
        },
        "support_query": {"query": cfg.query, "max_support": cfg.max_support, "split_by": cfg.split_by},
        **({"folds": {"folds": cfg.folds, "fold": cfg.fold, "seed": cfg.seed}} if cfg.folds else {}),
        "splits": split_info,
        "summary": summary,
    }


def _train_rows(layout: SplitLayout, sel: Selection) -> np.ndarray:
    """Indices (into the samples) of the train split's written samples: tasks are in split
    order, train first, so they are a prefix of ``sel.rows``."""
    n_train = layout.counts["train"]
    return sel.rows[: int(np.sum(sel.n_support[:n_train] + sel.n_query[:n_train]))]


def _write_schema(tmp: Path, schema: Dict) -> None:
    (tmp / fmt.SCHEMA_FILE).write_text(json.dumps(schema, indent=2) + "\n")


def _kv(d: Dict[str, int]) -> str:
    return ", ".join(f"{k}={v:,}" for k, v in d.items())


def format_summary(s: Dict) -> str:
    """One line for the terminal, e.g. ``prepared 2,871 tasks (train 2,009 / ...) ...``."""
    sp = s["splits"]
    skipped = {r: s["rows_skipped"].get(r, 0) for r in REASONS}
    return (
        f"prepared {s['tasks_kept']:,} tasks (train {sp['train']['tasks']:,} / valid {sp['valid']['tasks']:,} / "
        f"test {sp['test']['tasks']:,}), {s['samples']:,} samples from {s['input_rows']:,} input rows; "
        f"dropped: {_kv(s['dropped'])}; rows skipped: {_kv(skipped)}; "
        f"truncated: {s['samples_truncated']:,} samples; "
        + (f"this part: {s['tasks_in']:,} tasks, {s['part_rows']:,} rows; " if "part_rows" in s else "")
        + f"wrote {s['out']}"
    )
