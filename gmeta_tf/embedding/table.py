"""One feature's TFRA table: a ``de.Variable`` plus the ``ShadowVariable`` the optimizer trains.

**Wrong gradients from two lookups** (hazard 3 in docs/architecture.md). A ``ShadowVariable``
remembers only the ids of its last lookup in a step. ``EmbeddingTable.lookup_unique`` therefore
looks up the concatenated, de-duplicated ids of a whole batch (support and query) once, and
callers gather from it.

Every kind of table the model holds (this one, a column-split table, a hot/cold table) offers the
same small surface, ``Table``: ``name``, ``dim``, ``lookup_unique``, ``size`` and ``storage``
(the TFRA tables underneath: what optimizers train and checkpoints save).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from gmeta_tf.embedding import initial_rows
from gmeta_tf.embedding.naming import NamedCuckooHashTableCreator, variable_name
from gmeta_tf.embedding.table_files import export_variable, slot_name
from gmeta_tf.embedding.tfra import de, default_partition_fn


@dataclass
class UniqueLookup:
    """Rows for the de-duplicated ids of one batch of one table.

    ``rows[i]`` is the embedding of the i-th unique id (zeros for the pad id);
    ``index`` maps every input position (flattened, in input order) to its row.
    """

    rows: tf.Tensor  # [U, D]
    index: tf.Tensor  # [P] int32
    # ``hot_apart`` lookups of a hot/cold table (``hot_cold.py``): each row's hot slot, -1 where
    # the row is cold or the pad; ``rows`` then holds zeros at the hot rows, which the caller
    # gathers itself (inside the compiled step, ``meta.hot_in_program``).
    hot_slot: Optional[tf.Tensor] = None  # [U] int32


@dataclass
class UniqueIds:
    """The de-duplicated ids of one batch of one table: ``index`` maps every input position to
    its unique id, ``real`` are the unique ids that are not the pad id (what is looked up)."""

    uniq: tf.Tensor
    index: tf.Tensor
    valid: tf.Tensor
    real: tf.Tensor

    @staticmethod
    def of(ids: Sequence[tf.Tensor]) -> "UniqueIds":
        flat = tf.concat([tf.reshape(x, [-1]) for x in ids], axis=0)
        uniq, index = tf.unique(flat, out_idx=tf.int32)
        valid = uniq >= 0
        return UniqueIds(uniq, index, valid, tf.boolean_mask(uniq, valid))

    def lookup(self, rows: tf.Tensor, dim: int) -> UniqueLookup:
        """``rows`` of ``real`` as a ``UniqueLookup``: pad ids map to an appended zero row (they
        are never looked up, never trained)."""
        rows = tf.reshape(rows, [-1, dim])
        n_real = tf.shape(self.real)[0]
        rows = tf.concat([rows, tf.zeros([1, dim], rows.dtype)], axis=0)
        row_of_unique = tf.where(self.valid, tf.cumsum(tf.cast(self.valid, tf.int32)) - 1, n_real)
        return UniqueLookup(rows=tf.gather(rows, row_of_unique), index=self.index)


class EmbeddingTable:
    """One feature's TFRA ``de.Variable`` plus the ``ShadowVariable`` the optimizer trains.

    ``devices`` places the hash-table shards: ``["/CPU:0"]`` in embedded mode, PS task devices
    (``/job:ps/task:i/device:CPU:0``) in distributed mode; keys are row-sharded by
    ``id % len(devices)`` (TFRA's default partitioner).

    ``init_rows`` (``model.init_rows``): ``all`` gives the variable TFRA's per-lookup initializer
    (a random row drawn on the PS for every looked-up id, kept for the missing ones); ``missing``
    gives it none (a find reads a missing id as zeros) and the trainable lookup draws the
    deterministic initial rows of ``initial_rows.py`` for the missing ids only.
    """

    def __init__(self, name: str, dim: int, devices: Sequence[str], namespace: str,
                 init_stddev: float, seed: int, bp_v2: bool = False, expected_rows: int = 0,
                 counted: bool = False, init_rows: str = "missing", partitioner=None):
        if init_rows not in initial_rows.MODES:
            raise ValueError(f"init_rows must be one of {', '.join(initial_rows.MODES)}, got {init_rows!r}")
        self.name = name
        self.dim = dim
        self.devices = list(devices)
        self.namespace = namespace
        self.init_rows = init_rows
        self.init_stddev = float(init_stddev)
        self.row_key = initial_rows.table_key(name, seed)
        self.variable = de.Variable(
            key_dtype=tf.int64, value_dtype=tf.float32, dim=dim, devices=self.devices,
            name=variable_name(namespace, name),
            # ``missing``: zeros filled on the PS (no random draw). Not a static default value:
            # that tensor lives on the worker and every shard's find would fetch it (one more
            # tensor transfer per table and shard per step, bench/ps_rpcs.py).
            initializer=(tf.keras.initializers.RandomNormal(stddev=init_stddev, seed=seed)
                         if init_rows == "all" else tf.keras.initializers.Zeros()),
            kv_creator=NamedCuckooHashTableCreator(namespace), bp_v2=bp_v2,
            init_size=initial_capacity(expected_rows),
            # ``counted`` (model.max_rows): TFRA counts every id's updates in a status table of its
            # own (``frequency``), which ``evict`` reads and the checkpoint saves.
            restrict_policy=de.FrequencyRestrictPolicy if counted else None,
            # A fused table's keys are placed by their id field (``fused_keys.KeyCodec.partition_fn``).
            partitioner=partitioner or default_partition_fn,
        )
        self.shadow = de.shadow_ops.ShadowVariable(self.variable, name=f"{variable_name(namespace, name)}-shadow")

    # A PS request (``ps_requests.py``) can read and write this table's rows itself: one TFRA
    # table, keyed by ``encode_parts``. A column-split or hot/cold table has no such attribute.
    ps_requestable = True

    # -- lookups ------------------------------------------------------------------------------
    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True) -> UniqueLookup:
        """One lookup for all of ``ids`` (any shapes, int64, pad id < 0).

        Trainable lookups go through the shadow variable (missing ids get their initial row and
        are inserted when the optimizer applies). Non-trainable lookups (evaluation) read the
        table directly and give missing ids a zero vector, so scoring is deterministic and never
        inserts rows.
        """
        ids = UniqueIds.of(ids)
        return ids.lookup(self.lookup_parts([(self, ids.real)], trainable)[0], self.dim)

    def lookup_parts(self, parts: Sequence[Tuple[object, tf.Tensor]], trainable: bool) -> List[tf.Tensor]:
        """Rows of each (table, unique real ids) part held in this TFRA table (itself; or the
        members of a fused table), with one find for all (per shard) and, for a trainable lookup,
        one shadow holding all of them (what the tape differentiates and the optimizer applies):
        the one lookup of every table, plain or fused.

        In training with ``init_rows: missing``, TFRA's shadow lookup (``shadow_ops.embedding_lookup``)
        is done by hand so that initial rows are drawn for the missing ids only: find them on the
        PS (one lookup per shard), record what decoding needs (``record``), fill the missing rows
        in, and ``remember`` them."""
        owners, ids = [o for o, _ in parts], [i for _, i in parts]
        keys = self.encode_parts(owners, ids)
        sizes = [tf.shape(i)[0] for i in ids]
        if trainable and self.init_rows == "missing" and de.ModelMode.CURRENT_SETTING == de.ModelMode.TRAIN:
            logical = tf.concat(ids, axis=0) if len(ids) > 1 else ids[0]
            # The find does not wait for the ids' write: a control edge into the PS partitions would
            # be one more tensor transfer per table and shard (bench/ps_rpcs.py).
            with tf.name_scope("shadow_embedding_lookup"):  # TFRA's own scope: the profile's buckets
                found, exists = self.variable.lookup(keys, return_exists=True)
            self.record(keys, logical, exists)
            rows = initial_rows.fill_missing(found, exists, logical, self.row_keys(owners, sizes), self.dim,
                                             self.init_stddev)
            rows = self.remember(keys, rows, exists if self.variable.bp_v2 else None)
        elif trainable:
            rows = de.shadow_ops.embedding_lookup(self.shadow, keys)
        else:
            rows, exists = self.variable.lookup(keys, return_exists=True)
            rows = rows * tf.cast(exists, rows.dtype)[:, None]
        rows = tf.reshape(rows, [-1, self.dim])
        return tf.split(rows, sizes, num=len(parts)) if len(parts) > 1 else [rows]

    # -- keys: what a fused table (``fused.FusedTable``) does differently --------------------
    def encode_parts(self, owners: Sequence[object], ids: Sequence[tf.Tensor]) -> tf.Tensor:
        """The keys of ``ids`` (one part per owner, all held here) in this TFRA table: the ids."""
        return tf.concat(ids, axis=0) if len(ids) > 1 else ids[0]

    def row_keys(self, owners: Sequence[object], sizes) -> Union[int, tf.Tensor]:
        """The initial-rows key (``initial_rows.table_key``) of the rows of ``owners``' parts."""
        return self.row_key

    def record(self, keys: tf.Tensor, ids: tf.Tensor, exists: Optional[tf.Tensor] = None,
               shard: Optional[int] = None):
        """What decoding ``keys`` back to ids needs, written on a find; nothing here (keys are ids)."""
        return None

    def remember(self, ids: tf.Tensor, rows: tf.Tensor, exists: Optional[tf.Tensor] = None) -> tf.Tensor:
        """What TFRA's trainable lookup leaves behind for its optimizer: the shadow holds ``ids``
        and their ``rows``, and the tape gets a read of it, so the gradient and the apply's upsert
        go where TFRA's own lookup sends them (``exists``: for TFRA's apply with ``bp_v2``)."""
        shadow = self.shadow
        writes = [shadow._reset_ids(ids), shadow.assign(rows, read_value=False)]
        if exists is not None:  # ``bp_v2``: ``accum`` adds the delta to existing rows, inserts the others
            writes.append(shadow.exists.assign(exists, read_value=False))
        with tf.control_dependencies(writes):
            return shadow.read_value(do_prefetch=False)

    def fill_missing(self, ids: tf.Tensor, rows: tf.Tensor, exists: tf.Tensor) -> tf.Tensor:
        """A find's ``rows`` of ``ids`` with each missing id's initial row: what a trainable lookup
        gives it (the hot tier reads cold rows through this). With ``init_rows: all`` the find
        itself drew them."""
        if self.init_rows == "all":
            return tf.reshape(rows, [-1, self.dim])
        return initial_rows.fill_missing(rows, exists, ids, self.row_key, self.dim, self.init_stddev)

    # -- state --------------------------------------------------------------------------------
    def size(self) -> int:
        return int(self.variable.size().numpy())

    def shard_sizes(self) -> List[int]:
        return [int(self.variable.size(i).numpy()) for i in range(len(self.devices))]

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        return export_variable(self.variable)

    @property
    def frequency(self):
        """The update count per id (a TFRA table, dim 1, int32) when the table is counted, else None."""
        policy = self.variable.restrict_policy
        return policy.status if policy is not None else None

    def evict(self, max_rows: int, optimizer) -> int:
        """Remove the least-updated rows (ties: the smallest ids) and their optimizer slots and
        counts until at most ``max_rows`` remain; the number removed.

        Why not TFRA's own ``restrict``: it picks among rows of equal count in hash-table export
        order, which differs after a restore refills the table, so a resumed run would evict other
        rows than an uninterrupted one. Sorting by (count, id) makes eviction a function of the
        checkpointed counts, and the resume exact. The counts are TFRA's
        ``FrequencyRestrictPolicy`` status, updated by the optimizer's apply."""
        size = self.size()
        if size <= max_rows:
            return 0
        keys, counts = export_variable(self.frequency)
        order = np.lexsort((keys, counts.reshape(-1)))  # fewest updates first, then the smallest id
        victims = tf.constant(keys[order[: size - max_rows]], tf.int64)
        for var in [self.variable, self.frequency, *self.slot_variables(optimizer)]:
            var.remove(victims)
        return int(victims.shape[0])

    def slot_variables(self, optimizer) -> List["de.Variable"]:
        """This table's optimizer slot tables (Adam: m, v).

        TFRA's ``get_slot_variables`` returns the slots of *every* table the optimizer trains,
        so keep the ones named under this variable (``<var>/<shadow>/<slot>``).
        """
        if optimizer is None:
            return []
        prefix = self.variable.name + "/"
        return [s for s in self.variable.get_slot_variables(optimizer) if s.name.startswith(prefix)]

    def variables(self, optimizer) -> List["de.Variable"]:
        """Every TFRA variable of this table: what creation waits for (``Embeddings.wait_until_created``)."""
        return [self.variable, *self.slot_variables(optimizer)]

    def slot_tables(self, optimizer) -> Dict[str, "de.Variable"]:
        """``{slot name: slot table}`` (Adam: ``m``, ``v``)."""
        return {slot_name(s): s for s in self.slot_variables(optimizer)}

    def storage(self) -> List["EmbeddingTable"]:
        return [self]

    def lookup_values(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values, exists = self.variable.lookup(tf.constant(keys, tf.int64), return_exists=True)
        return values.numpy(), exists.numpy()


def initial_capacity(expected_rows: int) -> int:
    """Pre-size hash tables for the rows the data will bring (``schema.json`` cardinality).

    A cuckoo table that grows rehashes everything; several workers inserting new keys into a
    growing PS table at once is when PS processes have crashed (SIGSEGV) in our tests. Sized
    up front, a table never grows during training unless the data outgrows its statistics.
    """
    return max(8192, int(expected_rows * 1.5)) if expected_rows else 0


def expected_table_rows(cardinality: int, max_rows: int = 0) -> int:
    """The rows a table is pre-sized for (``initial_capacity``): the data's cardinality, and for
    a table bounded by ``model.max_rows`` at most that bound.

    Why the bound: the cuckoo table allocates, and touches, every bucket of its capacity when it
    is created, so a bounded table pre-sized for every id of the data held the memory
    ``max_rows`` is there to save (bench/table_scale.py: RSS for 3x the bound). Eviction keeps
    it at ``max_rows`` rows between steps; one step's new ids fit in ``initial_capacity``'s
    headroom, or the table grows."""
    if max_rows > 0:
        return min(cardinality, max_rows) if cardinality > 0 else max_rows
    return cardinality


class Table(Protocol):
    """What the model, the meta step and the checkpoint may ask of any table."""

    name: str
    dim: int

    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True) -> UniqueLookup: ...

    def size(self) -> int: ...

    def storage(self) -> List[EmbeddingTable]: ...
