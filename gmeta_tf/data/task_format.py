"""The Meta-IO on-disk format: the contract between ``prepare`` (writer) and ``metaio`` (reader).

A prepared dataset is a directory::

    OUT/
      schema.json                      feature roles, cardinalities, statistics (see below)
      train/part-00000-of-00004.parquet
      ...
      valid/part-0000i-of-0000N.parquet
      test/part-0000i-of-0000N.parquet

One Parquet row per task (task-major). Worker rank ``r`` of ``n`` reads the part files whose
index ``i`` satisfies ``i % n == r`` (``shard_files``), so ranks read disjoint tasks.

Columns of a row (``S`` = this task's support size, ``Q`` = its query size, both variable):

=============================  ===============================  ===============================
column                         Arrow type                       meaning
=============================  ===============================  ===============================
``task_id``                    string                           the input task id, as a string
``n_support`` / ``n_query``    int32                            S and Q
``support.label``              list<float32>  (len S)           click 0/1 or rating
``support.dense``              list<list<float32>> (S × D)      raw dense features, schema order
``support.time``               list<int64>   (len S)            timestamp, only with a time column
``support.cat.<name>``         list<int64>   (len S)            categorical id, >= 0
``support.multi.<name>``       list<list<int64>> (S × var)      multi-hot ids, >= 0
``query.*``                    same as ``support.*`` with Q     the query samples
``sample_index``               list<int64> (S + Q)              input row numbers, support then
                                                                query (lets tests prove nothing
                                                                is lost or duplicated)
=============================  ===============================  ===============================

Ids are non-negative int64: integer inputs are kept, strings are hashed (``hash_strings``).
``PAD_ID`` (-1) is what the reader pads with, so it can never collide with a real id. The files
always hold the real ids; with ``data.min_id_count`` the *reader* turns rare ones into ``RARE_ID``.

Target encoding (``prepare.target_encoding``, ``target_encoding.py``) adds no column: its two
features per encoded column, ``te.<col>.mean`` and ``te.<col>.log_count``, are ordinary dense
features appended after the input's dense columns (``support.dense`` / ``query.dense`` get wider,
``schema.json``'s ``dense`` lists them with their train statistics). So the format version stays 1:
a reader of version 1 reads such a dataset correctly, and a dataset without the new keys means
"no target encoding, no id counts". Beside the splits::

    OUT/target_encoding/<col>.npz      ids (int64, sorted), sums (float64), counts (int64):
                                       labels per id over the train split's written samples
    OUT/id_counts/<col>.npz            ids (int64, sorted), counts (int64): train-split samples
                                       per id, for every categorical and multi-hot feature

``schema.json`` (``format_version`` 1)::

    {"format_version": 1,
     "task_col": "...", "label": {"name": "...", "kind": "click"|"rating"},
     "time_col": "..." | null,
     "categorical": [{"name", "cardinality", "hashed", "pooling": 1.0}],
     "multi_hot":   [{"name", "cardinality", "hashed", "pooling": <mean ids/sample>, "max_len"}],
     "dense":       [{"name", "mean", "std"}],            # statistics of the train split
     "label_stats": {"mean", "std", "min", "max"},        # min/max: absent in data prepared before them
     "table_stats": {<table>: {"rows", "pooling", "lookups", "skew": [17 shares]}},  # train split,
                                                           # for ``gmeta plan`` (optional)
     "support_query": {"query", "max_support", "split_by"},
     "target_encoding": [{"column", "prior", "global_mean", "features": [2 names], "file"}],
     "id_counts": {<feature>: "id_counts/<feature>.npz"},   # both optional (absent = none)
     "splits": {"train": {"tasks", "samples", "files": [...]}, "valid": ..., "test": ...},
     "summary": {"input_rows", "tasks_in", "tasks_kept", "dropped": {<reason>: count},
                 "rows_skipped": {<reason>: count}, "samples_truncated",
                 "part_rows"},                            # only with --part, see below
     "part": {...}}                                       # only with --part, see below

A **part** (``gmeta data prepare --part I/N``, ``data/parts.py``) is one of N directories that
together make one data set: tasks are assigned to splits and shards by a hash of (task id, seed),
and every machine reads and checks the whole input but keeps only the rows of its tasks, those
of the shards ``s`` with ``s % N == I``, and writes only those shards (file names keep the data
set's ``part-<s>-of-<shards>``). Its ``schema.json`` describes the part alone, and says how to
merge (``gmeta data combine``)::

     "part": {"index": I, "count": N,
              "samples": <written samples, all splits>, "train_samples": <of the train split>,
              "dense": [{"name", "mean", "m2"}],              # train split, float64, schema order
              "label": {"mean", "m2", "min", "max"},          # train split (min/max null: none)
              "multi_hot": [{"name", "ids", "samples", "max_len"}]}   # all splits: ids = sum of lengths

Additive over parts (sum them, or min/max; ``mean`` and ``m2``, the sum of squared deviations
from the mean over ``train_samples``, merge by Chan et al.'s update): everything in ``part``, ``splits.*.tasks`` /
``samples`` / ``files`` (concatenate), ``summary.tasks_in`` / ``tasks_kept`` / ``dropped`` /
``samples_truncated`` / ``part_rows`` (counts of the part's own tasks, disjoint between parts;
``part_rows``: the input rows of the part's tasks that passed the bad-row checks, i.e. the rows
it spooled), the ``id_counts`` tables (add counts per id) and ``part_ids/<feature>.npz``
(``ids``: the distinct ids of the part's written samples, all splits; union them for
``cardinality``). From these the merged ``dense`` / ``label_stats`` mean and std (population:
``sqrt(m2/n)``), ``pooling``, ``max_len``, ``cardinality`` and ``table_stats`` (from the merged
id counts) follow. The same in every part (take one, ``WHOLE_INPUT_COUNTS``):
``summary.input_rows`` and ``rows_skipped`` (the whole input's: every part checks every row),
and the roles. So the combined ``summary`` is ``--part 0/1``'s. Each part's own ``categorical`` / ``multi_hot`` /
``dense`` / ``label_stats`` / ``table_stats`` are the part's statistics. Target encoding and
``folds`` are refused with ``--part``. A shard that gets no task is an empty file (0 rows);
with N > 1 a part with no task, or none in a split, is legal (only ``--part 0/1`` refuses an
empty split or no kept task: a part cannot see the other parts' tasks).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from gmeta_tf.errors import DataError

FORMAT_VERSION = 1
SCHEMA_FILE = "schema.json"
PART_IDS_DIR = "part_ids"  # a part's distinct ids per feature, all splits (``part`` above)
# ``summary`` counts of the whole input, the same in every part (``part`` above): taken once.
# (``tasks_in`` and ``dropped`` count the part's own tasks: added like ``tasks_kept``.)
WHOLE_INPUT_COUNTS = ("input_rows", "rows_skipped")
COLUMNS_SIDECAR = "columns.json"  # written by ``gmeta data synth`` next to its Parquet files
SPLITS = ("train", "valid", "test")
PAD_ID = -1
# The one id every rare id of a feature is read as under ``data.min_id_count`` (Meta-IO,
# ``metaio/rare_ids.py``): the largest int64, which prepared ids practically never take (hashed
# ids are 63-bit hashes; an integer input id equal to it is refused when rare ids are pooled)
# and which, unlike a negative id, the model embeds like any other id.
RARE_ID = 0x7FFF_FFFF_FFFF_FFFF

TASK_ID = "task_id"
N_SUPPORT = "n_support"
N_QUERY = "n_query"
SAMPLE_INDEX = "sample_index"
SETS = ("support", "query")


def label_col(which: str) -> str:
    return f"{which}.label"


def dense_col(which: str) -> str:
    return f"{which}.dense"


def time_col(which: str) -> str:
    return f"{which}.time"


def cat_col(which: str, name: str) -> str:
    return f"{which}.cat.{name}"


def multi_col(which: str, name: str) -> str:
    return f"{which}.multi.{name}"


def table_id_columns(schema: dict) -> Dict[str, List[str]]:
    """``{table: [support column, query column]}`` in table order (categorical, then multi-hot):
    where each embedding table's ids are, for code that counts them (stats, id profile)."""
    out = {c["name"]: [cat_col(w, c["name"]) for w in SETS] for c in schema["categorical"]}
    out.update({c["name"]: [multi_col(w, c["name"]) for w in SETS] for c in schema["multi_hot"]})
    return out


