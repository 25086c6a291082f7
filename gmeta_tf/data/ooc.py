"""The out-of-core ``prepare`` engine: memory bounded whatever the input size (``prepare.engine=duckdb``).

Why: the in-memory engine holds every input row (~400 B each), so a 50M-row log does not fit a
box. Here only the task list (one entry per task) is held; rows live in Parquet spool files in the
output's temp dir (so a failed run leaves nothing) and DuckDB sorts them on disk under
``prepare.memory_limit``. The output is the in-memory engine's, file for file
(``tests/test_prepare_out_of_core.py`` compares them).

1. **read** (streamed): each input file batch by batch (``ooc_input``), each batch converted by
   ``convert`` (the same checks and messages; a bad row under ``on_bad_rows=error`` is raised once
   the whole input has been checked, as the in-memory engine does); with ``--part I/N`` only the
   rows of the part's tasks go on (``parts.in_part``: a task's shard is a hash of its id), so a
   part spools, sorts and writes ~1/N of the rows; the typed columns, with each row's task name,
   appended to ``spool1``;
2. **tasks** (DuckDB, then numpy on the task list only): the spool's names grouped in the order of
   their first row (``_task_list``); ``filter_tasks`` and ``assign_splits`` as in memory (or the
   hash assignment of ``parts`` with ``prepare.part``), giving each kept task its output rank
   (``ranks``, registered on the connection);
3. **rank**: ``split_by=time`` reads ``spool1`` joined with ``ranks`` straight into the sort
   (``_ranked``); ``split_by=random`` first writes ``spool2`` of those rows in input order with
   the seeded key of ``split.sort_samples`` (the same generator drawn in chunks in input order is
   the same sequence);
4. **target encoding** (DuckDB): the train split's written samples (the last ``query +
   max_support`` of each train task, a window) give each encoded id's label sum and count;
5. **write** (DuckDB → stream): the ranked rows ordered by (rank, time or key, input row), joined with
   the target-encoding tables, read back as Arrow batches; per task the rows before its support are
   dropped, and every ``rows_per_group`` tasks become one row group of their shard's Parquet file
   (``prepare.shard_table``, the in-memory engine's code). The written samples also go to
   ``written`` for
6. **statistics** (DuckDB over ``written``): cardinalities, pooling, dense/label moments, the
   planner's table statistics and the id counts, as ``stats`` defines them.
"""
from __future__ import annotations

import itertools
import math
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import parts, stats
from gmeta_tf.data import target_encoding as te
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.convert import REASONS, Samples, convert_columns, keep_rows
from gmeta_tf.data.ooc_input import Source, batch_rows, decisions, open_all
from gmeta_tf.data.prepare import _Columns, _kv, shard_table
from gmeta_tf.data.read_input import Mapping
from gmeta_tf.data.split import assign_splits, filter_tasks
from gmeta_tf.errors import DataError

WORK_DIR = "_prepare_work"  # inside the output's temp dir; removed before the rename
FETCH_ROWS = 1 << 16
# Spool files are written once and read once or twice, on the same disk: plain encoding writes
# fastest (dictionary pages and compression cost more CPU than the bytes they save here).
SPOOL_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False}
PART_IDS_DIR = fmt.PART_IDS_DIR  # --part only (task_format: part)


