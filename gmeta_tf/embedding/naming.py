"""Deterministic names for TFRA tables, so the same name means the same PS resource everywhere.

**Table aliasing** (hazard 2 in docs/architecture.md). In eager mode TFRA names each hash-table
resource ``table_<uid>`` from a per-process counter. Workers that create tables in a different
order would then bind their tables to *another* variable's resource on the PS, silently.
``NamedCuckooHashTableCreator`` gives every table a deterministic ``shared_name`` derived from
its own name (``<namespace>.<var>_mht_<i>of<N>``), so the same table name means the same PS
resource on every worker, whatever the creation order. Optimizer slot tables inherit the
variable's ``kv_creator`` and are covered too. This overrides the private
``CuckooHashTable._create_resource``; ``tests/test_tfra_hazards.py`` fails if TFRA changes it.

The namespace also separates models that live in one process (embedded mode, evaluation after
training, tests, benchmarks): two models built with different namespaces never share a table,
two workers of one job built with the same namespace always do. It is part of the variable
*name* too (``variable_name``), because TFRA keeps optimizer slot tables in a process-global
store keyed by ``<variable name>/<shadow>/<slot>``: without it, a second model with the same
feature names would silently reuse (and update) the first model's Adam moments.
"""
from __future__ import annotations

import itertools
import os

from tensorflow.python.eager import context

from gmeta_tf.embedding.tfra import de

_local_namespace_counter = itertools.count()


def local_namespace(prefix: str = "local") -> str:
    """A namespace no other model in this (or any other) process uses: embedded mode, tests."""
    return f"{prefix}{os.getpid()}n{next(_local_namespace_counter)}"


def shared_table_name(namespace: str, table_name: str) -> str:
    return f"{namespace}.{table_name}"


def variable_name(namespace: str, table: str) -> str:
    """The ``de.Variable`` name of a table (its shadow is ``<this>-shadow``)."""
    return f"{namespace}-{table}"


class NamedCuckooHashTable(de.CuckooHashTable):
    """A ``CuckooHashTable`` whose eager resource ``shared_name`` is its own (namespaced) name."""

    def __init__(self, *args, namespace: str, **kwargs):
        self._gmeta_namespace = namespace
        super().__init__(*args, **kwargs)

    def _create_resource(self):
        if context.executing_eagerly():
            self._shared_name = shared_table_name(self._gmeta_namespace, self._name)
        return super()._create_resource()


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
