"""Fused tables: the logical tables that share a placement, a row width and an optimizer in one
TFRA table (``model.fuse_tables``).

A step's sparse work is hash-table ops, and TFRA issues them per table: a find per table and
shard on the lookup, a find and an insert per table, shard and slot table on the apply. A table
costs its ops whether it brings 5 ids or 5,000, so every added feature made every step slower
(docs/profile.md). TorchRec groups the shards that share a device, a width and an optimizer
into one table-batched embedding; Monolith keys every feature's ids in one hash table by a
feature id whose top bits name the slot. This module does both with TFRA's own tables:

* ``FusedTable`` is one ``EmbeddingTable`` (a ``de.Variable`` on the members' devices, its
  shadow, its optimizer and slot tables, made as for any table) whose keys are
  ``fused_keys.KeyCodec`` keys: the member's slot in the top bits, its id folded below. Plus
  one table of its own, ``ids``: the logical id of each key whose id does not fit the id field
  (what decoding needs, ``fused_keys``).
* ``FusedMember`` is one logical table inside it: it keeps its name, its initial rows (keyed
  by its own name and seed, and the logical id: ``initial_rows.py``, so a new id gets the row
  the per-table layout gives it), its step counter in checkpoints, and its files. The model,
  the planner, the checkpoint, warm start and export see members; only ``storage()`` (what
  TFRA holds) sees the fused table.
* A step looks every member up at once (``EmbeddingTable.lookup_parts``, with this table's
  ``encode_parts`` / ``row_keys`` / ``record``: one find per fused table and shard, one shadow,
  hazard 3's one-lookup rule kept per physical table) and applies once
  (one wrapped optimizer per fused table, or one PS request: ``ps_requests.py``).

What fuses (``group_key``): plain tables (not column-split, not ``model.max_rows``-counted)
with ``init_rows: missing``, on the same devices (the same PS list: the placement the plan
chose stays), with the same dim; ``bp_v2``, ``init_stddev`` and the optimizer are the model's,
the same for all. A group of one stays a plain table.

**Checkpoints stay logical.** ``logical_rows`` exports the fused table, its slot tables and
the ``ids`` record once each and decodes them into each member's ``<table>.npz`` /
``<table>.<slot>.npz`` (TorchRec writes ``{table}.weight`` views of its fused buffer the same
way); ``restore_rows`` encodes them back. A checkpoint written fused and one written per table
hold the same files, so a run resumes across ``model.fuse_tables`` (and across membership
changes: nothing physical is saved). Step counters: every member of a fused table is updated
every step, so one counter (the fused optimizer's) is each member's; ``CounterView`` saves it
under each member's name as a plain variable would be saved.
"""
from __future__ import annotations

import zlib
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.trackable import base as trackable

from gmeta_tf.embedding import initial_rows
from gmeta_tf.embedding.fused_keys import KeyCodec
from gmeta_tf.embedding.naming import NamedCuckooHashTableCreator, variable_name
from gmeta_tf.embedding.table import EmbeddingTable, UniqueIds, UniqueLookup, initial_capacity
from gmeta_tf.embedding.table_files import export_variable, import_variable
from gmeta_tf.embedding.tfra import de

# The measured answer for ``auto`` (docs/profile.md): fused where a group has more than one
# table, one process and PS alike. On a PS it runs 6x fewer hash-table ops a step (84 -> 14 at 7
# tables, 14 at 14) and 15-25% less PS CPU (``bench/ps_cpu.py``); in one process 1.01-1.08x the
# tasks per CPU second at 7 tables, 1.13-1.18x at 28; 2 workers + 2 PS throughput level within
# its noise (0.90-1.00). Never slower where measured above the noise.
AUTO = True


def resolve(mode) -> bool:
    """``model.fuse_tables`` (its values are checked by the config: ``schema.FUSE_TABLES``):
    ``auto`` is ``AUTO``, the one place it is decided; ``true`` / ``false`` force it."""
    return AUTO if mode == "auto" else bool(mode)


