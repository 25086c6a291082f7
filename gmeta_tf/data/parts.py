"""``prepare --part I/N``: N machines prepare one log, each writing a disjoint set of shards.

Why not the seeded shuffle of ``split.assign_splits``: it is a permutation of *all* kept tasks, so
a task's split and shard depend on which other tasks exist. For N independently prepared parts to
add up to one data set every decision must be a function of the task alone. Two 64-bit values per
task, ``a`` and ``b`` (``task_hashes``), decide:

* a task's **split**: ``a``'s top 53 bits as a uniform number in [0, 1): below ``test_frac``
  test, below ``test_frac + valid_frac`` valid, else train;
* its **shard**: ``b`` modulo ``shards``; within a shard tasks are ordered by ``b``, then by task
  id (UTF-8 bytes, which is code point order);
* part I of N keeps the shards s with ``s % N == I`` (so N <= shards);
* ``split_by=random`` keys each sample by a hash of (seed, its input row) instead of a generator
  drawn over the kept samples (which would depend on the part).

The hash: ``h`` = 64-bit FNV-1a over the 8 little-endian bytes of ``seed`` (as uint64) followed by
the task id's UTF-8 bytes, the id as prepare names it (``convert``: Arrow's cast to string, so the
integer id 12 is ``"12"`` and ``-3`` is ``"-3"``); then ``a``, ``b`` = the first two outputs of
splitmix64 started at ``h`` (``mix(h + γ)``, ``mix(h + 2γ)``), whose finaliser spreads FNV's weak
low bits. It is computed over Arrow's string buffer with numpy, one step per character *position*
(tasks sorted by length, so each step touches only the ids that long: O(total id bytes) work in
O(longest id) numpy calls), never a Python call per task; the same id gives the same values in
every batch, file, process and machine (no Python ``hash``, no dictionary order).

Because a task's shard is a function of its id, a part filters as it reads (``ooc._read``): rows
of other parts' tasks are checked for bad values (so every bad row of the input is still named) and
counted, then dropped before they are spooled, so a part converts, spools, sorts and writes only
about 1/N of the rows. ``--part 0/1`` is then the whole data set with this assignment, and its
shard files equal the union of the N parts' files.

What a part cannot know is whether the *whole* data set is usable: with N > 1 a part without kept
tasks, or without tasks of a split, is legal (it writes empty shards; ``combine`` adds the parts),
while ``--part 0/1`` and the one-machine prepare still refuse "no tasks left after filtering" and
"split ... would get no tasks". ``no rows left ... after skipping bad rows`` is about the whole
input and is raised by every part.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.split import SplitLayout
from gmeta_tf.errors import DataError

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_U64 = (1 << 64) - 1

TaskIds = Union[pa.Array, pa.ChunkedArray, np.ndarray, List]


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 in, uint64 out; wraps)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _unit(z: np.ndarray) -> np.ndarray:
    """A uint64's top 53 bits as a uniform double in [0, 1)."""
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def task_strings(ids: TaskIds) -> pa.LargeStringArray:
    """Task ids as prepare names them (``convert``: Arrow's cast to string), as one Arrow array."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if not isinstance(ids, pa.Array):
        ids = pa.array(ids)  # str → string, int → int64 (cast below as convert casts it)
    if ids.null_count:
        raise ValueError("task ids must not be null")
    return ids.cast(pa.large_string())


def _fnv1a(ids: pa.LargeStringArray, seed: int) -> np.ndarray:
    """64-bit FNV-1a of (seed's 8 little-endian bytes, id bytes) per id: one numpy step per
    character position, over the ids at least that long (sorted longest first)."""
    h0 = _FNV_OFFSET
    for byte in (int(seed) & _U64).to_bytes(8, "little"):
        h0 = ((h0 ^ byte) * _FNV_PRIME) & _U64
    n = len(ids)
    _, off_buf, data_buf = ids.buffers()
    offsets = np.frombuffer(off_buf, np.int64, count=n + 1, offset=ids.offset * 8) if n else np.zeros(1, np.int64)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lens = np.diff(offsets)
    by_len = np.argsort(-lens, kind="stable")
    starts, longest_first = offsets[:-1][by_len], lens[by_len]
    # how many ids are longer than p, for every position p (longest_first is non-increasing)
    active = np.searchsorted(-longest_first, -np.arange(int(lens.max()) if n else 0), side="left")
    h = np.full(n, h0, np.uint64)
    prime = np.uint64(_FNV_PRIME)
    with np.errstate(over="ignore"):
        for p, k in enumerate(active.tolist()):  # once per character position, not per task
            h[:k] = (h[:k] ^ data[starts[:k] + p].astype(np.uint64)) * prime
    out = np.empty(n, np.uint64)
    out[by_len] = h
    return out


def task_hashes(ids: TaskIds, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per task: (uniform [0, 1) for the split, uint64 for the shard and the order); the module
    docstring defines them. ``ids``: strings or integers (named as prepare names them)."""
    h = _fnv1a(task_strings(ids), seed)
    with np.errstate(over="ignore"):
        a = _mix(h + np.uint64(_GAMMA))
        b = _mix(h + np.uint64((2 * _GAMMA) & _U64))
    return _unit(a), b


def shard_of(ids: TaskIds, seed: int, shards: int) -> np.ndarray:
    """Each task's shard (int64), as ``assign_part`` gives it."""
    return (task_hashes(ids, seed)[1] % np.uint64(shards)).astype(np.int64)


def in_part(ids: TaskIds, seed: int, shards: int, part: Tuple[int, int]) -> np.ndarray:
    """Which tasks part ``(I, N)`` writes (bool per task): those whose shard s has ``s % N == I``."""
    return shard_of(ids, seed, shards) % int(part[1]) == int(part[0])


def assign_part(task_codes: np.ndarray, task_names: np.ndarray, valid_frac: float, test_frac: float, shards: int,
                seed: int, part: Tuple[int, int], dropped: Optional[Dict[str, int]] = None) -> SplitLayout:
    """The ``SplitLayout`` of part ``part = (I, N)``: only its shards' tasks, in output order.

    ``task_codes`` index ``task_names``; tasks of other parts are left out here too, so passing
    every task of the input gives the same layout as passing the part's own. With N > 1 the
    whole-data-set checks are left to the one-machine run (module docstring)."""
    k = int(task_codes.size)
    index, count = part
    if k == 0 and count == 1:
        why = ", ".join(f"{r}={c:,}" for r, c in (dropped or {}).items())
        raise DataError(f"no tasks left after filtering ({why or 'no rows'}); check --min-task-size / --max-task-size")
    names = task_strings(task_names).take(pa.array(np.asarray(task_codes, np.int64)))
    u, h = task_hashes(names, seed)
    split_of = np.where(u < test_frac, 2, np.where(u < test_frac + valid_frac, 1, 0))
    shard_of_ = (h % np.uint64(shards)).astype(np.int64)
    fracs = {"train": 1.0 - valid_frac - test_frac, "valid": valid_frac, "test": test_frac}
    if count == 1:
        for j, name in enumerate(fmt.SPLITS):
            if fracs[name] > 0 and not (split_of == j).any():
                raise DataError(
                    f"split '{name}' would get no tasks: only {k:,} task(s) kept with "
                    f"{name}_frac={fracs[name]:g}; use more data, a larger fraction or a smaller --min-task-size"
                )
    # the task id's rank in byte order breaks ties of h (Arrow sorts the strings, no Python compare)
    name_rank = np.empty(k, np.int64)
    name_rank[pc.sort_indices(names).to_numpy()] = np.arange(k)
    # one sort: split, shard, hash, task id (lexsort's last key is the primary one)
    by = np.lexsort((name_rank, h, shard_of_, split_of))
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
            chunk = by[(split_of[by] == j) & (shard_of_[by] == s)]
            order.append(task_codes[chunk])
            ranges[name].append((s, pos, pos + chunk.size))
            pos += chunk.size
            counts[name] += int(chunk.size)
    return SplitLayout(order=np.concatenate(order) if order else np.zeros(0, np.int64), shards=ranges, counts=counts)


def row_keys(rows: np.ndarray, seed: int) -> np.ndarray:
    """``split_by=random``'s sort key of input rows under ``--part``: splitmix64 of (seed, row) as
    a uniform [0, 1) double, vectorized (the same for a row in every part)."""
    with np.errstate(over="ignore"):
        z = _mix(rows.astype(np.uint64) + np.uint64((int(seed) * _GAMMA + _GAMMA) % (1 << 64)))
    return _unit(z)


def schema_entry(part: Tuple[int, int], sums: Dict) -> Dict:
    """``schema.json``'s ``part``: which part this is, and the additive statistics (``task_format``)."""
    return {"index": int(part[0]), "count": int(part[1]), **sums}
