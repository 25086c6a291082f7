"""Streamed reading of ``prepare``'s input files, for the out-of-core engine (``ooc.py``).

Why a module of its own: the in-memory reader (``read_input``) sees each whole file at once, so
two decisions come for free there that a batch cannot make alone, and that must come out the same
or the two engines would write different data:

* the **type of a CSV column**: ``read_csv`` infers it over the whole file, ``open_csv`` from the
  first block only. ``open_all`` reads each CSV once up front (one batch in memory at a time) and
  widens a column whose later block does not fit (null → int64 → float64 → string), then streams
  it with those types fixed;
* whether an id column is **hashed**: as soon as one file holds strings, every file's ids are
  hashed as strings (``convert._id_values``); a CSV multi-hot column is read as integers only when
  every piece of the file is one. ``decisions`` computes both over all files before any batch is
  converted.

Every file is opened (and checked: readable, has the columns, has rows) before the first batch is
converted, in input order, so a broken file is reported as the in-memory reader reports it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from gmeta_tf.data.convert import MULTI_HOT_SEPARATOR, _kind, _plain
from gmeta_tf.data.read_input import CSV_SUFFIXES, InputRows, Mapping, _missing
from gmeta_tf.errors import DataError

BATCH_ROWS = 1 << 16  # rows per Parquet batch (CSV batches are one 1 MiB block)
_CSV_COLUMN = re.compile(r"In CSV column #(\d+)")
_WIDER = {"null": pa.int64(), "int": pa.float64(), "bool": pa.string(), "float": pa.string()}


@dataclass
class BatchRows(InputRows):
    """One batch of one file: ``locate`` reports the row within the file, as ``InputRows`` does."""

    file_row: int = 0  # the batch's first row within its file

    def locate(self, row: int) -> str:
        local = int(row) + self.file_row
        if self.files[0].name.lower().endswith(CSV_SUFFIXES):
            return f"{self.files[0]}: row {local} (line {local + 2})"
        return f"{self.files[0]}: row {local}"


@dataclass
class Source:
    """One opened input file: its (final) column types, row count and how to stream it."""

    path: Path
    columns: List[str]
    types: Dict[str, pa.DataType]
    num_rows: int
    split_strings: Dict[str, bool] = field(default_factory=dict)  # CSV multi-hot pieces not all integers
    csv_types: Optional[Dict[str, pa.DataType]] = None  # CSV: the types to read it with

    @property
    def is_csv(self) -> bool:
        return self.path.name.lower().endswith(CSV_SUFFIXES)

    def batches(self) -> Iterator[Tuple[pa.Table, int]]:
        """``(batch, its first row within the file)``, in file order."""
        at = 0
        try:
            if self.is_csv:
                reader = _open_csv(self.path, self.columns, self.csv_types)
                for b in reader:
                    yield pa.Table.from_batches([b]).select(self.columns), at
                    at += b.num_rows
            else:
                for b in pq.ParquetFile(self.path).iter_batches(batch_size=BATCH_ROWS, columns=self.columns):
                    yield pa.Table.from_batches([b]).select(self.columns), at
                    at += b.num_rows
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _cannot_read(self.path, e) from None


def _cannot_read(path: Path, e: Exception) -> DataError:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return DataError(f"cannot read {path}: {msg}")


def _csv_options(path: Path):
    delim = "\t" if path.name.lower().endswith(".tsv") else ","
    return pacsv.ParseOptions(delimiter=delim)


def _open_csv(path: Path, columns: Optional[List[str]], types: Optional[Dict[str, pa.DataType]]):
    return pacsv.open_csv(
        path,
        parse_options=_csv_options(path),
        convert_options=pacsv.ConvertOptions(
            strings_can_be_null=True, column_types=types or {}, include_columns=columns or []),
    )


def _pieces_are_ints(a: pa.Array) -> bool:
    """``convert._multi_hot``'s test on one batch of a CSV multi-hot cell column."""
    flat = pc.utf8_trim_whitespace(_plain(pc.list_flatten(pc.split_pattern(a, MULTI_HOT_SEPARATOR))))
    flat = flat.filter(pc.fill_null(pc.not_equal(flat, ""), True))
    try:
        flat.cast(pa.int64())
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


def _open_csv_file(path: Path, columns: List[str], multi_hot: List[str]) -> Source:
    """Read the CSV once, widening any column a later block does not fit, as ``read_csv`` would."""
    try:
        names = _open_csv(path, None, None).schema.names  # infers from the first block only
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _cannot_read(path, e) from None
    missing = [c for c in columns if c not in names]
    if missing:
        _missing(path, missing, names)
    types: Dict[str, pa.DataType] = {}
    while True:
        try:
            reader = _open_csv(path, columns, types)
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _cannot_read(path, e) from None
        n, ints = 0, {c: True for c in multi_hot if _kind(_plain_type(reader.schema.field(c).type)) == "string"}
        try:
            for b in reader:
                n += b.num_rows
                for c in ints:
                    ints[c] = ints[c] and _pieces_are_ints(_plain(b.column(c)))
        except pa.ArrowInvalid as e:
            m = _CSV_COLUMN.search(str(e))
            if not m:
                raise _cannot_read(path, e) from None
            col = names[int(m.group(1))]  # the index counts the file's columns
            if col not in columns:
                raise _cannot_read(path, e) from None
            wider = _WIDER.get(_kind(reader.schema.field(col).type), None)
            if wider is None or types.get(col) == wider:
                raise _cannot_read(path, e) from None
            types[col] = wider
            continue
        except (pa.ArrowException, OSError, ValueError) as e:
            raise _cannot_read(path, e) from None
        if n == 0:
            raise DataError(f"{path}: file has no rows")
        final = {c: reader.schema.field(c).type for c in columns}
        return Source(path, columns, final, n, split_strings={c: not ok for c, ok in ints.items()},
                      csv_types={**types, **{c: final[c] for c in columns}})


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.string() if pa.types.is_large_string(t) else t


def _open_parquet(path: Path, columns: List[str]) -> Source:
    try:
        pf = pq.ParquetFile(path)
        schema = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise _cannot_read(path, e) from None
    missing = [c for c in columns if c not in schema.names]
    if missing:
        _missing(path, missing, schema.names)
    if pf.metadata.num_rows == 0:
        raise DataError(f"{path}: file has no rows")
    return Source(path, columns, {c: schema.field(c).type for c in columns}, int(pf.metadata.num_rows))


def open_all(files: List[Path], m: Mapping) -> List[Source]:
    """Open and check every input file (in order) before any is converted."""
    cols = m.columns()
    return [_open_csv_file(f, cols, m.multi_hot) if f.name.lower().endswith(CSV_SUFFIXES) else _open_parquet(f, cols)
            for f in files]


def decisions(sources: List[Source], m: Mapping) -> Dict[str, bool]:
    """``{id column: hashed as strings?}`` over every file, as the in-memory converter decides it."""
    out: Dict[str, bool] = {}
    for col in m.categorical:
        out[col] = any(_kind(_plain_type(s.types[col])) == "string" for s in sources)
    for col in m.multi_hot:
        hashed = False
        for s in sources:
            t = _plain_type(s.types[col])
            if _kind(t) == "string":
                hashed = hashed or s.split_strings.get(col, False)
            elif _kind(t) == "list":
                hashed = hashed or _kind(_plain_type(t.value_type)) == "string"
        out[col] = hashed
    return out


def batch_rows(src: Source, table: pa.Table, file_row: int) -> BatchRows:
    return BatchRows(files=[src.path], tables=[table], offsets=np.array([0, table.num_rows], dtype=np.int64),
                     file_row=file_row)
