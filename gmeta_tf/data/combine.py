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
* ``summary``: the counts of each part's own tasks and rows added; the whole input's counts
  (``task_format.WHOLE_INPUT_COUNTS``: every part checked all of it) taken once;
* ``id_counts/<col>.npz`` (train-split samples per id): ids united, counts added -- exact;
* ``table_stats`` (``stats.access_stats``): recomputed from the combined id counts (rows =
  distinct ids, lookups = their sum, skew from the counts) -- exact; left out when a part has
  no id counts (``gmeta data stats`` recomputes it);
* ``cardinality`` (distinct ids over *all* splits): distinct sets overlap between parts, so it
  cannot be added: the parts' ``part_ids/<feature>.npz`` united (memory: the distinct ids);
* multi-hot ``pooling`` / ``max_len``, dense ``mean`` / ``std`` and ``label_stats``: from the
  parts' ``part`` entries -- id and sample counts added, (n, mean, m2) merged by Chan et al.'s
  update (train split for dense and label, as ``prepare``).

So combine reads the parts' schemas and id files, never a shard: its cost is the distinct ids,
not the samples, whatever the size of the log the N machines prepared.
* ``target_encoding``: refused. Each part fitted its tables on its own train tasks and wrote the
  features into its shards, so the shards would disagree with any combined table; prepare a
  target-encoded data set in one piece.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

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
    if not src.is_file():
        raise DataError(f"{src}: shard file missing (listed in {src.parent.parent / fmt.SCHEMA_FILE})")
    try:
        os.link(src, dst)
        return True
    except OSError:
        shutil.copy2(src, dst)
        return False


def _merge_moments(entries: Sequence[Dict], counts: Sequence[int]) -> Tuple[float, float]:
    """``(mean, std)`` of parts' ``(n, mean, m2)`` (Chan et al.: m2 = Σ m2ᵢ + Σ nᵢ (meanᵢ − mean)²),
    as ``prepare`` writes them: empty 0 and 1, constant std 1.0 (``stats.safe_std_value``)."""
    n = sum(counts)
    if not n:
        return 0.0, 1.0
    mean = sum(c * e["mean"] for e, c in zip(entries, counts)) / n
    m2 = sum(e["m2"] + c * (e["mean"] - mean) ** 2 for e, c in zip(entries, counts))
    return float(mean), stats.safe_std_value(np.sqrt(m2 / n))


def _cardinality(parts: Sequence[Part], name: str) -> int:
    ids = []
    for p in parts:
        path = p.path / fmt.PART_IDS_DIR / f"{name}.npz"
        try:
            with np.load(path) as z:
                ids.append(z["ids"])
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{path}: cannot read the part's distinct ids: {str(e).splitlines()[0]}; "
                            f"is '{p.path}' written by 'gmeta data prepare --part'?") from None
    return int(np.unique(np.concatenate(ids)).size)


_ENTRY_KEYS = {"dense": ("mean", "m2"), "label": ("mean", "m2", "min", "max"),
               "multi_hot": ("ids", "samples", "max_len")}


def _part_entry(p: Part) -> Dict:
    """``p``'s ``part`` entry, checked to hold what ``_feature_stats`` merges (``task_format``)."""
    e, where = p.schema["part"], f"{p.path / fmt.SCHEMA_FILE}: field 'part"
    again = "prepared by another version? prepare the part again with 'gmeta data prepare --part'"
    for key in ("train_samples", "samples", *_ENTRY_KEYS):
        if key not in e:
            raise DataError(f"{where}.{key}' is missing; {again}")
    for key in ("dense", "multi_hot"):
        if not isinstance(e[key], list) or len(e[key]) != len(p.schema[key]):
            raise DataError(f"{where}.{key}' must list one entry per feature of '{key}' "
                            f"({len(p.schema[key])}); {again}")
    for key, fields in _ENTRY_KEYS.items():
        for i, entry in enumerate(e[key] if key != "label" else [e[key]]):
            lacking = [f for f in fields if not isinstance(entry, dict) or f not in entry]
            if lacking:
                at = f"{key}[{i}]" if key != "label" else key
                raise DataError(f"{where}.{at}' lacks {', '.join(lacking)}; {again}")
    return e


def _feature_stats(parts: Sequence[Part]) -> Dict:
    """Every statistic that cannot be added, from the parts' ``part`` entries and distinct ids."""
    schema, entries = parts[0].schema, [_part_entry(p) for p in parts]
    n_train = [int(e["train_samples"]) for e in entries]
    samples = sum(int(e["samples"]) for e in entries)
    dense = [_merge_moments([e["dense"][j] for e in entries], n_train) for j in range(len(schema["dense"]))]
    label = _merge_moments([e["label"] for e in entries], n_train)
    ranges = [(e["label"]["min"], e["label"]["max"]) for e in entries if e["label"]["min"] is not None]
    multi = {c["name"]: [e["multi_hot"][k] for e in entries] for k, c in enumerate(schema["multi_hot"])}
    lo, hi = (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else (0.0, 0.0)
    return {
        "categorical": [dict(c, cardinality=_cardinality(parts, c["name"])) for c in schema["categorical"]],
        "multi_hot": [dict(c, cardinality=_cardinality(parts, c["name"]),
                           pooling=sum(m["ids"] for m in multi[c["name"]]) / samples if samples else 0.0,
                           max_len=max(m["max_len"] for m in multi[c["name"]]))
                      for c in schema["multi_hot"]],
        "dense": [{"name": e["name"], "mean": m, "std": sd} for e, (m, sd) in zip(schema["dense"], dense)],
        "label_stats": {"mean": label[0], "std": label[1], "min": float(lo), "max": float(hi)},
    }


def _summary(parts: Sequence[Part]) -> Dict:
    """What each part kept, added; the whole input's counts, once."""
    summary = parts[0].schema.get("summary") or {}
    for p in parts[1:]:
        summary = _add(summary, p.schema.get("summary") or {})
    return {**summary, **{k: v for k, v in (parts[0].schema.get("summary") or {}).items()
                          if k in fmt.WHOLE_INPUT_COUNTS}}


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


def _write_splits(parts: Sequence[Part], tmp: Path) -> Tuple[Dict, int, int]:
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
    with atomic_dir(out_p, overwrite) as tmp:
        splits, linked, copied = _write_splits(parts, tmp)
        if not splits["train"]["tasks"]:  # each part may lack tasks; the whole data set may not
            raise DataError(f"the {len(parts)} part(s) hold no train task together (field 'splits.train.tasks' "
                            f"is 0 in every part); check --min-task-size / --max-task-size")
        id_files, table_stats = _merge_id_counts(parts, tmp)
        schema = {k: v for k, v in parts[0].schema.items() if k not in ("part", "table_stats", "id_counts")}
        schema.update(_feature_stats(parts), splits=splits, summary=_summary(parts), target_encoding=[])
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
