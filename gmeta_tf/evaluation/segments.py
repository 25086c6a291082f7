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
    """Per-user arrays as (flat values, offsets): the bridge from the list API."""
    counts = np.fromiter((np.size(a) for a in arrays), np.int64, len(arrays))
    flat = np.concatenate([np.asarray(a, dtype).reshape(-1) for a in arrays]) if len(arrays) else np.zeros(0, dtype)
    return flat.astype(dtype, copy=False), offsets_from_counts(counts)


def split(flat: np.ndarray, offsets: np.ndarray) -> List[np.ndarray]:
    """Flat values back to one array per user (for callers that want lists, e.g. export parity)."""
    return np.split(flat, offsets[1:-1])


def counts(offsets: np.ndarray) -> np.ndarray:
    return np.diff(offsets)


def segment_ids(offsets: np.ndarray) -> np.ndarray:
    """The user of every flat position."""
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def segment_sum(values: np.ndarray, offsets: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """Per-user sum of ``values`` (0 for an empty user); ``ids`` = ``segment_ids(offsets)`` if known."""
    ids = segment_ids(offsets) if ids is None else ids
    return np.bincount(ids, weights=np.asarray(values, np.float64), minlength=len(offsets) - 1)


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