def flat_ids(column) -> np.ndarray:
    """Every id of an id column (``list<int64>`` or ``list<list<int64>>`` Arrow array) as int64."""
    while hasattr(column, "flatten") and str(column.type).startswith(("list", "large_list")):
        column = column.flatten()
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def part_name(index: int, total: int) -> str:
    return f"part-{index:05d}-of-{total:05d}.parquet"


def shard_files(files: Sequence[str], rank: int, size: int) -> List[str]:
    """The part files rank ``rank`` of ``size`` reads: every ``size``-th, starting at ``rank``."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in [0, {size})")
    if len(files) < size:
        raise ValueError(
            f"{len(files)} data shard(s) cannot feed {size} workers: re-run prepare with --shards >= {size}"
        )
    return [f for i, f in enumerate(sorted(files)) if i % size == rank]


def hash_strings(values: Sequence[str]) -> np.ndarray:
    """Stable (process- and platform-independent) 63-bit hash of strings → non-negative int64."""
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        digest = hashlib.blake2b(str(v).encode("utf-8"), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF
    return out


def schema_fingerprint(schema: dict) -> dict:
    """What a model trained on this data depends on: each feature's role, name and position,
    and whether its ids are hashed strings. Statistics and sizes are left out (new rows of the
    same columns are the same data for a model); a reordered dense column or an id column
    re-prepared as strings is not. ``gmeta train`` records it, and whatever later feeds the
    model data (resume, ``gmeta eval``, an export) compares it with ``fingerprint_difference``.
    """
    features = [["label", schema["label"]["name"], schema["label"]["kind"]]]
    features += [["categorical", c["name"], "hashed" if c.get("hashed") else "int"] for c in schema["categorical"]]
    features += [["multi_hot", c["name"], "hashed" if c.get("hashed") else "int"] for c in schema["multi_hot"]]
    features += [["dense", c["name"], "float"] for c in schema["dense"]]
    body = {"format_version": schema.get("format_version", FORMAT_VERSION), "features": features}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return {**body, "sha256": digest}


def fingerprint_difference(expected: dict, actual: dict) -> Optional[str]:
    """The first way ``actual`` (the data offered) differs from ``expected`` (the data trained
    on), in words naming the feature; None when they match."""
    if expected.get("sha256") == actual.get("sha256"):
        return None
    old = [tuple(f) for f in expected.get("features", [])]
    new = [tuple(f) for f in actual.get("features", [])]
    for role in ("label", "categorical", "multi_hot", "dense"):
        a = [f[1:] for f in old if f[0] == role]
        b = [f[1:] for f in new if f[0] == role]
        if a == b:
            continue
        names_a, names_b = [x[0] for x in a], [x[0] for x in b]
        if names_a != names_b and sorted(names_a) == sorted(names_b):
            return f"{role} features are in another order: trained on {names_a}, got {names_b}"
        if names_a != names_b:
            return f"{role} features differ: trained on {names_a}, got {names_b}"
        for (name, was), (_, now) in zip(a, b):
            if was != now:
                return f"{role} feature '{name}' was {was} when trained, is {now} here"
    return "format_version differs" if expected.get("format_version") != actual.get("format_version") else \
        "schema fingerprint differs"

# --------------------------------------------------------------------------------------------
# reading a prepared dataset's schema and files
# --------------------------------------------------------------------------------------------
def load_schema(path: str) -> dict:
    """Read ``<path>/schema.json``, refusing anything but ``FORMAT_VERSION``.

    Part of the format contract (not of the reader) so that every user of a prepared dataset
    (Meta-IO, table statistics, id profiles, the planner) checks it the same way without importing
    Meta-IO.
    """
    file = os.path.join(path, SCHEMA_FILE)
    if not os.path.isfile(file):
        raise DataError(f"{file}: not found; is '{path}' a directory written by 'gmeta data prepare'?")
    try:
        with open(file, "r", encoding="utf-8") as f:
            schema = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{file}: cannot be read as JSON: {e}") from None
    if not isinstance(schema, dict):
        raise DataError(f"{file}: expected a JSON object, got {type(schema).__name__}")
    version = schema.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"{file}: format_version {version!r} is not supported (this reader reads version "
            f"{FORMAT_VERSION}); re-run 'gmeta data prepare'"
        )
    for key in ("categorical", "multi_hot", "dense"):
        entries = schema.get(key) or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e for e in entries):
            raise DataError(f"{file}: '{key}' must be a list of objects with a 'name'")
    return schema


def split_files(path: str, split: str, schema: Optional[dict] = None) -> List[str]:
    """All part files of ``split``, sorted (the order ``shard_files`` assigns ranks by).

    When ``schema.json`` lists the split's files they must all be present: a half-copied
    dataset would otherwise train silently on a subset.
    """
    if split not in SPLITS:
        raise DataError(f"unknown split '{split}'; expected one of {', '.join(SPLITS)}")
    folder = os.path.join(path, split)
    found = sorted(
        os.path.join(folder, f) for f in (os.listdir(folder) if os.path.isdir(folder) else []) if f.endswith(".parquet")
    )
    listed = (((schema or {}).get("splits") or {}).get(split) or {}).get("files")
    if listed:
        have = {os.path.basename(f) for f in found}
        missing = [f for f in listed if os.path.basename(f) not in have]
        if missing:
            raise DataError(
                f"split '{split}': schema.json lists {len(listed)} file(s) but {missing[0]!r} "
                f"is missing from {folder}"
            )
        wanted = {os.path.basename(f) for f in listed}
        found = [f for f in found if os.path.basename(f) in wanted]
    if not found:
        raise DataError(f"split '{split}' has no Parquet files in {folder}")
    return found
