"""Dense gradients as int8 on the wire, with error feedback (``cluster.dense_compression: int8``).

Issue 41: once the PS traffic and the hot rows' exchange were cut, what was left on a worker's
link was the dense all-reduce, bfloat16 or not (about half of the lean path's bytes). bfloat16
already halves it; this halves it again. Each value crosses as one signed byte, ``q = round(v /
s)`` in ``[-127, 127]``, with one float32 scale ``s = max|v| / 127`` per block of ``BLOCK``
consecutive values (so ``1 + 4/BLOCK`` bytes a value, 1.03 at 128): ``|v - q·s| <= s/2``, half a
step of the block's largest value. Unlike bfloat16's error (relative to each value), a small value
beside a large one in its block loses most of its digits, which is why the error is fed back:

**Error feedback** (EF-SGD, Karimireddy et al. 2019; 1-bit Adam's compressed all-reduce keeps
the same two residuals): what rounding dropped is kept and added to what is sent next step,

    v_t = g_t + e_{t-1},   sent = Q(v_t),   e_t = v_t - sent

so over ``T`` steps what crossed sums to ``Σ g_t - e_T``: the dropped parts are delayed, never
lost, and the total's error stays one step's rounding however long the run. The all-reduce's two
halves each keep one residual on each rank: the *worker's* over the whole flat gradient (what it
sends every owner, reduce-scatter), and the *owner's* over its own slice (the mean it sends
everyone, all-gather). Every rank then reads the same gathered bytes and decodes them the same way,
so the replicas stay bit-identical, the owner included (it uses the decoded mean, not its own
float32 one).

The residuals are per rank and not checkpointed: a resumed run starts them at zero, which moves
its first step by at most one step's rounding (so a resumed int8 run is not bit for bit the
straight one; exact resumption is float32's and bfloat16's). They are sized by the ring (each
rank owns ``1/size`` of the values), so an elastic ring, whose size changes under the step, is
refused at load (``config/schema.py``).

Values that must arrive exact (the stop vote: a residual of 1e-8 left in it would read as "stop"
the next step) ride beside the blocks as float32 bits in the reduce-scatter half; every rank
receives every rank's copy and sums them itself, no extra collective.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Tuple

import tensorflow as tf

BLOCK = 128  # values per float32 scale: 3% of the payload in scales, the rounding local to 128 values
LEVELS = 127.0  # symmetric: -127..127, so 0 is exact and no value's sign flips
SCALE_BYTES = 4

Collective = Callable[[tf.Tensor], tf.Tensor]


def padded_width(total: int, size: int) -> int:
    """Each rank's slice of ``total`` values: a whole number of blocks, ``size`` slices covering it."""
    per_rank = -(-total // size)
    return -(-per_rank // BLOCK) * BLOCK


def quantize(x: tf.Tensor) -> tf.Tensor:
    """``[r, w]`` float32 (``w`` a multiple of ``BLOCK``) as ``[r, w + 4·w/BLOCK]`` int8: the values'
    bytes, then each block's float32 scale as 4 bytes (a bitcast: exact)."""
    rows = tf.shape(x)[0]
    blocks = tf.reshape(x, [rows, -1, BLOCK])
    scale = tf.reduce_max(tf.abs(blocks), axis=2) / LEVELS  # [r, w/BLOCK]; 0 for an all-zero block
    q = tf.clip_by_value(tf.round(blocks * tf.math.divide_no_nan(1.0, scale)[..., None]), -LEVELS, LEVELS)
    return tf.concat([tf.reshape(tf.cast(q, tf.int8), [rows, -1]),
                      tf.reshape(tf.bitcast(scale, tf.int8), [rows, -1])], axis=1)


def dequantize(packed: tf.Tensor, width: int) -> tf.Tensor:
    """``quantize``'s inverse (up to its rounding): float32 ``[r, width]``."""
    rows = tf.shape(packed)[0]
    q = tf.reshape(tf.cast(packed[:, :width], tf.float32), [rows, -1, BLOCK])
    scale = tf.bitcast(tf.reshape(packed[:, width:width + width // BLOCK * SCALE_BYTES], [rows, -1, SCALE_BYTES]),
                       tf.float32)
    return tf.reshape(q * scale[..., None], [rows, width])


class Residuals:
    """The two error-feedback residuals of each all-reduced gradient list, per rank, by its length
    and the ring's size. Created outside any traced function (``tf.init_scope``) the first time a
    length is seen, so every function that all-reduces the same gradients feeds the same residuals."""

    def __init__(self) -> None:
        self._by_shape: Dict[Tuple[int, int], Tuple[tf.Variable, tf.Variable]] = {}

    def get(self, size: int, width: int) -> Tuple[tf.Variable, tf.Variable]:
        key = (size, width)
        if key not in self._by_shape:
            with tf.init_scope():
                self._by_shape[key] = (
                    tf.Variable(tf.zeros([size, width]), trainable=False, name="int8-wire-sent-residual"),
                    tf.Variable(tf.zeros([1, width]), trainable=False, name="int8-wire-owned-residual"))
        return self._by_shape[key]


def _exact_columns(values: Sequence[tf.Tensor], rows: int) -> tf.Tensor:
    """Scalars as float32 bytes, the same on each of ``rows`` rows: ``[rows, 4·len(values)]`` int8."""
    flat = tf.stack([tf.cast(tf.reshape(v, []), tf.float32) for v in values])
    return tf.tile(tf.reshape(tf.bitcast(flat, tf.int8), [1, -1]), [rows, 1])


def mean_int8(tensors: List[tf.Tensor], size: int, residuals: Residuals, alltoall: Collective,
              allgather: Collective, exact: Sequence[tf.Tensor] = ()) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    """The mean over ``size`` ranks of each float32 tensor, every value crossing as int8 blocks with
    error feedback (module docstring), and the exact mean of each scalar in ``exact``.
    ``alltoall`` / ``allgather`` as ``dense_sync.mean_on_wire``'s: the ring all-reduce's two
    halves, built from collectives that move bytes."""
    counts = [t.shape.num_elements() for t in tensors]
    total = sum(counts)
    width = padded_width(total, size)
    sent_res, owned_res = residuals.get(size, width)
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], axis=0)
    # reduce-scatter: slice r of every rank's gradient (plus what rounding dropped last step) to rank r
    v = tf.reshape(tf.pad(flat, [[0, width * size - total]]), [size, width]) + sent_res
    packed = quantize(v)
    sent_res.assign(v - dequantize(packed, width))
    if exact:
        packed = tf.concat([packed, _exact_columns(exact, size)], axis=1)
    received = alltoall(packed)  # [size, ...]: every rank's copy of my slice, in rank order
    mine = tf.reduce_sum(dequantize(received, width), axis=0, keepdims=True) / float(size)
    exact_means: List[tf.Tensor] = []
    if exact:
        cols = width + width // BLOCK * SCALE_BYTES
        sums = tf.reduce_sum(tf.bitcast(tf.reshape(received[:, cols:], [size, len(exact), SCALE_BYTES]),
                                        tf.float32), axis=0) / float(size)
        exact_means = [tf.cast(tf.reshape(sums[i], []), e.dtype) for i, e in enumerate(exact)]
    # all-gather: my slice's mean (plus my residual) to everyone; everyone decodes the same bytes
    v2 = mine + owned_res
    mine_packed = quantize(v2)
    owned_res.assign(v2 - dequantize(mine_packed, width))
    gathered = dequantize(allgather(mine_packed), width)  # [size, width]
    out = tf.split(tf.reshape(gathered, [-1])[:total], counts)
    return [tf.cast(tf.reshape(o, t.shape), t.dtype) for o, t in zip(out, tensors)], exact_means
