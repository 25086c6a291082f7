"""Find and read the sample-level input files of ``prepare``, and its column mapping.

Why a module of its own: every way reading can fail (path missing, empty directory, corrupt
Parquet, malformed CSV, empty file, missing column) must become a ``DataError`` that names the
file, and the rest of ``prepare`` should only ever see Arrow arrays that exist. It also keeps
the file boundaries (``InputRows``) so that a bad value found later in one concatenated column
can still be reported as "file F, row R".
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")


def _is_data_file(p: Path) -> bool:
    name = p.name.lower()
    return p.is_file() and not name.startswith((".", "_")) and name.endswith(PARQUET_SUFFIXES + CSV_SUFFIXES)


def resolve_inputs(paths: Sequence[str]) -> List[Path]:
    """Input paths → data files, in the order given (a directory's files sorted by name)."""
    if not paths:
        raise DataError("no input given: pass --input FILE_OR_DIR")
    files: List[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if _is_data_file(f))
            if not found:
                raise DataError(f"input directory {raw} contains no .parquet or .csv files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"input {raw} does not exist")
    return files


def find_sidecar(paths: Sequence[str]) -> Optional[Path]:
    """The first ``columns.json`` in an input directory or next to an input file."""
    for raw in paths:
        p = Path(raw)
        d = p if p.is_dir() else p.parent
        if (d / fmt.COLUMNS_SIDECAR).is_file():
            return d / fmt.COLUMNS_SIDECAR
    return None


@dataclass
class Mapping:
    """The resolved role of each input column (sidecar, overridden by explicit config)."""

    task_col: str
    label_col: str
    label_kind: str
    categorical: List[str] = field(default_factory=list)
    multi_hot: List[str] = field(default_factory=list)
    dense: List[str] = field(default_factory=list)
    time_col: Optional[str] = None

    def columns(self) -> List[str]:
        cols = [self.task_col, self.label_col] + self.categorical + self.multi_hot + self.dense
        if self.time_col:
            cols.append(self.time_col)
        return list(dict.fromkeys(cols))  # the task column may also be a categorical feature


_ROLE_KEYS = ("task_col", "label_col", "label_kind", "categorical", "multi_hot", "dense", "time_col")


def resolve_mapping(cfg: PrepareConfig, paths: Sequence[str]) -> Mapping:
    """Explicit config values win; anything left empty comes from the ``columns.json`` sidecar."""
    side: Dict = {}
    sidecar = find_sidecar(paths)
    if sidecar is not None:
        try:
            side = json.loads(sidecar.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"{sidecar}: not a valid columns.json ({e})") from None
        if not isinstance(side, dict):
            raise DataError(f"{sidecar}: expected a JSON object of column roles")
    roles = {}
    for key in _ROLE_KEYS:
        mine = getattr(cfg, key)
        roles[key] = mine if mine not in (None, [], "") else side.get(key)
    for key in ("categorical", "multi_hot", "dense"):
        val = roles[key] or []
        if isinstance(val, str):
            val = [val]
        if not isinstance(val, list) or not all(isinstance(v, str) and v for v in val):
            raise DataError(f"column list '{key}' must be a list of column names, got {val!r}")
        roles[key] = list(val)
    hint = "" if sidecar else " (no columns.json sidecar next to the input)"
    for key, opt in (("task_col", "--task-col"), ("label_col", "--label-col"), ("label_kind", "--label-kind")):
        if not roles[key]:
            raise DataError(f"no {key.replace('_', ' ')} given: pass {opt}{hint}")
    if roles["label_kind"] not in ("click", "rating"):
        raise DataError(f"label kind must be 'click' or 'rating', got {roles['label_kind']!r}")
    m = Mapping(**roles)
    _check_roles(m)
    if cfg.split_by == "time" and not m.time_col:
        raise DataError("split_by=time needs a time column: pass --time-col, or --split-by random")
    return m


def _check_roles(m: Mapping) -> None:
    seen: Dict[str, str] = {}
    for role in ("categorical", "multi_hot", "dense"):
        for col in getattr(m, role):
            if col in seen:
                raise DataError(f"column '{col}' is listed as both {seen[col]} and {role}")
            seen[col] = role
    if m.label_col in seen or m.label_col in (m.task_col, m.time_col):
        raise DataError(f"label column '{m.label_col}' cannot also be a feature, task or time column")
    if m.time_col and m.time_col == m.task_col:
        raise DataError(f"column '{m.time_col}' cannot be both the task and the time column")


@dataclass
class InputRows:
    """Per-file Arrow tables plus row offsets, to turn a global row number into file + row."""

    files: List[Path]
    tables: List[pa.Table]
    offsets: np.ndarray  # len(files) + 1; global row r belongs to file i: offsets[i] <= r < offsets[i+1]

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def locate(self, row: int) -> str:
        i = int(np.searchsorted(self.offsets, row, side="right") - 1)
        local = int(row - self.offsets[i])
        if self.files[i].name.lower().endswith(CSV_SUFFIXES):
            return f"{self.files[i]}: row {local} (line {local + 2})"
        return f"{self.files[i]}: row {local}"

    def chunks(self, col: str) -> List[pa.Array]:
        return [t.column(col).combine_chunks() for t in self.tables]


def _read_one(path: Path, columns: List[str]) -> pa.Table:
    name = path.name.lower()
    try:
        if name.endswith(CSV_SUFFIXES):
            delim = "\t" if name.endswith(".tsv") else ","
            table = pacsv.read_csv(
                path,
                parse_options=pacsv.ParseOptions(delimiter=delim),
                convert_options=pacsv.ConvertOptions(strings_can_be_null=True),
            )
        else:
            schema = pq.read_schema(path)
            missing = [c for c in columns if c not in schema.names]
            if missing:
                _missing(path, missing, schema.names)
            table = pq.read_table(path, columns=columns)
    except DataError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot read {path}: {msg}") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        _missing(path, missing, table.column_names)
    if table.num_rows == 0:
        raise DataError(f"{path}: file has no rows")
    return table.select(columns)


def _missing(path: Path, missing: List[str], have: Sequence[str]) -> None:
    shown = ", ".join(list(have)[:20]) + (" ..." if len(have) > 20 else "")
    raise DataError(f"{path}: missing column(s) {', '.join(repr(c) for c in missing)} (file has: {shown})")


def read_inputs(files: List[Path], columns: List[str]) -> InputRows:
    tables = [_read_one(f, columns) for f in files]
    sizes = np.array([t.num_rows for t in tables], dtype=np.int64)
    return InputRows(files=files, tables=tables, offsets=np.concatenate([[0], np.cumsum(sizes)]))
