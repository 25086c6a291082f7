"""Wire precision (``cluster.wire_dtype``): the dtype a floating tensor has while it crosses a link.

Issue 41 measured every byte on the wire as float32: rows from the PS, row gradients back to it,
the dense gradients' and the hot rows' exchange between workers. ``bfloat16`` halves those
bytes. Why bfloat16 and not float16: bfloat16 keeps float32's 8 exponent bits, so the small
meta-gradients that float16 (5 exponent bits, no loss scaling here) would flush to zero
survive; it keeps 8 significant bits (7 stored), so a value is off by at most 2^-8 of itself
after one crossing.

The rule, for every path that honours it: a tensor is cast (``send``) where it leaves its owner
and cast back to float32 (``receive``) where it arrives. What a process keeps (table rows,
optimizer slots, dense weights) and every computation on it stay float32 on its owner; ids are
never cast (``pack`` carries them bit for bit). The paths (and the one that cannot): module
docstrings of ``ps_requests.py`` (PS rows and row gradients), ``hot/sync.py`` (hot rows'
gradients), ``train/dense_sync.py`` (dense gradients); docs/network.md.

``float32`` is the identity: ``send`` and ``receive`` return their input and add no op, so a
float32 run is the step it was before this key existed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import tensorflow as tf

_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}
# Horovod 0.28.1's TensorFlow ops take no bfloat16 (their ``T`` lists stop at float16), so a
# bfloat16 payload moves through a collective as the same 16 bits read as int16: no rounding.
_BITS = {tf.bfloat16: tf.int16}
ID_BYTES = 4  # a hot slot (int32) packed next to its row (``pack``)


class WireDtypeError(ValueError):
    """A wire dtype this module does not know (the config checks ``cluster.wire_dtype`` first)."""


@dataclass(frozen=True)
class Wire:
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise WireDtypeError(f"wire dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")

    @property
    def exact(self) -> bool:
        """Whether a float32 value arrives as it left (then nothing is cast anywhere)."""
        return self.dtype == "float32"

    @property
    def tf_dtype(self) -> tf.DType:
        return _DTYPES[self.dtype]

    @property
    def value_bytes(self) -> int:
        """Bytes one float value takes on the wire (the cost models' per-value size)."""
        return self.tf_dtype.size

    def send(self, x: tf.Tensor) -> tf.Tensor:
        """``x`` (float32) as it travels; place the call on the device ``x`` leaves."""
        return x if self.exact else tf.cast(x, self.tf_dtype)

    def receive(self, x: tf.Tensor) -> tf.Tensor:
        """A travelled tensor back in float32; place the call on the device it arrived at."""
        return x if x.dtype == tf.float32 else tf.cast(x, tf.float32)

    # -- values and their int32 ids in one tensor ------------------------------------------------
    def pack(self, values: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
        """``[U, dim]`` float32 values and their ``[U]`` int32 ids as one ``[U, dim + k]`` tensor
        of the wire dtype: the values sent, each id's 4 bytes reinterpreted as ``k`` trailing
        columns (a bitcast: exact for every id). One tensor per table, because a grouped Horovod
        collective moves one dtype for the whole group."""
        id_cols = tf.reshape(tf.bitcast(tf.cast(ids, tf.int32), self.tf_dtype), [tf.shape(ids)[0], -1])
        return tf.concat([self.send(values), id_cols], axis=1)

    def unpack(self, packed: tf.Tensor, dim: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """``pack``'s inverse: float32 ``[U, dim]`` values and the int32 ``[U]`` ids."""
        return self.receive(packed[:, :dim]), tf.reshape(tf.bitcast(packed[:, dim:], tf.int32), [-1])


def as_bits(x: tf.Tensor) -> tf.Tensor:
    """``x`` as a collective that takes no bfloat16 can move it: the same bytes."""
    return tf.bitcast(x, _BITS[x.dtype]) if x.dtype in _BITS else x


def from_bits(x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """``as_bits``' inverse, given the dtype the tensor had."""
    return x if x.dtype == dtype else tf.bitcast(x, dtype)
