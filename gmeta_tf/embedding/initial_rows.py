"""Initial rows drawn only for the ids a table does not hold yet (``model.init_rows: missing``).

TFRA's ``de.Variable.lookup`` draws an initializer row for *every* looked-up id (a
``RandomNormal [n, dim]`` on each PS shard, per step) and throws away the draws of the ids the
table already holds: most of them, once training is under way (``tfra_init_rows`` in
docs/profile.md). With ``model.init_rows: missing`` a table is created without a per-lookup
initializer (``table.py``), its trainable lookup *finds* the ids (``lookup(..., return_exists)``,
missing ids read as zeros), and this module fills the missing ones in on the worker.

The initial row of an id is a function of (table, id) alone: N(0, σ²) per column from a
counter-based hash (splitmix64 → Box-Muller), σ the table's ``model.init_stddev``. So every
rank, and a resumed run, gives a new id the same initial row, whatever the order in which ids
arrive; TFRA's stateful initializer (``init_rows: all``) gives each draw a fresh row.
"""
from __future__ import annotations

import math
import zlib
from typing import Sequence, Union

import tensorflow as tf

MODES = ("missing", "all")

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def table_key(name: str, seed: int) -> int:
    """The 64-bit key of a table's initial rows: its (namespace-free) name and its seed, so two
    processes building the same model (same names, same ``model.seed``) agree."""
    return (zlib.crc32(name.encode()) << 32) | (int(seed) & 0xFFFFFFFF)


def _u64(x: int) -> tf.Tensor:
    return tf.constant(x & 0xFFFFFFFFFFFFFFFF, tf.uint64)


def _shift(x: tf.Tensor, n: int) -> tf.Tensor:
    return tf.bitwise.right_shift(x, _u64(n))


def splitmix64(x: tf.Tensor) -> tf.Tensor:
    """The finaliser of splitmix64 on uint64 (wrapping arithmetic); fused keys mix with it too."""
    x = x + _u64(_GOLDEN)
    x = tf.bitwise.bitwise_xor(x, _shift(x, 30)) * _u64(_MIX1)
    x = tf.bitwise.bitwise_xor(x, _shift(x, 27)) * _u64(_MIX2)
    return tf.bitwise.bitwise_xor(x, _shift(x, 31))


def row_keys(keys: Sequence[int], sizes) -> tf.Tensor:
    """uint64 ``[n]``: ``keys[i]`` (``table_key``) repeated ``sizes[i]`` times, for ``initial_rows``
    of rows of several tables at once (a fused table's members)."""
    return tf.repeat(tf.constant([k & 0xFFFFFFFFFFFFFFFF for k in keys], tf.uint64), sizes)


def _key(key: Union[int, tf.Tensor]) -> tf.Tensor:
    return _u64(key) if isinstance(key, int) else key


def initial_rows(ids: tf.Tensor, key: Union[int, tf.Tensor], dim: int, stddev: float) -> tf.Tensor:
    """``[n, dim]`` float32: the initial row of each of ``ids`` (int64 ``[n]``) in the table of
    ``key`` (``table_key``; or uint64 ``[n]``, each id's own table: ``row_keys``), each column
    N(0, ``stddev``²)."""
    ids = tf.bitcast(tf.reshape(tf.cast(ids, tf.int64), [-1]), tf.uint64)
    row = splitmix64(tf.bitwise.bitwise_xor(ids * _u64(_GOLDEN), _key(key)))  # [n]
    cols = tf.range(1, dim + 1, dtype=tf.int64)
    cols = tf.bitcast(cols, tf.uint64) * _u64(_MIX2)  # [dim]
    bits = splitmix64(row[:, None] + cols[None, :])  # [n, dim]
    hi = tf.cast(_shift(bits, 32), tf.float64)
    lo = tf.cast(tf.bitwise.bitwise_and(bits, _u64(0xFFFFFFFF)), tf.float64)
    u1 = (hi + 0.5) / 4294967296.0  # (0, 1): log is finite
    u2 = (lo + 0.5) / 4294967296.0
    normal = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos((2.0 * math.pi) * u2)
    return tf.cast(normal * float(stddev), tf.float32)


def fill_missing(rows: tf.Tensor, exists: tf.Tensor, ids: tf.Tensor, key: Union[int, tf.Tensor], dim: int,
                 stddev: float) -> tf.Tensor:
    """``rows`` (``[n, dim]``, a find's result) with the rows of the ids that do not exist
    replaced by their initial rows; the hash runs for the missing ids only. ``key`` as in
    ``initial_rows``."""
    with tf.name_scope("initial_rows"):
        return _fill(rows, exists, ids, key, dim, stddev)


def _fill(rows, exists, ids, key, dim, stddev):
    rows = tf.reshape(rows, [-1, dim])
    where = tf.where(tf.logical_not(tf.reshape(exists, [-1])))  # [m, 1] int64
    if not isinstance(key, int):
        key = tf.gather_nd(tf.reshape(key, [-1]), where)
    fresh = initial_rows(tf.gather_nd(tf.reshape(ids, [-1]), where), key, dim, stddev)
    return tf.tensor_scatter_nd_update(rows, where, fresh)