def _sql_str(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


class _Names:
    """Spool column names of the mapped columns (input names may be anything; these are SQL-safe)."""

    def __init__(self, m: Mapping):
        self.cat = {c: f"c{i}" for i, c in enumerate(m.categorical)}
        self.multi = {c: f"m{i}" for i, c in enumerate(m.multi_hot)}
        self.dense = [f"d{j}" for j in range(len(m.dense))]


# ------------------------------------------------------------------------------------ 1. read


class _Read:
    """What reading leaves behind: the counts, and the first spool (the task list is
    ``_task_list``'s, from the spool)."""

    def __init__(self):
        self.input_rows = 0
        self.kept_rows = 0  # rows of the whole input past the bad-row checks
        self.part_rows = 0  # of those, the rows spooled: with --part I/N only the part's tasks' rows
        self.skipped = {r: 0 for r in REASONS}
        self.hashed: Dict[str, bool] = {}


def _spool_batch(s: Samples, base: int, m: Mapping, nm: _Names) -> pa.Table:
    """The spool keeps each row's task name: a task list held in a Python dict while reading cost
    a dict lookup per distinct task per batch, 63% of the read at 100M rows (every batch holds
    ~20k distinct users); DuckDB groups the names once afterwards (``_task_list``)."""
    names = pa.array(s.task_names, pa.string()).take(pa.array(s.task))
    cols = {"name": names, "r": pa.array(s.row + base), "y": pa.array(s.label)}
    if m.time_col:
        cols["ts"] = pa.array(s.time)
    for c in m.categorical:
        cols[nm.cat[c]] = pa.array(s.cats[c])
    for c in m.multi_hot:
        cols[nm.multi[c]] = _norm_list(s.multi[c])
    for j, name in enumerate(nm.dense):
        cols[name] = pa.array(np.ascontiguousarray(s.dense[:, j]))
    return pa.table(cols)


def _mine(cols, cfg: PrepareConfig, part: Optional[Tuple[int, int]]) -> Optional[np.ndarray]:
    """Per row of a batch: is its task one of part ``part``'s (``parts.in_part``, hashed once per
    distinct task of the batch)? None: every row is (no ``--part``, or ``0/1``)."""
    if part is None or part[1] == 1:
        return None
    if cols.names.size == 0:  # every task null: bad rows, counted already
        return np.zeros(cols.task.size, bool)
    return parts.in_part(cols.names, cfg.seed, cfg.shards, part)[cols.task]


def _read(sources: List[Source], m: Mapping, cfg: PrepareConfig, spool: Path, progress: bool) -> _Read:
    """Read, check and convert every input row; spool the rows of this part's tasks (all rows
    without ``--part``): rows of other parts are checked and counted, never spooled."""
    from tqdm import tqdm

    hashed = decisions(sources, m)
    nm = _Names(m)
    res = _Read()
    part = cfg.part_index()
    first_error: Optional[DataError] = None
    writer = _LazyWriter(spool, **SPOOL_OPTIONS)
    template: Optional[pa.Table] = None  # an empty spool batch, for a part that keeps no row
    bar = tqdm(total=sum(s.num_rows for s in sources), unit=" rows", unit_scale=True, desc="prepare: read",
               file=sys.stderr, disable=None if progress else True, leave=False)
    try:
        for src in sources:
            split = {c: src.split_strings.get(c, False) for c in m.multi_hot}
            for table, file_row in src.batches():
                rows = batch_rows(src, table, file_row)
                cols = convert_columns(rows, m, hashed, split)
                base = res.input_rows
                res.input_rows += rows.num_rows
                bar.update(rows.num_rows)
                if cfg.on_bad_rows == "error":
                    err = cols.bad.first_error()
                    if err is not None and first_error is None:
                        first_error = err  # raised once every file is checked (structural errors first)
                    if first_error is not None:
                        continue
                    keep, counts = np.ones(rows.num_rows, bool), {r: 0 for r in REASONS}
                else:
                    keep, counts = cols.bad.resolve("skip")
                for r, n in counts.items():
                    res.skipped[r] += n
                res.kept_rows += int(keep.sum())
                mine = _mine(cols, cfg, part)
                if mine is not None:
                    keep = keep & mine
                s, _ = keep_rows(rows, cols, keep, counts)
                res.hashed = s.hashed
                if len(s) == 0:
                    if template is None and writer.writer is None:
                        template = _spool_batch(s, base, m, nm)
                    continue
                res.part_rows += len(s)
                writer.write(_spool_batch(s, base, m, nm))
        if writer.writer is None and template is not None and first_error is None:
            writer.write(template)  # no row of this part: an empty spool with the input's columns
    finally:
        bar.close()
        writer.close()
    if first_error is not None:
        raise first_error
    return res


def _task_list(con, spool1: Path) -> Tuple[np.ndarray, np.ndarray]:
    """``(names, sizes)`` of the spooled tasks in the order of their first row: the order a
    dict filled while reading would give, so task codes (indices here) are as before."""
    t = con.sql(f"SELECT name, count(*) AS n, min(r) AS first FROM read_parquet({_sql_str(spool1)}) "
                f"GROUP BY name ORDER BY first").to_arrow_table()
    return t.column("name").to_numpy(zero_copy_only=False), t.column("n").to_numpy().astype(np.int64)


# ------------------------------------------------------------------------------------ 3. rank


def _ranked(spool1: Path) -> str:
    """The kept tasks' spooled rows with their output rank, as a DuckDB relation (``ranks``, the
    task list's kept names and ranks, is registered on the connection): for ``split_by=time`` the
    sort reads it straight from ``spool1``, with no pass of its own."""
    return (f"(SELECT rk.rank, sp.* EXCLUDE (name) FROM read_parquet({_sql_str(spool1)}) sp "
            f"JOIN ranks rk ON sp.name = rk.name)")


def _rank(con, ranked: str, spool2: Path, cfg: PrepareConfig) -> str:
    """``split_by=random`` only: the ranked rows in input order → ``spool2`` with each row's
    seeded key ``k`` (``split.sort_samples``' generator drawn in chunks in input order is the same
    sequence; with ``--part`` a key of the row alone, ``parts.row_keys``). Returns its relation."""
    rng = np.random.default_rng([cfg.seed, 0xA11CE]) if cfg.part is None else None
    reader = con.sql(f"SELECT * FROM {ranked} ORDER BY r").to_arrow_reader(FETCH_ROWS)
    writer = _LazyWriter(spool2, **SPOOL_OPTIONS)
    try:
        for b in itertools.chain(reader, [pa.RecordBatch.from_pylist([], schema=reader.schema)]):
            if b.num_rows == 0 and writer.writer is not None:
                continue  # (an empty batch still writes: a part may keep no task at all)
            t = pa.Table.from_batches([b])
            k = rng.random(t.num_rows) if rng is not None else parts.row_keys(t.column("r").to_numpy(), cfg.seed)
            writer.write(t.append_column("k", pa.array(k)))
    finally:
        writer.close()
        reader.close()
    return f"read_parquet({_sql_str(spool2)})"


# ------------------------------------------------------------------------------------ helpers


class _LazyWriter:
    """A Parquet file written a table at a time, opened at the first one: the files here take
    their schema from what the first batch turns out to hold (``schema``: None until then)."""

    def __init__(self, path: Path, **options):
        self.path, self.options = path, options
        self.writer: Optional[pq.ParquetWriter] = None
        self.schema: Optional[pa.Schema] = None

    def write(self, table: pa.Table, **kw) -> None:
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, table.schema, **self.options)
            self.schema = table.schema
        self.writer.write_table(table, **kw)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _norm_list(a) -> pa.ListArray:
    """Any list array (DuckDB names its items ``l``) → ``list<item: int64>`` as ``convert`` builds it."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    lens = pc.list_value_length(a).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pc.list_flatten(a).cast(pa.int64()))


def _order_key(cfg: PrepareConfig) -> str:
    return "ts" if cfg.split_by == "time" else "k"


class _NpzStream:
    """An ``.npz`` (as ``np.savez`` writes it) of 1-D arrays that arrive in chunks: each array is
    spooled to a raw file, then copied into the zip behind its ``.npy`` header."""

    def __init__(self, path: Path, work: Path, dtypes: Dict[str, str]):
        self.path, self.dtypes, self.n = path, dtypes, 0
        self.raw = {k: work / f"{path.stem}.{k}.raw" for k in dtypes}
        self.files = {k: open(p, "wb") for k, p in self.raw.items()}

    def add(self, **arrays: np.ndarray) -> None:
        for k, a in arrays.items():
            self.files[k].write(np.ascontiguousarray(a, dtype=self.dtypes[k]).tobytes())
        self.n += len(next(iter(arrays.values())))

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        with zipfile.ZipFile(self.path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for k, dtype in self.dtypes.items():
                with zf.open(f"{k}.npy", "w", force_zip64=True) as out, open(self.raw[k], "rb") as raw:
                    np.lib.format.write_array_header_1_0(
                        out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                              "shape": (self.n,)})
                    shutil.copyfileobj(raw, out, 1 << 22)
                self.raw[k].unlink()


# ------------------------------------------------------------------------------------ 4. target encoding


def _target_encoding(con, ranked: str, m: Mapping, nm: _Names, cfg: PrepareConfig, n_train: int,
                     tmp: Path, work: Path) -> Tuple[List[Dict], float]:
    """Fit the tables on the train split's written samples; write their ``.npz``; leave each as a
    DuckDB table ``te<i>`` (id, s, n) for the write query to join."""
    if not cfg.target_encoding:
        return [], 0.0
    keep = cfg.query + cfg.max_support
    cols = ", ".join(nm.cat[c] for c in cfg.target_encoding)
    con.execute(
        f"CREATE TABLE tw AS SELECT y, {cols} FROM ("
        f"SELECT y, {cols}, row_number() OVER (PARTITION BY rank ORDER BY {_order_key(cfg)} DESC, r DESC) AS rn "
        f"FROM {ranked} WHERE rank < {int(n_train)}) WHERE rn <= {keep}"
    )
    total, count = _one(con, "SELECT sum(y::DOUBLE), count(*) FROM tw")
    g = float(total) / count if count else 0.0
    (tmp / te.TE_DIR).mkdir()
    entries = []
    for i, col in enumerate(cfg.target_encoding):
        c = nm.cat[col]
        con.execute(f"CREATE TABLE te{i} AS SELECT {c} AS id, sum(y::DOUBLE) AS s, count(*) AS n FROM tw GROUP BY {c}")
        rel = f"{te.TE_DIR}/{col}.npz"
        npz = _NpzStream(tmp / rel, work, {"ids": "<i8", "sums": "<f8", "counts": "<i8"})
        for b in con.sql(f"SELECT id, s, n FROM te{i} ORDER BY id").to_arrow_reader(FETCH_ROWS):
            npz.add(ids=b.column(0).to_numpy(), sums=b.column(1).to_numpy(), counts=b.column(2).to_numpy())
        npz.close()
        entries.append({"column": col, "prior": float(cfg.target_encoding_prior), "global_mean": g,
                        "features": te.feature_names(col), "file": rel})
    con.execute("DROP TABLE tw")
    return entries, g


# ------------------------------------------------------------------------------------ 5. write


class _Selected:
    """The write query's rows in output order, less each task's rows before its support."""

    def __init__(self, reader, sizes: np.ndarray, query: int, max_support: int):
        self.reader = reader
        self.start = np.cumsum(sizes) - sizes
        self.cut = np.maximum(sizes - query - max_support, 0)
        self.q_start = sizes - query
        self.pending: List[pa.Table] = []
        self.have = 0
        self.pos = 0

    def take(self, n: int) -> pa.Table:
        while self.have < n:
            b = self.reader.read_next_batch()
            rank = b.column("rank").to_numpy()
            pos = self.pos + np.arange(b.num_rows, dtype=np.int64) - self.start[rank]
            self.pos += b.num_rows
            keep = pos >= self.cut[rank]
            t = pa.Table.from_batches([b]).filter(pa.array(keep))
            t = t.append_column("_q", pa.array(pos[keep] >= self.q_start[rank[keep]]))
            self.pending.append(t)
            self.have += t.num_rows
        t = pa.concat_tables(self.pending)
        self.pending = [t.slice(n)]
        self.have -= n
        return t.slice(0, n)


def _te_features(t: pa.Table, cfg: PrepareConfig, g: float, train: bool) -> np.ndarray:
    blocks = []
    y = t.column("y").to_numpy()
    leave_out = np.full(t.num_rows, train)
    for i in range(len(cfg.target_encoding)):
        s = t.column(f"te{i}_s").fill_null(0.0).to_numpy()
        n = t.column(f"te{i}_n").fill_null(0).to_numpy().astype(np.int64)
        blocks.append(te.features_from(s, n, np.where(leave_out, y, 0.0), leave_out, g, cfg.target_encoding_prior))
    return np.concatenate(blocks, axis=1) if blocks else np.zeros((t.num_rows, 0), np.float32)


def _chunk_samples(t: pa.Table, m: Mapping, nm: _Names, cfg: PrepareConfig, g: float, train: bool) -> Samples:
    n = t.num_rows
    dense = (np.stack([t.column(d).to_numpy() for d in nm.dense], axis=1).astype(np.float32)
             if nm.dense else np.zeros((n, 0), np.float32))
    if cfg.target_encoding:
        dense = np.concatenate([dense, _te_features(t, cfg, g, train)], axis=1)
    return Samples(
        row=t.column("r").to_numpy(),
        task=np.zeros(0, np.int64),
        task_names=np.zeros(0, object),
        label=t.column("y").to_numpy(),
        cats={c: t.column(nm.cat[c]).to_numpy() for c in m.categorical},
        multi={c: _norm_list(t.column(nm.multi[c])) for c in m.multi_hot},
        dense=dense,
        time=t.column("ts").to_numpy() if m.time_col else None,
    )


def _written_batch(s: Samples, m: Mapping, nm: _Names, train: bool) -> pa.Table:
    cols = {"tr": pa.array(np.full(len(s), train)), "y": pa.array(s.label)}
    for c in m.categorical:
        cols[nm.cat[c]] = pa.array(s.cats[c])
    for c in m.multi_hot:
        cols[nm.multi[c]] = s.multi[c]
    for j in range(s.dense.shape[1]):
        cols[f"d{j}"] = pa.array(np.ascontiguousarray(s.dense[:, j]))
    return pa.table(cols)


def _write(con, ranked: str, written: Path, tmp: Path, m: Mapping, m_out: Mapping, nm: _Names,
           cfg: PrepareConfig, layout, task_ids: np.ndarray, sizes: np.ndarray, n_train: int, g: float,
           shard_total: int) -> Dict[str, Dict]:
    n_query = np.minimum(sizes, cfg.query)
    n_support = np.minimum(np.maximum(sizes - cfg.query, 0), cfg.max_support)
    sel_off = np.concatenate([[0], np.cumsum(n_support + n_query)]).astype(np.int64)
    joins = "".join(
        f" LEFT JOIN te{i} ON sp.{nm.cat[c]} = te{i}.id" for i, c in enumerate(cfg.target_encoding))
    te_cols = "".join(f", te{i}.s AS te{i}_s, te{i}.n AS te{i}_n" for i in range(len(cfg.target_encoding)))
    sql = (f"SELECT sp.*{te_cols} FROM {ranked} sp{joins} "
           f"ORDER BY sp.rank, sp.{_order_key(cfg)}, sp.r")
    reader = con.sql(sql).to_arrow_reader(FETCH_ROWS)
    rows = _Selected(reader, sizes, cfg.query, cfg.max_support)

    def chunk(t: pa.Table, c: int, d: int, train: bool) -> Tuple[Samples, pa.Table]:
        """Tasks ``c:d`` (their selected rows ``t``) as samples and as a shard's table."""
        s = _chunk_samples(t, m, nm, cfg, g, train)
        isq = t.column("_q").to_numpy(zero_copy_only=False)
        sup = _Columns(s, m_out, np.flatnonzero(~isq), n_support[c:d])
        qry = _Columns(s, m_out, np.flatnonzero(isq), n_query[c:d])
        return s, shard_table(task_ids[c:d], n_support[c:d], n_query[c:d], sup, qry, m_out, s.row,
                              sel_off[c:d + 1] - sel_off[c], 0, d - c)

    info: Dict[str, Dict] = {}
    w_writer = _LazyWriter(written, **SPOOL_OPTIONS)
    empty: List[str] = []  # shards without tasks (only with --part): written once a schema is known
    schema = None
    try:
        for split in fmt.SPLITS:
            (tmp / split).mkdir()
            files: List[str] = []
            n_t = n_s = 0
            for shard, a, b in layout.shards[split]:
                rel = f"{split}/{fmt.part_name(shard, shard_total)}"
                writer = _LazyWriter(tmp / rel)
                try:
                    for c in range(a, b, cfg.rows_per_group):
                        d = min(c + cfg.rows_per_group, b)
                        t = rows.take(int(sel_off[d] - sel_off[c]))
                        train = c < n_train
                        s, table = chunk(t, c, d, train)
                        writer.write(table, row_group_size=cfg.rows_per_group)
                        schema = schema or writer.schema
                        w_writer.write(_written_batch(s, m, nm, train))
                finally:
                    writer.close()
                if a == b:
                    empty.append(rel)
                files.append(rel)
                n_t += b - a
                n_s += int(sel_off[b] - sel_off[a])
            info[split] = {"tasks": n_t, "samples": n_s, "files": files}
    finally:
        w_writer.close()
    for _ in reader:  # the query is finished only once read to its end
        pass
    reader.close()
    if schema is None:  # no task in any shard of this part
        none = con.sql(f"SELECT * FROM {ranked} LIMIT 0").to_arrow_table()
        s, table = chunk(none.append_column("_q", pa.array([], pa.bool_())), 0, 0, False)
        schema = table.schema
        pq.write_table(_written_batch(s, m, nm, False), written, **SPOOL_OPTIONS)
    for rel in empty:
        pq.write_table(schema.empty_table(), tmp / rel)
    return info


