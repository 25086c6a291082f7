"""``prepare --part I/N``: N machines prepare one log, each writing a disjoint set of shards.

Why not the seeded shuffle of ``split.assign_splits``: it is a permutation of *all* kept tasks, so
a task's split and shard depend on which other tasks exist. For N independently prepared parts to
add up to one data set every decision must be a function of the task alone:

* a task's **split** comes from the first 8 bytes of ``blake2b(seed, task id)`` as a uniform
  number in [0, 1): below ``test_frac`` test, below ``test_frac + valid_frac`` valid, else train;
* its **shard** is the next 8 bytes modulo ``shards``; within a shard tasks are ordered by those
  8 bytes, then by task id;
* part I of N keeps the shards s with ``s % N == I`` (so N <= shards);
* ``split_by=random`` keys each sample by a hash of (seed, its input row) instead of a generator
  drawn over the kept samples (which would depend on the part).

``--part 0/1`` is then the whole data set with this assignment, and its shard files equal the
union of the N parts' files. The hash is computed once per task (the task list is held whole),
never per row.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Tuple

import numpy as np

from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.split import SplitLayout
from gmeta_tf.errors import DataError


def task_hashes(names: np.ndarray, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per task: (uniform [0, 1) for the split, uint64 for the shard and the order)."""
    u = np.empty(names.size, np.float64)
    h = np.empty(names.size, np.uint64)
    prefix = f"{int(seed)}\0".encode()
    for i, name in enumerate(names.tolist()):  # once per task
        d = hashlib.blake2b(prefix + str(name).encode("utf-8"), digest_size=16).digest()
        u[i] = (int.from_bytes(d[:8], "little") >> 11) / float(1 << 53)
        h[i] = int.from_bytes(d[8:], "little")
    return u, h


def assign_part(task_codes: np.ndarray, task_names: np.ndarray, valid_frac: float, test_frac: float, shards: int,
                seed: int, part: Tuple[int, int], dropped: Optional[Dict[str, int]] = None) -> SplitLayout:
    """The ``SplitLayout`` of part ``part = (I, N)``: only its shards' tasks, in output order."""
    k = int(task_codes.size)
    if k == 0:
        why = ", ".join(f"{r}={c:,}" for r, c in (dropped or {}).items())
        raise DataError(f"no tasks left after filtering ({why or 'no rows'}); check --min-task-size / --max-task-size")
    index, count = part
    names = task_names[task_codes].astype(str)
    u, h = task_hashes(names, seed)
    split_of = np.where(u < test_frac, 2, np.where(u < test_frac + valid_frac, 1, 0))
    shard_of = (h % np.uint64(shards)).astype(np.int64)
    fracs = {"train": 1.0 - valid_frac - test_frac, "valid": valid_frac, "test": test_frac}
    for j, name in enumerate(fmt.SPLITS):
        if fracs[name] > 0 and not (split_of == j).any():
            raise DataError(
                f"split '{name}' would get no tasks: only {k:,} task(s) kept with "
                f"{name}_frac={fracs[name]:g}; use more data, a larger fraction or a smaller --min-task-size"
            )
    # one sort: split, shard, hash, task id (lexsort's last key is the primary one)
    by = np.lexsort((names, h, shard_of, split_of))
    order: List[np.ndarray] = []
    ranges: Dict[str, List[Tuple[int, int, int]]] = {}
    counts: Dict[str, int] = {}
    pos = 0
    for j, name in enumerate(fmt.SPLITS):
        ranges[name] = []
        counts[name] = 0
        if fracs[name] <= 0:
            continue
        for s in range(shards):
            if s % count != index:
                continue
            chunk = by[(split_of[by] == j) & (shard_of[by] == s)]
            order.append(task_codes[chunk])
            ranges[name].append((s, pos, pos + chunk.size))
            pos += chunk.size
            counts[name] += int(chunk.size)
    return SplitLayout(order=np.concatenate(order) if order else np.zeros(0, np.int64), shards=ranges, counts=counts)


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def row_keys(rows: np.ndarray, seed: int) -> np.ndarray:
    """``split_by=random``'s sort key of input rows under ``--part``: splitmix64 of (seed, row) as
    a uniform [0, 1) double, vectorized (the same for a row in every part)."""
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + np.uint64((int(seed) * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) % (1 << 64))
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def schema_entry(part: Tuple[int, int], sums: Dict) -> Dict:
    """``schema.json``'s ``part``: which part this is, and the additive statistics (``task_format``)."""
    return {"index": int(part[0]), "count": int(part[1]), **sums}
