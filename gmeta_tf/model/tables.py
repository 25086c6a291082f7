"""TFRA dynamic-embedding tables: creation, the one-lookup-per-step rule, export / import.

This is the only module that touches TFRA internals. Two hazards (docs/architecture.md) shape it:

* **Table aliasing.** In eager mode TFRA names each hash-table resource ``table_<uid>`` from a
  per-process counter. Workers that create tables in a different order would then bind their
  tables to *another* variable's resource on the PS, silently. ``NamedCuckooHashTableCreator``
  gives every table a deterministic ``shared_name`` derived from its own name
  (``<namespace>.<var>_mht_<i>of<N>``), so the same table name means the same PS resource on
  every worker, whatever the creation order. Optimizer slot tables inherit the variable's
  ``kv_creator`` and are covered too. This overrides the private
  ``CuckooHashTable._create_resource``; ``tests/test_tfra_hazards.py`` fails if TFRA changes it.
* **Wrong gradients from two lookups.** A ``ShadowVariable`` remembers only the ids of its last
  lookup in a step. ``EmbeddingTable.lookup_unique`` therefore looks up the concatenated,
  de-duplicated ids of a whole batch (support and query) once, and callers gather from it.

The namespace also separates models that live in one process (embedded mode, evaluation after
training, tests, benchmarks): two models built with different namespaces never share a table,
two workers of one job built with the same namespace always do. It is part of the variable
*name* too, because TFRA keeps optimizer slot tables in a process-global store keyed by
``<variable name>/<shadow>/<slot>``: without it, a second model with the same feature names
would silently reuse (and update) the first model's Adam moments.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_recommenders_addons as tfra
from tensorflow.python.eager import context

import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)

de = tfra.dynamic_embedding

_local_namespace_counter = itertools.count()


def local_namespace(prefix: str = "local") -> str:
    """A namespace no other model in this (or any other) process uses: embedded mode, tests."""
    return f"{prefix}{os.getpid()}n{next(_local_namespace_counter)}"


class NamedCuckooHashTable(de.CuckooHashTable):
    """A ``CuckooHashTable`` whose eager resource ``shared_name`` is its own (namespaced) name."""

    def __init__(self, *args, namespace: str, **kwargs):
        self._gmeta_namespace = namespace
        super().__init__(*args, **kwargs)

    def _create_resource(self):
        if context.executing_eagerly():
            self._shared_name = shared_table_name(self._gmeta_namespace, self._name)
        return super()._create_resource()


def shared_table_name(namespace: str, table_name: str) -> str:
    return f"{namespace}.{table_name}"


class NamedCuckooHashTableCreator(de.CuckooHashTableCreator):
    def __init__(self, namespace: str, config=None, saver=None):
        super().__init__(config=config, saver=saver)
        self.namespace = namespace

    def create(self, key_dtype=None, value_dtype=None, default_value=None, name=None,
               checkpoint=None, init_size=0, config=None, device=None,
               shard_saveable_object_fn=None):
        return NamedCuckooHashTable(
            key_dtype=key_dtype, value_dtype=value_dtype, default_value=default_value,
            name=name, checkpoint=checkpoint, init_size=init_size, config=config,
            device=device, shard_saveable_object_fn=shard_saveable_object_fn,
            namespace=self.namespace,
        )


@dataclass
class UniqueLookup:
    """Rows for the de-duplicated ids of one batch of one table.

    ``rows[i]`` is the embedding of the i-th unique id (zeros for the pad id);
    ``index`` maps every input position (flattened, in input order) to its row.
    """

    rows: tf.Tensor  # [U, D]
    index: tf.Tensor  # [P] int32


class EmbeddingTable:
    """One feature's TFRA ``de.Variable`` plus the ``ShadowVariable`` the optimizer trains.

    ``devices`` places the hash-table shards: ``["/CPU:0"]`` in embedded mode, PS task devices
    (``/job:ps/task:i/device:CPU:0``) in distributed mode; keys are row-sharded by
    ``id % len(devices)`` (TFRA's default partitioner).
    """

    def __init__(self, name: str, dim: int, devices: Sequence[str], namespace: str,
                 init_stddev: float, seed: int, bp_v2: bool = False, expected_rows: int = 0):
        self.name = name
        self.dim = dim
        self.devices = list(devices)
        self.namespace = namespace
        self.variable = de.Variable(
            key_dtype=tf.int64, value_dtype=tf.float32, dim=dim, devices=self.devices,
            name=f"{namespace}-{name}",
            initializer=tf.keras.initializers.RandomNormal(stddev=init_stddev, seed=seed),
            kv_creator=NamedCuckooHashTableCreator(namespace), bp_v2=bp_v2,
            init_size=initial_capacity(expected_rows),
        )
        self.shadow = de.shadow_ops.ShadowVariable(self.variable, name=f"{namespace}-{name}-shadow")

    # -- lookups ------------------------------------------------------------------------------
    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True) -> UniqueLookup:
        """One lookup for all of ``ids`` (any shapes, int64, pad id < 0).

        Trainable lookups go through the shadow variable (missing ids get their random initial
        value and are inserted when the optimizer applies). Non-trainable lookups (evaluation)
        read the table directly and give missing ids a zero vector, so scoring is
        deterministic and never inserts rows.
        """
        flat = tf.concat([tf.reshape(x, [-1]) for x in ids], axis=0)
        uniq, index = tf.unique(flat, out_idx=tf.int32)
        valid = uniq >= 0
        real = tf.boolean_mask(uniq, valid)
        if trainable:
            rows = de.shadow_ops.embedding_lookup(self.shadow, real)
        else:
            rows, exists = self.variable.lookup(real, return_exists=True)
            rows = rows * tf.cast(exists, rows.dtype)[:, None]
        rows = tf.reshape(rows, [-1, self.dim])
        # Pad ids map to an appended zero row: they are never looked up, never trained.
        n_real = tf.shape(real)[0]
        rows = tf.concat([rows, tf.zeros([1, self.dim], rows.dtype)], axis=0)
        row_of_unique = tf.where(valid, tf.cumsum(tf.cast(valid, tf.int32)) - 1, n_real)
        return UniqueLookup(rows=tf.gather(rows, row_of_unique), index=index)

    # -- state --------------------------------------------------------------------------------
    def size(self) -> int:
        return int(self.variable.size().numpy())

    def shard_sizes(self) -> List[int]:
        return [int(self.variable.size(i).numpy()) for i in range(len(self.devices))]

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        return export_variable(self.variable)

    def slot_variables(self, optimizer) -> List["de.Variable"]:
        """This table's optimizer slot tables (Adam: m, v).

        TFRA's ``get_slot_variables`` returns the slots of *every* table the optimizer trains,
        so keep the ones named under this variable (``<var>/<shadow>/<slot>``).
        """
        if optimizer is None:
            return []
        prefix = self.variable.name + "/"
        return [s for s in self.variable.get_slot_variables(optimizer) if s.name.startswith(prefix)]

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


def export_variable(var) -> tuple[np.ndarray, np.ndarray]:
    keys, values = var.export()
    return keys.numpy(), values.numpy()


def import_variable(var, keys: np.ndarray, values: np.ndarray, chunk: int = 1 << 18) -> None:
    """Upsert ``keys``/``values`` into a de.Variable in chunks (bounded RPC size to a PS)."""
    for lo in range(0, len(keys), chunk):
        var.upsert(tf.constant(keys[lo:lo + chunk], tf.int64),
                   tf.constant(values[lo:lo + chunk], var.value_dtype))


def table_devices(ps_tasks: int, placement: Optional[List[int]] = None) -> List[str]:
    """Devices for one table: every PS task (row-sharded) or the ``placement`` subset."""
    if ps_tasks == 0:
        return ["/job:localhost/replica:0/task:0/device:CPU:0"]
    tasks = placement if placement is not None else list(range(ps_tasks))
    return [f"/job:ps/replica:0/task:{t}/device:CPU:0" for t in tasks]