# ------------------------------------------------------------------------------------ 6. statistics


def _one(con, sql: str):
    return con.execute(sql).fetchall()[0]


def _id_counts(con, src: str, tmp: Path, work: Path, col: str) -> Tuple[str, Dict]:
    """Train-split id counts of one feature → ``id_counts/<col>.npz`` and its ``access_stats``
    (the ids stream in id order, so only one batch is in memory)."""
    rel = f"{te.ID_COUNTS_DIR}/{col}.npz"
    npz = _NpzStream(tmp / rel, work, {"ids": "<i8", "counts": "<i8"})
    hist = np.zeros(stats.N_SKEW_BINS, np.int64)
    edges = np.asarray(stats.SKEW_EDGES)
    lookups = 0
    for b in con.sql(f"SELECT id, count(*) AS n FROM ({src}) GROUP BY id ORDER BY id").to_arrow_reader(FETCH_ROWS):
        counts = b.column(1).to_numpy().astype(np.int64)
        npz.add(ids=b.column(0).to_numpy(), counts=counts)
        hist += np.bincount(np.searchsorted(edges, counts.astype(np.float64), side="left"),
                            minlength=stats.N_SKEW_BINS)[: stats.N_SKEW_BINS]
        lookups += int(counts.sum())
    npz.close()
    return rel, {"rows": npz.n, "lookups": lookups, "skew": stats.skew_from_histogram(hist)}


