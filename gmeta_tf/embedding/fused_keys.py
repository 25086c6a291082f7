"""The keys of a fused table: the feature slot in the top bits, the id folded into the rest.

A fused table (``fused.py``) holds the rows of several logical tables in one TFRA hash table,
so each key must say which table a row belongs to. Monolith's answer (a feature id: slot in the
top bits, a hashed value below) is the layout, with the id kept exact wherever it fits::

    bit 63 | bits 62 .. P | bits P-1 .. 0
       0   |  slot (b)    |  fold(id)          P = 63 - b

``b`` is the fewest bits that number the table's members (7 tables: 3 bits, P = 60; 28: 5).
Bit 63 stays clear, so keys are non-negative, never the pad id, never HierarchicalKV's reserved
keys. ``fold(id) = (id mod 2^P) XOR h(id >> P)``, with ``h(0) = 0`` and ``h(x)`` the low P bits
of splitmix64(x) otherwise.

**Which ids stay apart, and the collision rate.** Ids are non-negative int64, so an id has at
most ``b`` bits above P (``id >> P`` < 2^b): exactly the bits the slot takes.

* An id below 2^P (every integer catalogue we know of: MovieLens' movie ids are below 2^18)
  keeps its value: ``fold(id) = id``. Such ids never collide, and the key decodes alone.
* Ids with the same high bits never collide with each other (XOR by one constant is a
  bijection on P bits). Two ids with different high bits collide when their low bits differ by
  exactly ``h(hi_a) XOR h(hi_b)``: for hashed ids (strings, which ``prepare`` hashes to uniform
  63-bit values) probability 2^-P per pair, so n distinct ids of one table make about
  ``n² / 2^(P+1)`` colliding pairs (``expected_collisions``): 4e-4 at 10^8 ids at P = 60, 0.14
  at P = 55 (256 tables). Ids of different tables never collide: their slots differ.
  ``tests/test_fused_tables.py`` pins both, measured (``collisions``): 0 on MovieLens (its own
  integer ids and the same values hashed as strings) and on 10^6 uniform 63-bit ids at P = 60,
  and the formula at a width where collisions happen (P = 32).
* Colliding ids share one row (the hashing trick): both read and train it; the checkpoint
  names it by the id that created it.

Mask width equals shift width (``P`` both): an id with all 63 bits set cannot reach the slot
field. Monolith's ``extract_fid`` masks 49 bits before OR-ing ``slot << 48``, so a hash bit
leaks into the slot; ``test_fused_tables`` pins that ours does not.

**Decoding.** A key below 2^P in its id field decodes to it, unless its id was large: the
bits ``fold`` drops are not in the key, so a fused table records, for every key whose id is
2^P or more, the id itself (``FusedTable.ids``, written when a trainable lookup first meets the
key). The checkpoint decodes through that record (``decode``), so its files hold logical ids.

**Shards.** ``partition_fn`` places a key by its id field as TFRA's default partitioner places
an id (``mod`` of the shard count): every id below 2^P lands on the shard the per-table layout
puts it on, so the planner's placement (which PS, how the rows spread) holds as planned; a larger
id goes to the shard of its fold (as uniform, not the same shard). TFRA's optimizer gives the
slot tables the same function.
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from gmeta_tf.embedding.initial_rows import splitmix64

KEY_BITS = 63  # bit 63 stays clear: keys are non-negative


def slot_bits(members: int) -> int:
    """The fewest bits that number ``members`` tables (at least 1)."""
    if members < 1:
        raise ValueError(f"a fused table needs members, got {members}")
    return max(1, (members - 1).bit_length())


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class KeyCodec:
    """Encode (slot, id) into a fused key and back, for a table of ``members`` members."""

    def __init__(self, members: int, id_bits: int = 0):
        self.bits = slot_bits(members)
        # ``id_bits`` narrows the id field (tests measure collisions where they happen); 0: 63 - bits.
        self.p = id_bits or KEY_BITS - self.bits
        if self.p + self.bits > KEY_BITS:
            raise ValueError(f"{self.bits} slot bits and {self.p} id bits do not fit in {KEY_BITS}")
        self.mask = (1 << self.p) - 1
        self.members = members

    # -- TensorFlow (the step) ---------------------------------------------------------------
    def encode(self, slot: Union[int, tf.Tensor], ids: tf.Tensor) -> tf.Tensor:
        """Keys of member ``slot``'s ``ids`` (int64, >= 0); ``slot`` may be a tensor, one per id
        (several members' ids encoded at once: ``encode_parts``)."""
        if isinstance(slot, int):
            if not 0 <= slot < self.members:
                raise ValueError(f"slot {slot} is not a member (0..{self.members - 1})")
            field = tf.constant(slot << self.p, tf.int64)
        else:
            field = tf.bitwise.left_shift(tf.cast(slot, tf.int64), tf.constant(self.p, tf.int64))
        ids = tf.cast(ids, tf.int64)
        hi = tf.bitwise.right_shift(ids, tf.constant(self.p, tf.int64))
        mixed = tf.bitwise.bitwise_and(tf.bitcast(splitmix64(tf.bitcast(hi, tf.uint64)), tf.int64),
                                       tf.constant(self.mask, tf.int64))
        low = tf.bitwise.bitwise_and(ids, tf.constant(self.mask, tf.int64))
        fold = tf.where(hi > 0, tf.bitwise.bitwise_xor(low, mixed), low)
        return tf.bitwise.bitwise_or(fold, field)

    def encode_parts(self, slots: Sequence[int], ids: Sequence[tf.Tensor]) -> tf.Tensor:
        """The keys of several members' ids, concatenated in order, encoded in one pass."""
        if len(ids) == 1:
            return self.encode(slots[0], ids[0])
        per_id = tf.repeat(tf.constant(list(slots), tf.int64), [tf.shape(i)[0] for i in ids])
        return self.encode(per_id, tf.concat(ids, axis=0))

    def recorded(self, ids: tf.Tensor) -> tf.Tensor:
        """Whether each id's key needs the id recorded to decode (it is 2^P or more)."""
        return ids > tf.constant(self.mask, tf.int64)

    def partition_fn(self, keys, shard_num: int):
        """TFRA's default partitioner (``keys mod shard_num``, CPU builds) on the id field."""
        if shard_num <= 1:
            return tf.zeros(tf.shape(keys), tf.int32)
        field = tf.bitwise.bitwise_and(tf.convert_to_tensor(keys, tf.int64), tf.constant(self.mask, tf.int64))
        return tf.cast(tf.math.mod(field, shard_num), tf.int32)

    # -- numpy (checkpoints, measurements) -----------------------------------------------------
    def encode_np(self, slot: int, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        hi = (ids >> self.p).astype(np.uint64)
        low = ids & self.mask
        mixed = (_splitmix64_np(hi) & np.uint64(self.mask)).astype(np.int64)
        fold = np.where(hi > 0, low ^ mixed, low)
        return fold | np.int64(slot << self.p)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return np.asarray(keys, np.int64) >> self.p

    def decode(self, keys: np.ndarray, recorded_keys: np.ndarray, recorded_ids: np.ndarray
               ) -> Tuple[np.ndarray, np.ndarray]:
        """``(slots, ids)`` of ``keys``: the recorded id where one was recorded, else the id field."""
        keys = np.asarray(keys, np.int64)
        ids = keys & self.mask
        if len(recorded_keys):
            order = np.argsort(recorded_keys)
            rk, rid = np.asarray(recorded_keys, np.int64)[order], np.asarray(recorded_ids, np.int64).reshape(-1)[order]
            pos = np.minimum(np.searchsorted(rk, keys), len(rk) - 1)
            hit = rk[pos] == keys
            ids = np.where(hit, rid[pos], ids)
        return self.slots(keys), ids


def collisions(ids: np.ndarray, codec: KeyCodec, slot: int = 0) -> int:
    """Distinct ids of one table that share a key with another: ``len(ids) - distinct keys``."""
    ids = np.unique(np.asarray(ids, np.int64))
    return int(len(ids) - len(np.unique(codec.encode_np(slot, ids))))


def expected_collisions(n: int, id_bits: int) -> float:
    """Expected colliding pairs among ``n`` distinct uniform 63-bit ids (birthday bound)."""
    return n * (n - 1) / 2.0 / float(1 << id_bits)
