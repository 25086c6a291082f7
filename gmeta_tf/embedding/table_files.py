"""The checkpoint's table files: one module writes them, reads them and re-cuts them.

A checkpoint directory ``ckpt-<step>`` holds ``tables/<name>.npz`` per TFRA table (arrays
``keys`` int64 ``[N]`` and ``values`` float32 ``[N, dim]``) and ``tables/<name>.<slot>.npz`` per
optimizer slot table (``item.m``, ``item.v``). A column-split table is saved as its blocks
(``item.c0of2.npz``, ``item.c0of2.m.npz``, ... see ``column_split.block_name``). Rows are exported
row by row (``de.Variable.export``) rather than through TF's saveables, so the same code saves
local tables and tables sharded over parameter servers (rank 0 pulls the rows from every PS),
and a restore can re-shard onto a different number of PS or another column split.

``read_table`` needs no TFRA table, nor TFRA itself (this module does not import it): model
export and inspection tools read a checkpoint's rows through it, whole, whatever split the run
used.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.errors import CheckpointError

TABLES_DIR = "tables"


def slot_name(slot_var) -> str:
    """The slot part of a TFRA slot variable's name ``<table var>/<shadow>/<slot>`` (``m``)."""
    return slot_var.name.rsplit("/", 1)[-1]


def export_variable(var) -> tuple[np.ndarray, np.ndarray]:
    keys, values = var.export()
    return keys.numpy(), values.numpy()


def import_variable(var, keys: np.ndarray, values: np.ndarray, chunk: int = 1 << 18) -> None:
    """Upsert ``keys``/``values`` into a de.Variable in chunks (bounded RPC size to a PS)."""
    for lo in range(0, len(keys), chunk):
        var.upsert(tf.constant(keys[lo:lo + chunk], tf.int64),
                   tf.constant(values[lo:lo + chunk], var.value_dtype))


def table_file(tables_dir: str, key: str) -> str:
    """``<tables_dir>/<key>.npz``: ``key`` is a table (``item``, ``item.c0of2``) or one of its
    slot tables (``item.m``)."""
    return storage.join(tables_dir, f"{key}.npz")


def slot_key(table_name: str, slot_var) -> str:
    """The file key of a slot table: ``<table>.<slot>`` (``item.m``)."""
    return f"{table_name}.{slot_name(slot_var)}"


# The file key suffix of a counted table's update counts (``model.max_rows``): ``<table>.frequency``.
FREQUENCY = "frequency"


def files_of(tables: Sequence, emb_opt) -> Dict[str, object]:
    """``{file key: de.Variable}`` of every TFRA table, its optimizer slot tables and, for a
    counted table, its update counts (what eviction reads: saved, so a resume evicts alike)."""
    out = {}
    for table in tables:
        out[table.name] = table.variable
        for slot in table.slot_variables(emb_opt.for_shadow(table.shadow)):
            out[slot_key(table.name, slot)] = slot
        if getattr(table, "frequency", None) is not None:
            out[f"{table.name}.{FREQUENCY}"] = table.frequency
    return out


def write_rows(checkpoint_dir: str, rows: Iterable[Tuple[str, np.ndarray, np.ndarray]]) -> Dict[str, int]:
    """Write each ``(file key, keys, values)`` to its file under ``checkpoint_dir/tables`` (each
    written whole: ``storage.write_bytes``); returns the rows written per key (``meta.json``
    lists them). ``rows`` may be a generator: one table's rows in memory at a time."""
    tables_dir = storage.join(checkpoint_dir, TABLES_DIR)
    storage.makedirs(tables_dir)
    written = {}
    for key, keys, values in rows:
        storage.write_bytes(table_file(tables_dir, key), storage.npz_bytes(keys=keys, values=values))
        written[key] = int(len(keys))
    return written


def restore_tables(checkpoint_dir: str, variables: Dict[str, object], table_names: Sequence[str]) -> None:
    """Replace every variable's rows with its file's, re-cutting a table saved under another
    column split; ``table_names`` are the model's (feature-level) table names."""
    for key, var in variables.items():
        got = load_rows(checkpoint_dir, key, table_names)
        var.clear()
        if got is not None:
            import_variable(var, *got)