# -- whether a table is fused: asked here only -----------------------------------------------
def looked_up_together(table) -> bool:
    """Whether ``table``'s lookups must join other tables' (a member of a fused table: one find
    and one shadow per fused table, ``lookup.together``)."""
    return isinstance(table, FusedMember)


def fused_tables(storage: Sequence) -> List[FusedTable]:
    """The fused tables among TFRA tables ``storage`` (saved and restored as their members' rows)."""
    return [t for t in storage if isinstance(t, FusedTable)]


def saved_as_is(storage: Sequence) -> List:
    """The TFRA tables among ``storage`` whose rows are saved as they are (not fused)."""
    return [t for t in storage if not isinstance(t, FusedTable)]


def step_counters(tables: Sequence, counters: Mapping[str, object]) -> Dict[str, object]:
    """``counters`` (model table name → its optimizer's step counter), each member of a fused
    table's shared one wrapped in a ``CounterView`` (saved under the member's name)."""
    shared = {t.name for t in tables if isinstance(t.storage()[0], FusedTable)}  # a hot table's base too
    return {name: CounterView(v) if name in shared else v for name, v in counters.items()}


def groups(keys: Sequence[Optional[Tuple]]) -> List[List[int]]:
    """Indices of the tables that fuse, one list per fused table (two or more each), given each
    table's ``group_key`` (None: never fuses)."""
    by_key: Dict[Tuple, List[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            by_key.setdefault(key, []).append(i)
    return [idx for idx in by_key.values() if len(idx) > 1]


def group_key(devices: Sequence[str], dim: int, counted: bool, init_rows: str) -> Optional[Tuple]:
    """What tables must share to fuse (module docstring); None for a table that never fuses.
    ``bp_v2``, ``init_stddev`` and the optimizer are the model's, the same for every table."""
    if counted or init_rows != "missing":
        return None
    return tuple(devices), int(dim)


def fused_name(dim: int, devices: Sequence[str], members: Sequence[str]) -> str:
    """Deterministic (every worker binds the same PS tables) and valid in TFRA and file names."""
    crc = zlib.crc32(("|".join(members) + "@" + "|".join(devices)).encode())
    return f"fused-d{dim}-{crc:08x}"


class FusedTable(EmbeddingTable):
    """One TFRA table (+ slot tables, + the ``ids`` record) holding ``members``' rows."""

    def __init__(self, members: Sequence[Tuple[str, int]], dim: int, devices: Sequence[str], namespace: str,
                 init_stddev: float, bp_v2: bool = False, expected_rows: int = 0):
        """``members``: (logical table name, its seed), in slot order."""
        names = [m for m, _ in members]
        self.codec = KeyCodec(len(members))
        super().__init__(fused_name(dim, devices, names), dim, devices, namespace, init_stddev, seed=0,
                         bp_v2=bp_v2, expected_rows=expected_rows, partitioner=self.codec.partition_fn)
        self.members = [FusedMember(self, slot, name, seed) for slot, (name, seed) in enumerate(members)]
        # The logical id of every key whose id is 2^P or more (``fused_keys``: decoding needs it).
        self.ids = de.Variable(
            key_dtype=tf.int64, value_dtype=tf.int64, dim=1, devices=self.devices, initializer=0,
            name=variable_name(namespace, f"{self.name}.ids"), partitioner=self.codec.partition_fn,
            kv_creator=NamedCuckooHashTableCreator(namespace), init_size=initial_capacity(expected_rows))

    def variables(self, optimizer) -> List["de.Variable"]:
        return [*super().variables(optimizer), self.ids]

    # -- the step: what differs from a plain table's lookup (``EmbeddingTable.lookup_parts``) --
    def encode_parts(self, owners: Sequence["FusedMember"], ids: Sequence[tf.Tensor]) -> tf.Tensor:
        """Each member's ids as keys of this table (its slot in the top bits), encoded in one pass."""
        return self.codec.encode_parts([m.slot for m in owners], ids)

    def row_keys(self, owners: Sequence["FusedMember"], sizes) -> tf.Tensor:
        """Each row's own member's initial-rows key: a new id gets the row a plain table would give it."""
        return initial_rows.row_keys([m.row_key for m in owners], sizes)

    def record(self, keys: tf.Tensor, ids: tf.Tensor, exists: Optional[tf.Tensor] = None, shard: Optional[int] = None):
        """Record the logical id of each new key (``exists`` false; every key when None) whose id
        the key cannot hold; ``shard``: write that shard's table directly (on the PS)."""
        keep = self.codec.recorded(ids)
        if exists is not None:
            keep = tf.logical_and(keep, tf.logical_not(tf.reshape(exists, [-1])))
        keys, ids = tf.boolean_mask(keys, keep), tf.boolean_mask(ids, keep)[:, None]
        if shard is None:
            return self.ids.upsert(keys, ids)
        return self.ids._tables[shard].insert(keys, ids)

    # -- checkpoint ------------------------------------------------------------------------------
    def _sources(self, optimizer) -> Dict[str, object]:
        """File key suffix -> fused TFRA variable: ``""`` the rows, ``.m`` ... its slot tables."""
        return {"": self.variable, **{f".{s}": v for s, v in self.slot_tables(optimizer).items()}}

    def file_suffixes(self, optimizer) -> List[str]:
        """What follows a member's name in its checkpoint file keys: ``""``, ``.m``, ``.v``."""
        return list(self._sources(optimizer))

    def logical_rows(self, optimizer) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
        """``{file key: (logical ids, values)}`` of every member and slot: each fused table
        exported once, decoded (``KeyCodec.decode`` with the ``ids`` record)."""
        rec_keys, rec_ids = export_variable(self.ids)
        out = {}
        for suffix, var in self._sources(optimizer).items():
            keys, values = export_variable(var)
            slots, ids = self.codec.decode(keys, rec_keys, rec_ids)
            for m in self.members:
                sel = slots == m.slot
                out[m.name + suffix] = (ids[sel], values[sel])
        return out

    def restore_rows(self, rows: Mapping[str, Tuple[np.ndarray, np.ndarray]], optimizer) -> None:
        """Refill the fused table, its slot tables and the ``ids`` record from logical rows
        (``{file key: (ids, values)}`` for every member and slot, as ``logical_rows`` gives)."""
        for suffix, var in self._sources(optimizer).items():
            keys = np.concatenate([self.codec.encode_np(m.slot, rows[m.name + suffix][0]) for m in self.members])
            values = np.concatenate([np.asarray(rows[m.name + suffix][1], np.float32).reshape(-1, self.dim)
                                     for m in self.members])
            var.clear()
            import_variable(var, keys, values)
        ids = [np.asarray(rows[m.name][0], np.int64) for m in self.members]
        keys = np.concatenate([self.codec.encode_np(m.slot, i) for m, i in zip(self.members, ids)])
        ids = np.concatenate(ids)
        large = ids > self.codec.mask
        self.ids.clear()
        import_variable(self.ids, keys[large], ids[large].reshape(-1, 1))

    def member_keys(self, slot: int) -> np.ndarray:
        keys = export_variable(self.variable)[0]
        return keys[self.codec.slots(keys) == slot]


class FusedMember:
    """One logical table inside a ``FusedTable``: the ``table.Table`` surface (``name``, ``dim``,
    ``lookup_unique``, ``size``, ``storage``) plus what the hot tier reads of a base table
    (``variable``, ``slot_tables``, ``shadow``, ``fill_missing``), keyed by logical ids."""

    ps_requestable = True  # a PS request reads and writes its rows in the fused table (``storage``)

    def __init__(self, fused: FusedTable, slot: int, name: str, seed: int):
        self.fused = fused
        self.slot = slot
        self.name = name
        self.dim = fused.dim
        self.init_rows = "missing"
        self.init_stddev = fused.init_stddev
        self.row_key = initial_rows.table_key(name, seed)  # as the plain table of this name and seed
        self.variable = MemberRows(fused.variable, self, records=True)
        self.frequency = None

    @property
    def devices(self) -> List[str]:
        return self.fused.devices

    @property
    def shadow(self):
        return self.fused.shadow

    def encode(self, ids: tf.Tensor) -> tf.Tensor:
        return self.fused.codec.encode(self.slot, ids)

    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True) -> UniqueLookup:
        """This member alone (a step looks all members up together: ``lookup.lookup_batch``)."""
        u = UniqueIds.of(ids)
        return u.lookup(self.fused.lookup_parts([(self, u.real)], trainable)[0], self.dim)

    def fill_missing(self, ids: tf.Tensor, rows: tf.Tensor, exists: tf.Tensor) -> tf.Tensor:
        return initial_rows.fill_missing(rows, exists, ids, self.row_key, self.dim, self.init_stddev)

    def slot_tables(self, optimizer) -> Dict[str, "MemberRows"]:
        return {s: MemberRows(v, self) for s, v in self.fused.slot_tables(optimizer).items()}

    def slot_variables(self, optimizer) -> List["MemberRows"]:
        return list(self.slot_tables(optimizer).values())

    def export(self) -> Tuple[np.ndarray, np.ndarray]:
        """This member's ``(ids, rows)``, as ``EmbeddingTable.export`` gives a plain table's."""
        keys, values = self.variable.export()
        return keys.numpy(), values.numpy()

    def size(self) -> int:
        return int(len(self.fused.member_keys(self.slot)))

    def shard_sizes(self) -> List[int]:
        keys = self.fused.member_keys(self.slot)
        part = self.fused.codec.partition_fn(tf.constant(keys, tf.int64), len(self.devices)).numpy()
        return [int((part == i).sum()) for i in range(len(self.devices))]

    def storage(self) -> List[EmbeddingTable]:
        return [self.fused]


class MemberRows:
    """One member's rows of a fused TFRA variable (the rows or a slot table), keyed by logical
    ids: the ``de.Variable`` calls the hot tier makes (``lookup``, ``upsert``, ``export``)."""

    def __init__(self, var, member: FusedMember, records: bool = False):
        self.var = var
        self.member = member
        self.records = records  # the rows' view: an upsert also records large ids
        self.dim = var.dim
        self.bp_v2 = var.bp_v2
        self.name = f"{var.name}[{member.name}]"

    def lookup(self, ids: tf.Tensor, return_exists: bool = False):
        return self.var.lookup(self.member.encode(ids), return_exists=return_exists)

    def upsert(self, ids: tf.Tensor, values: tf.Tensor):
        keys = self.member.encode(ids)
        if self.records:
            self.member.fused.record(keys, tf.convert_to_tensor(ids, tf.int64))
        return self.var.upsert(keys, values)

    def size(self) -> tf.Tensor:
        keys = export_variable(self.var)[0]
        return tf.constant(int((self.member.fused.codec.slots(keys) == self.member.slot).sum()), tf.int64)

    def export(self) -> Tuple[tf.Tensor, tf.Tensor]:
        fused = self.member.fused
        keys, values = export_variable(self.var)
        slots, ids = fused.codec.decode(keys, *export_variable(fused.ids))
        sel = slots == self.member.slot
        return tf.constant(ids[sel]), tf.constant(values[sel])


class CounterView(trackable.Trackable):
    """A step counter shared by several logical tables, saved under each one's name exactly as a
    ``tf.Variable`` is (``.ATTRIBUTES/VARIABLE_VALUE``): checkpoints of fused and per-table runs
    hold the same counters, and either restores into the other."""

    def __init__(self, var: tf.Variable):
        self.var = var

    def _serialize_to_tensors(self):
        return {trackable.VARIABLE_VALUE_KEY: tf.identity(self.var)}

    def _restore_from_tensors(self, restored_tensors):
        return self.var.assign(restored_tensors[trackable.VARIABLE_VALUE_KEY])

    def numpy(self):
        return self.var.numpy()