def _statistics(con, written: Path, tmp: Path, work: Path, m: Mapping, m_out: Mapping, nm: _Names,
                hashed: Dict[str, bool], part: bool) -> Dict:
    w = f"read_parquet({_sql_str(written)})"
    n_train = int(_one(con, f"SELECT count(*) FROM {w} WHERE tr")[0])
    categorical = [
        {"name": c, "cardinality": int(_one(con, f"SELECT count(DISTINCT {nm.cat[c]}) FROM {w}")[0]),
         "hashed": bool(hashed.get(c, False)), "pooling": 1.0}
        for c in m.categorical]
    lengths = {c: _one(con, f"SELECT sum(len({nm.multi[c]})), count(*), max(len({nm.multi[c]})) FROM {w}")
               for c in m.multi_hot}
    multi_hot = []
    for c in m.multi_hot:
        total, n, longest = lengths[c]
        card = _one(con, f"SELECT count(DISTINCT v) FROM (SELECT unnest({nm.multi[c]}) AS v FROM {w})")[0]
        multi_hot.append({"name": c, "cardinality": int(card), "hashed": bool(hashed.get(c, False)),
                          "pooling": float(total) / n if n else 0.0, "max_len": int(longest) if n else 0})
    row = _train_moments(con, w, len(m_out.dense))
    dense = [{"name": name, **_mean_std(row, j, n_train)} for j, name in enumerate(m_out.dense)]
    lo, hi = row[-2], row[-1]
    label = {**_mean_std(row, len(m_out.dense), n_train),
             "min": float(lo) if n_train else 0.0, "max": float(hi) if n_train else 0.0}
    additive = _additive(con, w, row, lengths, m, m_out, n_train)
    (tmp / te.ID_COUNTS_DIR).mkdir()
    table_stats, id_counts = {}, {}
    sources = {c: f"SELECT {nm.cat[c]} AS id FROM {w} WHERE tr" for c in m.categorical}
    sources.update({c: f"SELECT unnest({nm.multi[c]}) AS id FROM {w} WHERE tr" for c in m.multi_hot})
    if part:  # the distinct ids of every split, for a merged cardinality (task_format: part)
        (tmp / PART_IDS_DIR).mkdir()
        every = {c: f"SELECT {nm.cat[c]} AS id FROM {w}" for c in m.categorical}
        every.update({c: f"SELECT unnest({nm.multi[c]}) AS id FROM {w}" for c in m.multi_hot})
        for c, src in every.items():
            npz = _NpzStream(tmp / PART_IDS_DIR / f"{c}.npz", work, {"ids": "<i8"})
            for b in con.sql(f"SELECT DISTINCT id FROM ({src}) ORDER BY id").to_arrow_reader(FETCH_ROWS):
                npz.add(ids=b.column(0).to_numpy())
            npz.close()
    for c, src in sources.items():
        rel, st = _id_counts(con, src, tmp, work, c)
        id_counts[c] = rel
        table_stats[c] = {"rows": st["rows"], "pooling": float(st["lookups"] / n_train) if n_train else 0.0,
                          "lookups": st["lookups"], "skew": st["skew"]}
    return {"categorical": categorical, "multi_hot": multi_hot, "dense": dense, "label_stats": label,
            "table_stats": table_stats, "id_counts": id_counts, "additive": additive}


