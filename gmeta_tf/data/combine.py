"""``gmeta data combine``: the part directories of ``prepare --part I/N`` → one prepared data set.

Why: a large input is prepared by N processes (a Kubernetes Indexed Job), each writing only the
shards ``s`` with ``s % N == I`` of one hash-based task assignment into a directory of its own.
Training wants one directory with one ``schema.json``. The shard files need no rewriting (their
names carry the global shard index), so they are hard-linked (copied across filesystems) into
``OUT/<split>/``; only the statistics have to be put together.

How each ``schema.json`` field is combined (``task_format.py`` documents the fields, ``stats.py``
their definitions):

* settings (``format_version``, ``task_col``, ``label``, ``time_col``, the features' names,
  order and ``hashed``, ``support_query``, ``folds``, the shard count in the file names): must be
  equal in every part, else a ``DataError`` names the part directory and the field;
* ``splits``: files listed together, ``tasks`` and ``samples`` added (tasks are disjoint);
* ``summary``: every count added (each part counts what it read and kept; if every part reports
  the whole input's ``input_rows`` this sum overstates it -- ``summary`` is informational);
* ``id_counts/<col>.npz`` (train-split samples per id): ids united, counts added -- exact;
* ``table_stats`` (``stats.access_stats``): recomputed from the combined id counts (rows =
  distinct ids, lookups = their sum, skew from the counts) -- exact; left out when a part has
  no id counts (``gmeta data stats`` recomputes it);
* ``cardinality`` (distinct ids over *all* splits): distinct sets overlap between parts, so it
  cannot be added and the train-only id counts do not cover valid/test: recomputed from the
  shard files' id columns, one file at a time (memory: one file plus the distinct ids);
* multi-hot ``pooling`` / ``max_len``, dense ``mean`` / ``std`` and ``label_stats``: recomputed
  in the same pass from counts, means and sums of squared deviations merged file by file (train
  split for dense and label, as ``prepare``). Combining the parts' own mean/std would be exact
  too except for a column that is constant within a part: ``stats`` writes its std as 1.0,
  which cannot be told from a real 1.0;
* ``target_encoding``: refused. Each part fitted its tables on its own train tasks and wrote the
  features into its shards, so the shards would disagree with any combined table; prepare a
  target-encoded data set in one piece.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import pyarrow.parquet as pq

from gmeta_tf.data import stats
from gmeta_tf.data import target_encoding as te
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.atomic import atomic_dir, check_target
from gmeta_tf.errors import DataError

_SHARD = re.compile(r"part-(\d+)-of-(\d+)\.parquet")


@dataclass(frozen=True)
class Part:
    """One part directory and what its ``schema.json`` says about it."""

    path: Path
    schema: dict
    index: int
    count: int


def _feature_names(schema: dict, key: str) -> List:
    return [[e["name"], bool(e.get("hashed", False))] for e in schema.get(key) or []]


# (field, how to read it): what must be equal in every part for the shards to belong together.
_SETTINGS: Tuple[Tuple[str, Callable[[dict], object]], ...] = (
    ("format_version", lambda s: s.get("format_version")),
    ("task_col", lambda s: s.get("task_col")),
    ("label", lambda s: s.get("label")),
    ("time_col", lambda s: s.get("time_col")),
    ("categorical", lambda s: _feature_names(s, "categorical")),
    ("multi_hot", lambda s: _feature_names(s, "multi_hot")),
    ("dense", lambda s: [e["name"] for e in s.get("dense") or []]),
    ("support_query", lambda s: s.get("support_query")),
    ("folds", lambda s: s.get("folds")),
    ("id_counts", lambda s: sorted(s.get("id_counts") or {})),
)


def load_part(path: str) -> Part:
    schema = fmt.load_schema(path)
    part = schema.get("part")
    where = f"{Path(path) / fmt.SCHEMA_FILE}"
    if not isinstance(part, dict) or not all(isinstance(part.get(k), int) for k in ("index", "count")):
        raise DataError(f"{where}: field 'part' must be {{\"index\": I, \"count\": N}}; "
                        f"is '{path}' written by 'gmeta data prepare --part I/N'?")
    if not (part["count"] >= 1 and 0 <= part["index"] < part["count"]):
        raise DataError(f"{where}: field 'part' index {part['index']} is not in [0, {part['count']})")
    if schema.get("target_encoding"):
        raise DataError(f"{where}: field 'target_encoding': each part fitted its own tables and wrote their "
                        f"features into its shards, so parts cannot be combined; prepare it in one piece")
    return Part(Path(path), schema, part["index"], part["count"])


def check_parts(parts: Sequence[Part]) -> None:
    """The parts are parts 0 … N−1 of one run, each exactly once, with the same settings."""
    if not parts:
        raise DataError("no part directories given")
    first = parts[0]
    for p in parts[1:]:
        if p.count != first.count:
            raise DataError(f"{p.path}: field 'part.count' is {p.count}, but {first.path} has {first.count}")
        for name, get in _SETTINGS:
            if get(p.schema) != get(first.schema):
                raise DataError(f"{p.path}: field '{name}' is {json.dumps(get(p.schema))}, "
                                f"but {first.path} has {json.dumps(get(first.schema))}")
    seen: Dict[int, Path] = {}
    for p in parts:
        if p.index in seen:
            raise DataError(f"{p.path}: field 'part.index' {p.index} is also the index of {seen[p.index]}")
        seen[p.index] = p.path
    missing = sorted(set(range(first.count)) - set(seen))
    if missing:
        raise DataError(f"part(s) {', '.join(f'{i}/{first.count}' for i in missing)} missing "
                        f"(given {len(parts)} of {first.count}: {', '.join(str(p.path) for p in parts)})")


def _shards(parts: Sequence[Part], split: str) -> List[Tuple[int, Part, str]]:
    """``(global shard index, part, file)`` of one split, checked: each shard from the part that
    owns it (``s % N == I``), once, and all of ``0 … S−1`` together."""
    out, totals = [], set()
    for p in parts:
        for rel in p.schema["splits"][split]["files"]:
            m = _SHARD.fullmatch(os.path.basename(rel))
            if not m:
                raise DataError(f"{p.path}: field 'splits.{split}.files' has {rel!r}, not a part-NNNNN-of-NNNNN file")
            s, total = int(m.group(1)), int(m.group(2))
            if s % p.count != p.index:
                raise DataError(f"{p.path}: field 'splits.{split}.files' has shard {s}, which belongs to part "
                                f"{s % p.count}/{p.count}, not {p.index}/{p.count}")
            out.append((s, p, rel))
            totals.add(total)
    if len(totals) > 1:
        raise DataError(f"split '{split}': the parts' shard files count different totals {sorted(totals)} "
                        f"(field 'splits.{split}.files'; prepared with different --shards)")
    have = sorted(s for s, _, _ in out)
    total = totals.pop() if totals else 0
    if have != list(range(total)):
        gaps = sorted(set(range(total)) - set(have)) or sorted(s for s in have if have.count(s) > 1)
        raise DataError(f"split '{split}': shard(s) {gaps[:5]} of {total} missing or given twice across the parts")
    return sorted(out, key=lambda x: x[0])


def _place(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` to ``dst`` (True), or copy it where links are impossible (False)."""
    try:
        os.link(src, dst)
        return True
    except OSError:
        shutil.copy2(src, dst)
        return False


