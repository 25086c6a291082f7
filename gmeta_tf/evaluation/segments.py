"""Users as segments of flat arrays: the layout every per-user metric is computed in.

Why: an eval split has tens or hundreds of thousands of users with a handful of query samples
each. One Python list entry (and one call) per user costs more than the arithmetic; one flat
``float64`` array per quantity, with ``offsets`` (``int64``, ``users + 1`` entries, user ``u``
owning ``[offsets[u], offsets[u + 1])``), lets every metric run as a few numpy passes over all
users at once (segment sums by ``np.bincount``, per-user sorting by one ``np.lexsort``).
An empty user is an empty segment (two equal offsets).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np


def offsets_from_counts(counts: np.ndarray) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]`` (``int64``)."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(np.asarray(counts, np.int64), out=out[1:])
    return out


def flatten(arrays: Sequence[np.ndarray], dtype=np.float64) -> Tuple[np.ndarray, np.ndarray]:
    """Per-user arrays as (flat values, offsets): the bridge from the list API. ``dtype=None``
    keeps the arrays' own (common) dtype."""
    counts = np.fromiter((np.size(a) for a in arrays), np.int64, len(arrays))
    if not len(arrays):
        return np.zeros(0, dtype or np.float64), offsets_from_counts(counts)
    flat = np.concatenate([np.asarray(a, dtype).reshape(-1) for a in arrays])
    return flat, offsets_from_counts(counts)


def split(flat: np.ndarray, offsets: np.ndarray) -> List[np.ndarray]:
    """Flat values back to one array per user (for callers that want lists, e.g. export parity)."""
    return np.split(flat, offsets[1:-1])


def counts(offsets: np.ndarray) -> np.ndarray:
    return np.diff(offsets)


def segment_ids(offsets: np.ndarray) -> np.ndarray:
    """The user of every flat position."""
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


_PW_BLOCK = 128  # numpy's PW_BLOCKSIZE: runs up to this long are summed with 8 accumulators
_UNROLL = 8


def segment_sum(values: np.ndarray, offsets: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """Per-user sum of ``values`` (0 for an empty user), bit for bit what ``np.sum`` gives on
    each user's slice; ``ids`` (``segment_ids(offsets)``) is accepted for symmetry and unused.

    Why bit for bit: a baseline's prediction is built from per-user sums (its support residual),
    and the pooled AUC ranks every user's predictions together, so a last-bit difference can
    join or split a tie between two users and move the AUC far more than the rounding itself.
    numpy sums a contiguous float64 run pairwise (``pairwise_sum`` in its ``loops_utils``):
    sequentially from 0 below 8 values, with 8 strided accumulators up to 128 values (plus a
    sequential tail), and by halving (at a multiple of 8) above that; this repeats it for all
    users at once (one ``np.bincount`` per level of the recursion).
    """
    del ids
    v = np.asarray(values, np.float64)
    offsets = np.asarray(offsets, np.int64)
    return _pairwise(v, offsets[:-1], np.diff(offsets))


def _pairwise(v: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(lengths.size)
    big = lengths > _PW_BLOCK
    if big.any():
        n2 = lengths[big] // 2
        n2 -= n2 % _UNROLL
        out[big] = _pairwise(v, starts[big], n2) + _pairwise(v, starts[big] + n2, lengths[big] - n2)
    small = ~big
    if small.any():
        out[small] = _block_sums(v, starts[small], lengths[small])
    return out


def _block_sums(v: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``pairwise_sum`` of runs of at most 128 values."""
    n = lengths.size
    run = np.repeat(np.arange(n, dtype=np.int64), lengths)
    first = np.zeros(n, np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    pos = np.arange(run.size, dtype=np.int64) - first[run]  # position inside its run
    x = v[starts[run] + pos]
    short = lengths < _UNROLL
    out = np.bincount(run, weights=np.where(short[run], x, 0.0), minlength=n).astype(np.float64)  # in order, from 0
    tail = lengths % _UNROLL
    head = ~short[run] & (pos < (lengths - tail)[run])
    acc = np.bincount(run[head] * _UNROLL + pos[head] % _UNROLL, weights=x[head],
                      minlength=n * _UNROLL).astype(np.float64).reshape(n, _UNROLL)
    long = ~short
    r = acc[long]
    res = ((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
    t_long, end = tail[long], (starts + lengths - tail)[long]
    for t in range(_UNROLL - 1):  # the tail, in order
        more = t_long > t
        res[more] += v[end[more] + t]
    out[long] = res
    return out


def concat(parts: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Tuple[np.ndarray, np.ndarray]:
    """Several (flat, offsets) pieces, users in order, as one."""
    if not parts:
        return np.zeros(0), np.zeros(1, np.int64)
    flat = np.concatenate([f for f, _ in parts])
    return flat, offsets_from_counts(np.concatenate([np.diff(o) for _, o in parts]))


def tie_groups(seg: np.ndarray, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """For ``seg``/``keys`` already sorted by (segment, key): each run of equal (segment, key) as
    a group: (group id of every position, start position of every group)."""
    n = keys.size
    new = np.ones(n, bool)
    if n > 1:
        new[1:] = (seg[1:] != seg[:-1]) | (keys[1:] != keys[:-1])
    starts = np.flatnonzero(new)
    return np.cumsum(new) - 1, starts