def _mean_std(row, j: int, n: int) -> Dict:
    """``schema.json``'s ``mean`` and ``std`` of one column of ``_train_moments``' row."""
    return {"mean": float(row[2 * j]) if n else 0.0,
            "std": stats.safe_std_value(math.sqrt(row[2 * j + 1]) if n else None)}


def _moments(row, j: int, n: int) -> Dict:
    """``mean`` and ``m2`` (the sum of squared deviations) of one column from ``avg, var_pop``:
    merged over parts by Chan et al.'s update (``combine``), exact where sums of squares cancel."""
    mean, var = row[2 * j], row[2 * j + 1]
    return {"mean": float(mean) if n else 0.0, "m2": float(var) * n if n and var is not None else 0.0}


def _train_moments(con, w: str, n_dense: int):
    """``avg, var_pop`` of each dense column and the label, then the label's min and max, over the
    train split's written samples, in one scan on one thread: DuckDB's threads add their partial
    sums in the order they finish, so a parallel scan gave ``schema.json`` means and stds that
    differed in their last digits from one run of the same input to the next."""
    cols = [f"d{j}::DOUBLE" for j in range(n_dense)] + ["y::DOUBLE"]
    threads = _one(con, "SELECT current_setting('threads')")[0]
    con.execute("SET threads = 1")
    try:
        return _one(con, "SELECT " + ", ".join(f"avg({c}), var_pop({c})" for c in cols)
                    + ", min(y::DOUBLE), max(y::DOUBLE) FROM " + f"{w} WHERE tr")
    finally:
        con.execute(f"SET threads = {int(threads)}")