class _Moments:
    """Count, mean and sum of squared deviations per column, merged a file at a time (Chan et
    al.'s pairwise update: the sums-of-squares combination without its cancellation)."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: np.ndarray) -> None:
        if not x.shape[0]:
            return
        n_b, mean_b = x.shape[0], x.mean(axis=0)
        m2_b = np.square(x - mean_b).sum(axis=0)
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (n_b / n)
        self.m2 = self.m2 + m2_b + np.square(delta) * (self.n * n_b / n)
        self.n = n

    def stats(self, j: int) -> Tuple[float, float]:
        """``(mean, std)`` of column j as ``stats`` writes them (empty: 0, 1; constant: std 1.0)."""
        if not self.n:
            return 0.0, 1.0
        sd = float(np.sqrt(np.atleast_1d(self.m2)[j] / self.n))
        return float(np.atleast_1d(self.mean)[j]), sd if sd > 1e-12 else 1.0


@dataclass
class _Scan:
    """Running totals over the shard files: what the statistics that cannot be added need."""

    distinct: Dict[str, List[np.ndarray]] = field(default_factory=dict)
    multi_ids: Dict[str, int] = field(default_factory=dict)
    max_len: Dict[str, int] = field(default_factory=dict)
    samples: int = 0
    dense: _Moments = field(default_factory=_Moments)  # train split, as prepare
    label: _Moments = field(default_factory=_Moments)
    label_range: Tuple[float, float] = (np.inf, -np.inf)

    def add_ids(self, name: str, ids: np.ndarray) -> None:
        buf = self.distinct.setdefault(name, [])
        buf.append(np.unique(ids))
        if sum(b.size for b in buf) > 4_000_000:  # fold the buffer: memory stays ~ distinct ids
            self.distinct[name] = [np.unique(np.concatenate(buf))]

    def cardinality(self, name: str) -> int:
        return int(np.unique(np.concatenate(self.distinct.get(name) or [np.zeros(0, np.int64)])).size)


def _scan_file(scan: _Scan, path: Path, schema: dict, train: bool) -> None:
    cats = [c["name"] for c in schema["categorical"]]
    multis = [c["name"] for c in schema["multi_hot"]]
    cols = [fmt.N_SUPPORT, fmt.N_QUERY] + [fmt.cat_col(w, c) for w in fmt.SETS for c in cats]
    cols += [fmt.multi_col(w, c) for w in fmt.SETS for c in multis]
    if train:
        cols += [f(w) for w in fmt.SETS for f in (fmt.label_col, fmt.dense_col)]
    try:
        t = pq.read_table(path, columns=cols)
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{path}: cannot read the shard's columns: {str(e).splitlines()[0]}") from None
    scan.samples += int(np.sum(t[fmt.N_SUPPORT].to_numpy()) + np.sum(t[fmt.N_QUERY].to_numpy()))
    for c in cats:
        scan.add_ids(c, np.concatenate([fmt.flat_ids(t[fmt.cat_col(w, c)].combine_chunks()) for w in fmt.SETS]))
    for c in multis:
        per_sample = [t[fmt.multi_col(w, c)].combine_chunks().flatten() for w in fmt.SETS]
        lens = np.concatenate([np.diff(s.offsets.to_numpy()) for s in per_sample])
        scan.multi_ids[c] = scan.multi_ids.get(c, 0) + int(lens.sum())
        scan.max_len[c] = max(scan.max_len.get(c, 0), int(lens.max()) if lens.size else 0)
        scan.add_ids(c, np.concatenate([fmt.flat_ids(s) for s in per_sample]))
    if train:
        _scan_train(scan, t, len(schema["dense"]))


def _scan_train(scan: _Scan, t, n_dense: int) -> None:
    y = np.concatenate([t[fmt.label_col(w)].combine_chunks().flatten().to_numpy(zero_copy_only=False)
                        for w in fmt.SETS]).astype(np.float64)
    scan.label.add(y[:, None])
    if y.size:
        scan.label_range = (min(scan.label_range[0], float(y.min())), max(scan.label_range[1], float(y.max())))
    x = np.concatenate([t[fmt.dense_col(w)].combine_chunks().flatten().flatten().to_numpy(zero_copy_only=False)
                        for w in fmt.SETS]).astype(np.float64)
    scan.dense.add(x.reshape(-1, n_dense))


def _feature_stats(schema: dict, scan: _Scan) -> Dict:
    dense = [scan.dense.stats(j) for j in range(len(schema["dense"]))]
    label_mean, label_std = scan.label.stats(0)
    lo, hi = scan.label_range if scan.label.n else (0.0, 0.0)
    return {
        "categorical": [dict(c, cardinality=scan.cardinality(c["name"])) for c in schema["categorical"]],
        "multi_hot": [dict(c, cardinality=scan.cardinality(c["name"]),
                           pooling=scan.multi_ids.get(c["name"], 0) / scan.samples if scan.samples else 0.0,
                           max_len=scan.max_len.get(c["name"], 0)) for c in schema["multi_hot"]],
        "dense": [{"name": e["name"], "mean": m, "std": sd} for e, (m, sd) in zip(schema["dense"], dense)],
        "label_stats": {"mean": label_mean, "std": label_std, "min": lo, "max": hi},
    }


def _add(a, b):
    """Counts added, recursively through dicts (``summary``)."""
    if isinstance(a, dict):
        return {k: _add(a.get(k, 0), b.get(k, 0)) for k in {**a, **b}}
    return a + b


def _merge_id_counts(parts: Sequence[Part], tmp: Path) -> Tuple[Dict[str, str], Dict[str, Dict]]:
    """``id_counts/<col>.npz`` of all parts united (ids sorted, counts added), and the
    ``table_stats`` that follow from them; both empty when the parts have none."""
    cols = sorted(parts[0].schema.get("id_counts") or {})
    merged: Dict[str, np.ndarray] = {}
    train_samples = sum(int(p.schema["splits"]["train"]["samples"]) for p in parts)
    for col in cols:
        ids, counts = [], []
        for p in parts:
            with np.load(p.path / p.schema["id_counts"][col]) as z:
                ids.append(z["ids"].astype(np.int64))
                counts.append(z["counts"].astype(np.int64))
        u, inv = np.unique(np.concatenate(ids), return_inverse=True)
        merged[col] = (u, np.bincount(inv, weights=np.concatenate(counts), minlength=u.size).astype(np.int64))
    files = {}
    if cols:
        (tmp / te.ID_COUNTS_DIR).mkdir()
    for col, (u, c) in merged.items():
        rel = f"{te.ID_COUNTS_DIR}/{col}.npz"
        np.savez(tmp / rel, ids=u, counts=c)
        files[col] = rel
    tables = {col: {"rows": int(u.size), "pooling": float(c.sum() / train_samples) if train_samples else 0.0,
                    "lookups": int(c.sum()), "skew": [round(x, 6) for x in stats.skew_histogram(c)]}
              for col, (u, c) in merged.items()}
    return files, tables


def _write_splits(parts: Sequence[Part], tmp: Path, scan: _Scan) -> Tuple[Dict, int, int]:
    splits, linked, copied = {}, 0, 0
    for split in fmt.SPLITS:
        (tmp / split).mkdir()
        files = []
        for _, p, rel in _shards(parts, split):
            name = f"{split}/{os.path.basename(rel)}"
            if _place(p.path / rel, tmp / name):
                linked += 1
            else:
                copied += 1
            _scan_file(scan, tmp / name, parts[0].schema, split == "train")
            files.append(name)
        splits[split] = {"tasks": sum(int(p.schema["splits"][split]["tasks"]) for p in parts),
                         "samples": sum(int(p.schema["splits"][split]["samples"]) for p in parts),
                         "files": files}
    return splits, linked, copied


def combine(part_dirs: Sequence[str], out: str, overwrite: bool = False) -> Dict:
    """Combine ``part_dirs`` (any order) into ``out``; return a summary.

    All-or-nothing (``atomic_dir``): on any ``DataError`` ``out`` is left as it was.
    """
    out_p = Path(out)
    check_target(out_p, overwrite)
    parts = sorted((load_part(d) for d in part_dirs), key=lambda p: p.index)
    check_parts(parts)
    for p in parts:
        if out_p.resolve() == p.path.resolve() or out_p.resolve() in p.path.resolve().parents:
            raise DataError(f"--out {out} would replace part directory {p.path}; choose another --out")
    scan = _Scan()
    with atomic_dir(out_p, overwrite) as tmp:
        splits, linked, copied = _write_splits(parts, tmp, scan)
        id_files, table_stats = _merge_id_counts(parts, tmp)
        summary = parts[0].schema.get("summary") or {}
        for p in parts[1:]:
            summary = _add(summary, p.schema.get("summary") or {})
        schema = {k: v for k, v in parts[0].schema.items() if k not in ("part", "table_stats", "id_counts")}
        schema.update(_feature_stats(parts[0].schema, scan), splits=splits, summary=summary, target_encoding=[])
        if id_files:
            schema.update(id_counts=id_files, table_stats=table_stats)
        (tmp / fmt.SCHEMA_FILE).write_text(json.dumps(schema, indent=2) + "\n")
    return {"out": str(out_p), "parts": len(parts), "linked": linked, "copied": copied,
            "splits": {k: {"tasks": v["tasks"], "samples": v["samples"]} for k, v in splits.items()}}


def format_summary(s: Dict) -> str:
    sp = s["splits"]
    return (f"combined {s['parts']} part(s) into {s['out']}: train {sp['train']['tasks']:,} / valid "
            f"{sp['valid']['tasks']:,} / test {sp['test']['tasks']:,} tasks; shard files "
            f"{s['linked']} hard-linked, {s['copied']} copied")