def load_rows(checkpoint_dir: str, key: str, table_names: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """The ``(keys, values)`` a restore gives file key ``key`` (a table, a column block, a slot
    table), re-cut when the checkpoint holds it under another column split; None for update
    counts a checkpoint of a run without ``model.max_rows`` does not have (they start at 0)."""
    tables_dir = storage.join(checkpoint_dir, TABLES_DIR)
    f = table_file(tables_dir, key)
    if storage.exists(f):
        return _load(f)
    if key.endswith(f".{FREQUENCY}"):
        return None
    # saved under another column split of the table (plan changed, or evaluation)
    got = load_resplit(tables_dir, key, table_names)
    if got is None:
        raise CheckpointError(f"checkpoint {checkpoint_dir} has no table file {storage.basename(f)}")
    return got


def read_table(checkpoint_dir: str, table_name: str) -> Tuple[np.ndarray, np.ndarray]:
    """``(keys, values)`` of one model table (or ``<table>.<slot>``) of checkpoint
    ``checkpoint_dir``, whole: a column-split table's blocks are joined. Creates no TFRA table."""
    tables_dir = storage.join(checkpoint_dir, TABLES_DIR)
    f = table_file(tables_dir, table_name)
    if storage.exists(f):
        return _load(f)
    pieces = table_name.split(".")
    # The model table is a dot-separated prefix of the key (``item`` of ``item.m``).
    candidates = [".".join(pieces[:i]) for i in range(len(pieces), 0, -1)]
    got = next((r for r in (load_resplit(tables_dir, table_name, [c]) for c in candidates) if r is not None), None)
    if got is None:
        raise CheckpointError(f"checkpoint {checkpoint_dir} has no rows of table {table_name!r} "
                              f"(no {storage.basename(f)} and no column blocks of it)")
    return got


_BLOCK = re.compile(r"^\.c(\d+)of(\d+)")


def parse_saved_key(key: str, tables: Sequence[str]) -> Optional[Tuple[str, Optional[Tuple[int, int]], str]]:
    """``item.c1of2.m`` -> ``("item", (1, 2), ".m")``; ``item.v`` -> ``("item", None, ".v")``."""
    for t in sorted(tables, key=len, reverse=True):
        if key == t or key.startswith(t + "."):
            rest = key[len(t):]
            m = _BLOCK.match(rest)
            block = (int(m.group(1)), int(m.group(2))) if m else None
            rest = rest[m.end():] if m else rest
            if rest == "" or re.fullmatch(r"\.[^.]+", rest):
                return t, block, rest
    return None


def _load(f: str) -> Tuple[np.ndarray, np.ndarray]:
    data = storage.load_npz(f)
    return data["keys"], data["values"]


def _whole_from_blocks(tables_dir: str, table: str, slot: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    pat = re.compile(rf"^{re.escape(table)}\.c(\d+)of(\d+){re.escape(slot)}\.npz$")
    found = {}
    for name in storage.listdir(tables_dir):
        m = pat.match(name)
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = storage.join(tables_dir, name)
    for n, blocks in sorted(found.items()):
        if sorted(blocks) != list(range(n)):
            continue
        keys0, vals0 = _load(blocks[0])
        order = np.argsort(keys0)
        keys, parts = keys0[order], [vals0[order]]
        for i in range(1, n):
            k, v = _load(blocks[i])
            o = np.argsort(k)
            if not np.array_equal(k[o], keys):
                raise CheckpointError(f"{blocks[i]}: its ids differ from {storage.basename(blocks[0])}'s; the column blocks "
                                      f"of table {table!r} cannot be joined")
            parts.append(v[o])
        return keys, np.concatenate(parts, axis=1)
    return None


def load_resplit(tables_dir: str, key: str, tables: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Rows for ``key`` from a checkpoint saved with another column split of the same table.

    Lets a run be re-planned between restarts (whole <-> column blocks, or n -> m blocks) and
    lets evaluation, which always builds whole local tables, read a column-split run.
    ``None`` when the checkpoint holds the table in no usable form.
    """
    parsed = parse_saved_key(key, tables)
    if parsed is None:
        return None
    table, block, slot = parsed
    whole = storage.join(tables_dir, f"{table}{slot}.npz")
    full = _load(whole) if storage.exists(whole) else _whole_from_blocks(tables_dir, table, slot)
    if full is None or block is None:
        return full
    keys, values = full
    i, n = block
    if values.shape[1] % n:
        return None
    w = values.shape[1] // n
    return keys, np.ascontiguousarray(values[:, i * w:(i + 1) * w])