def _additive(con, w: str, row, lengths: Dict, m: Mapping, m_out: Mapping, n_train: int) -> Dict:
    """What merges over parts (``task_format``: ``part``), so that ``combine`` recomputes the
    merged means, stds and pooling from the parts' schemas alone, never rereading a shard: counts
    and sums add, and (n, mean, m2) triples merge exactly. ``row``: ``_train_moments``; ``lengths``:
    each multi-hot column's (ids, samples, longest), scanned once by ``_statistics``."""
    dense = [{"name": n, **_moments(row, j, n_train)} for j, n in enumerate(m_out.dense)]
    lo, hi = row[-2:]
    multi = []
    for c in m.multi_hot:
        total, n, longest = lengths[c]
        multi.append({"name": c, "ids": int(total or 0), "samples": int(n), "max_len": int(longest or 0)})
    return {"train_samples": n_train, "samples": int(_one(con, f"SELECT count(*) FROM {w}")[0]),
            "dense": dense, "label": {**_moments(row, len(m_out.dense), n_train),
                                      "min": None if lo is None else float(lo),
                                      "max": None if hi is None else float(hi)},
            "multi_hot": multi}


# ------------------------------------------------------------------------------------ the engine


def _connect(work: Path, cfg: PrepareConfig):
    (work / "duckdb_tmp").mkdir()
    return duckdb.connect(str(work / "work.duckdb"), config={
        "memory_limit": cfg.memory_limit,
        "temp_directory": str(work / "duckdb_tmp"),
        "preserve_insertion_order": False,
    })


def prepare_ooc(files: Sequence[Path], m: Mapping, cfg: PrepareConfig, tmp: Path, progress: bool) -> Tuple[Dict, Dict]:
    """Write the splits, target-encoding tables and id counts into ``tmp``; return
    ``(schema.json, prepare's result)`` (``prepare.prepare`` writes the schema)."""
    sources = open_all(list(files), m)
    work = tmp / WORK_DIR
    work.mkdir()
    nm = _Names(m)
    spool1 = work / "spool1.parquet"
    read = _read(sources, m, cfg, spool1, progress)
    if read.kept_rows == 0:
        raise DataError(f"no rows left in {len(files)} input file(s) after skipping bad rows ({_kv(read.skipped)})")
    te.check_columns(cfg.target_encoding, m.categorical, m.dense)
    m_out = Mapping(**{**m.__dict__, "dense": list(m.dense) + [n for c in cfg.target_encoding
                                                              for n in te.feature_names(c)]})
    part = cfg.part_index()
    con = _connect(work, cfg)
    try:
        names, all_sizes = _task_list(con, spool1)
        kept, dropped = filter_tasks(all_sizes, cfg.min_task_size, cfg.max_task_size)
        if part is None:
            layout = assign_splits(np.flatnonzero(kept), names, cfg.valid_frac, cfg.test_frac, cfg.shards, cfg.seed,
                                   dropped, folds=cfg.folds, fold=cfg.fold)
        else:
            layout = parts.assign_part(np.flatnonzero(kept), names, cfg.valid_frac, cfg.test_frac, cfg.shards,
                                       cfg.seed, part, dropped)
        n_tasks = int(layout.order.size)
        kept_names = names[layout.order]
        task_ids = kept_names.astype(str)
        con.register("ranks", pa.table({"name": pa.array(kept_names, pa.string()),
                                        "rank": pa.array(np.arange(n_tasks, dtype=np.int64))}))
        ranked = _ranked(spool1)
        if cfg.split_by == "random":
            ranked = _rank(con, ranked, work / "spool2.parquet", cfg)
        sizes = all_sizes[layout.order]
        n_train = int(layout.counts["train"])
        te_entries, g = _target_encoding(con, ranked, m, nm, cfg, n_train, tmp, work)
        split_info = _write(con, ranked, work / "written.parquet", tmp, m, m_out, nm, cfg, layout,
                            task_ids, sizes, n_train, g, cfg.shards)
        st = _statistics(con, work / "written.parquet", tmp, work, m, m_out, nm, read.hashed, part is not None)
    finally:
        con.close()
    shutil.rmtree(work)
    n_query = np.minimum(sizes, cfg.query)
    n_support = np.minimum(np.maximum(sizes - cfg.query, 0), cfg.max_support)
    summary = {
        "input_rows": read.input_rows,
        "tasks_in": int(names.size),
        "tasks_kept": n_tasks,
        "dropped": dropped,
        "rows_skipped": read.skipped,
        "samples_truncated": int(sizes.sum() - n_support.sum() - n_query.sum()),
        **({"part_rows": read.part_rows} if part is not None else {}),
    }
    schema = {
        "format_version": fmt.FORMAT_VERSION,
        "task_col": m.task_col,
        "label": {"name": m.label_col, "kind": m.label_kind},
        "time_col": m.time_col,
        "categorical": st["categorical"],
        "multi_hot": st["multi_hot"],
        "dense": st["dense"],
        "label_stats": st["label_stats"],
        "table_stats": st["table_stats"],
        "support_query": {"query": cfg.query, "max_support": cfg.max_support, "split_by": cfg.split_by},
        **({"folds": {"folds": cfg.folds, "fold": cfg.fold, "seed": cfg.seed}} if cfg.folds else {}),
        **({"part": parts.schema_entry(part, st["additive"])} if part is not None else {}),
        "splits": split_info,
        "summary": summary,
        "target_encoding": te_entries,
        "id_counts": st["id_counts"],
    }
    result = dict(
        summary,
        samples=int(sum(s["samples"] for s in split_info.values())),
        splits={k: {"tasks": v["tasks"], "samples": v["samples"]} for k, v in split_info.items()},
    )
    return schema, result

