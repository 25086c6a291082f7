"""``Embeddings``: every embedding table of one model, for its whole life, behind a few verbs.

The model, the meta step, the trainer and the checkpoint talk to the sparse side only through
this class. Its life, in the order ``assemble`` (and before it ``create_tables``) writes down:

1. **create** (``create_tables``): one TFRA table per feature, each named deterministically
   (``naming.py``) and placed (``devices.py``): row-sharded over every PS, on the PS subset of
   ``cluster.placement``, or cut into column blocks (``column_split.py``); with
   ``model.fuse_tables`` the tables that share devices and a dim are the members of one fused
   TFRA table (``fused.py``), each still a table of its own name;
2. **hot tier** (``add_hot_tier``): with ``hot.budget > 0`` the hottest rows of each table move
   to worker-local variables (``hot_cold.py``, ``hot/``); the table list then holds the
   hot/cold tables in place of the plain ones. Done before the slots, whose tables it reads;
3. **slots** (``build_slots``): one TFRA-wrapped optimizer per TFRA table, whose slot tables are
   created now, outside any compiled step (a fresh run and a restored run then hold the same
   state in the same layout), then the hot tier's cold-row prefetch, which reads and writes
   those slot tables;
4. **train**: ``lookup`` (one lookup per table per step; with ``model.ps_requests: per_ps``
   one request per PS for the plain tables, ``ps_requests.py``), ``trainable`` (what the tape
   differentiates), ``apply`` (hot rows first, then the TFRA tables), with prefetch
   ``write_behind`` / ``read_ahead`` / ``keep_ahead`` around them, ``step_errors`` (a step's
   failure inside the package, as a typed error);
5. **boundaries**: ``sync_hot`` (with ``model.hot_sync_every > 1``, every rank closes the hot
   rows' open window: before a checkpoint or an eviction), ``quiesce`` (each rank writes its
   pending cold-row updates to the PS before anyone reads it: validation, checkpoint), ``step_boundary`` (rank 0 copies the hot rows
   back into the canonical PS tables), ``load_hot`` (the reverse, at start);
6. **export / restore** of the checkpoint's table files (``table_files.py``).

The trainer creates tables on rank 0 first and binds the other ranks after a barrier
(``wait_until_created`` makes the barrier mean "the PS has them").
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from gmeta_tf.config.schema import ConfigError
from gmeta_tf.embedding import fused, table_files
from gmeta_tf.embedding.column_split import ColumnSplitTable, sync_block_iterations, table_iterations
from gmeta_tf.embedding.devices import table_devices
from gmeta_tf.embedding.hot.rows import HotRows, build_hot_rows
from gmeta_tf.embedding.hot_cold import MISS_TEXT, HotColdTable
from gmeta_tf.embedding.lookup import SparseState, lookup_batch
from gmeta_tf.embedding.optimizers import TableOptimizers
from gmeta_tf.embedding.ps_requests import MODES as PS_REQUEST_MODES
from gmeta_tf.embedding.ps_requests import PsRequests
from gmeta_tf.embedding.ps_requests import resolve as resolve_ps_requests
from gmeta_tf.embedding.table import EmbeddingTable, Table
from gmeta_tf.embedding.wire import Wire
from gmeta_tf.errors import HotSetMissError
from gmeta_tf.plan.placement_file import ColumnSplit


@dataclass(frozen=True)
class TrainableRows:
    shadows: List[tf.Variable]
    hot: List[tf.Variable]
    cold: List[tf.Variable]


def create_tables(names: Sequence[str], dim: int, *, namespace: str, ps_tasks: int,
                  placement: Mapping[str, object], init_stddev: float, seed: int, bp_v2: bool,
                  expected_rows: Mapping[str, int], counted: Sequence[str] = (),
                  init_rows: str = "missing", fuse: bool = False) -> List[Table]:
    """One table per name, in order (table i is seeded ``seed + i``); ``init_rows``
    (``model.init_rows``) says which lookups draw initial rows (``EmbeddingTable``). ``placement[name]`` is a
    list of PS tasks, a ``ColumnSplit`` (the planner's column blocks), or absent (every PS).
    ``counted`` tables (``model.max_rows``) count each id's updates, for ``Embeddings.evict``.
    ``fuse`` (``model.fuse_tables``): the tables that share devices (and dim) are the members of
    one ``FusedTable`` (``fused.py``), each still a table of its own name for everything above."""
    tables: List[Optional[Table]] = [None] * len(names)
    keys = []
    for i, name in enumerate(names):
        spec = placement.get(name)
        if name in counted and isinstance(spec, ColumnSplit):
            raise ConfigError(f"config key 'model.max_rows': table {name!r} is column-split by the placement; "
                              f"bounding a split table's rows is not supported, drop one of the two")
        if isinstance(spec, ColumnSplit):  # planner's column split: n tables of dim d/n
            tables[i] = ColumnSplitTable(name, dim, spec.columns, ps_tasks, namespace, init_stddev,
                                         seed=seed + i, bp_v2=bp_v2, expected_rows=expected_rows.get(name, 0),
                                         init_rows=init_rows)
        keys.append(None if isinstance(spec, ColumnSplit) or not fuse else
                    fused.group_key(table_devices(ps_tasks, spec), dim, name in counted, init_rows))
    for idx in fused.groups(keys):
        devices = table_devices(ps_tasks, placement.get(names[idx[0]]))
        group = fused.FusedTable([(names[i], seed + i) for i in idx], dim, devices, namespace, init_stddev,
                                 bp_v2=bp_v2, expected_rows=sum(expected_rows.get(names[i], 0) for i in idx))
        for i, member in zip(idx, group.members):
            tables[i] = member
    for i, name in enumerate(names):
        if tables[i] is None:
            tables[i] = EmbeddingTable(name, dim, table_devices(ps_tasks, placement.get(name)), namespace, init_stddev,
                                       seed=seed + i, bp_v2=bp_v2, expected_rows=expected_rows.get(name, 0),
                                       counted=name in counted, init_rows=init_rows)
    return tables


class Embeddings:
    def __init__(self, tables: Sequence[Table], cat_names: Sequence[str], multi_names: Sequence[str],
                 ps_requests: str = "auto"):
        if ps_requests not in PS_REQUEST_MODES:
            raise ValueError(f"ps_requests must be one of {', '.join(PS_REQUEST_MODES)}, got {ps_requests!r}")
        self.tables: List[Table] = list(tables)  # feature order: categorical, then multi-hot
        self.cat_names = list(cat_names)
        self.multi_names = list(multi_names)
        self.ps_requests = ps_requests  # model.ps_requests
        self.optimizers: Optional[TableOptimizers] = None  # set by build_slots
        self.requests: Optional[PsRequests] = None  # set by build_slots where ps_requests is per_ps
        self.hot: Optional[HotRows] = None  # set by add_hot_tier
        self.wire = Wire()  # the dtype rows and row gradients cross to the PS in (use_wire)

    # -- what exists ----------------------------------------------------------------------------
    @property
    def names(self) -> List[str]:
        return [t.name for t in self.tables]

    def storage(self) -> List[EmbeddingTable]:
        """The TFRA tables themselves (a column-split table is several, the members of a fused
        table share one): train, save, size these."""
        return list({id(s): s for t in self.tables for s in t.storage()}.values())

    def fused(self) -> List[fused.FusedTable]:
        return fused.fused_tables(self.storage())

    def shadows(self) -> List[tf.Variable]:
        return [t.shadow for t in self.storage()]

    def shadows_by_table(self) -> Dict[str, tf.Variable]:
        return {t.name: t.shadow for t in self.storage()}

    def rows_by_device(self) -> Dict[str, Dict[str, int]]:
        """``{TFRA table: {device: rows}}``: each shard's size, read where it lives."""
        return {t.name: dict(zip(t.devices, t.shard_sizes())) for t in self.storage()}

    # -- construction -----------------------------------------------------------------------------
    def assemble(self, cfg, emb_opt: TableOptimizers, sync, log=print) -> Optional[HotRows]:
        """Steps 2 and 3 of the life above, in their order: hot tier, then slots (+ prefetch).
        ``cfg`` is the run's ``Config`` (``hot.*``, ``train.embedding_*``, ``data.*``)."""
        self.use_wire(sync.wire)
        hot = self.add_hot_tier(cfg, sync, log)
        if hot is not None and cfg.model.max_rows:
            raise ConfigError("config key 'model.max_rows': bounded tables and a hot tier (hot.budget) "
                              "do not go together yet; set one of them")
        self.build_slots(emb_opt)
        if sync.rank == 0 and not self.wire.exact:
            kept = self.float32_on_wire()
            log(f"wire {self.wire.dtype}: PS rows and their gradients, dense and hot-row gradients"
                + (f"; float32 for {', '.join(kept)} (their optimizer slots travel)" if kept else ""))
        return hot

    def use_wire(self, wire: Wire) -> None:
        """Send rows and row gradients to and from the PS in ``wire``'s dtype
        (``cluster.wire_dtype``; the worker's sync carries it) from the next ``build_slots`` on."""
        self.wire = wire

    def float32_on_wire(self) -> List[str]:
        """The tables whose rows still cross to the PS in float32 whatever the wire: TFRA's
        per-table path and the hot tier's read-ahead cold rows, which move optimizer slots with
        the rows and update them on the worker (``ps_requests.py``)."""
        out = []
        for t in self.tables:
            hot = isinstance(t, HotColdTable)
            owner = t.base if hot else t
            if (hot and t.local_only) or not any("/job:ps" in d for s in owner.storage() for d in s.devices):
                continue
            if (hot and t.prefetch is not None) or self.requests is None or not self.requests.takes(owner):
                out.append(t.name)
        return out

    def add_hot_tier(self, cfg, sync, log=print) -> Optional[HotRows]:
        """The hot rows ``cfg.hot`` asks for (None when its budget is 0)."""
        return self.use_hot(build_hot_rows(cfg, self.tables, self.cat_names, self.multi_names, sync, log=log))

    def use_hot(self, rows: Optional[HotRows]) -> Optional[HotRows]:
        """Serve through ``rows``' hot/cold tables from now on (before ``build_slots``)."""
        if rows is not None:
            self.tables = rows.all_tables
            self.hot = rows
        return rows

    def build_slots(self, emb_opt: TableOptimizers) -> None:
        """One optimizer per TFRA table and its slot tables, then the hot tier's prefetch (which
        needs those slot tables). Idempotent: every holder of the optimizers may call it."""
        emb_opt.build(self.shadows_by_table())
        if (resolve_ps_requests(self.ps_requests, self.tables) == "per_ps"
                and (self.requests is None or self.optimizers is not emb_opt or self.requests.wire != self.wire)):
            self.requests = PsRequests(self.tables, emb_opt, self.wire)
        self.optimizers = emb_opt
        if self.hot is not None:
            # A hot table whose cold rows are read with other tables' (its base is a fused
            # member, or a PS request takes it) is not read ahead: ``lookup.together``.
            self.hot.attach(emb_opt, lambda t: fused.looked_up_together(t.base) or
                            (self.requests is not None and self.requests.takes(t.base)))

    def wait_until_created(self) -> None:
        """Block until the PS has really executed this process's table and slot creation.

        Remote eager ops are *enqueued*: Python returns before the PS ran them, so without this a
        barrier could let other ranks bind before the tables exist. Reading every table's and
        slot table's size is answered only after the creation ops ahead of it in the stream.
        """
        from tensorflow.python.eager import context

        for table in self.storage():
            for var in table.variables(self._opt().for_shadow(table.shadow)):
                for shard in range(len(var.devices)):
                    int(var.size(shard).numpy())
        context.async_wait()

    # -- one step ---------------------------------------------------------------------------------
    def lookup(self, batch: dict, *, trainable: bool, per_task: bool, hot_apart: bool = False) -> SparseState:
        """Every feature's rows for a task batch: one lookup per table (support + query).
        ``hot_apart``: the hot rows are left to the caller (``meta.hot_in_program``; ``hot_cold.py``)."""
        return lookup_batch(self.tables, batch, self.cat_names, self.multi_names,
                            trainable=trainable, per_task=per_task, requests=self.requests, hot_apart=hot_apart)

    def trainable(self) -> "TrainableRows":
        """What a step's tape differentiates, by who applies its gradient: the shadows TFRA's
        optimizers still apply (not local-only hot tables, nor prefetched ones), the hot rows,
        and the prefetched cold rows."""
        if self.hot is None:
            return TrainableRows(self.shadows(), [], [])
        return TrainableRows(self.hot.remote_shadows(self.shadows()), self.hot.variables, self.hot.cold_variables)

    def apply(self, rows: "TrainableRows", shadow_grads: Sequence, hot_grads: Sequence = (),
              cold_grads: Sequence = (), hot_sync: bool = True, hot_applied: bool = False) -> Optional[list]:
        """Apply one step's gradients (``rows`` is what ``trainable`` gave the tape). The hot rows
        go first: they read the tables' step counters, which the TFRA apply increments. Returns
        the prefetched tables' updates (``HotRows.store``'s patch), None without a hot tier.
        ``hot_sync``: whether this step closes the hot rows' window (``model.hot_sync_every``).
        ``hot_applied``: the compiled step already applied the hot rows' update
        (``meta.hot_in_program``, ``HotRows.apply_rows``); the rest is applied here."""
        done = None
        if self.hot is not None:
            done = self.hot.apply(list(hot_grads), self._opt(), list(cold_grads), sync=hot_sync,
                                  hot_applied=hot_applied)
        rest = list(zip(shadow_grads, rows.shadows))
        if self.requests is not None:  # the tables this step's lookup sent as PS requests
            rest = self.requests.apply(rest)
        self._opt().apply_gradients(rest)
        return done

    # -- cold-row prefetch, inside the compiled step (``hot/prefetch.py``) -------------------
    def write_behind(self) -> None:
        """The previous step's cold-row updates, as ops writing them to the PS."""
        if self.hot is not None:
            self.hot.flush_ops()

    def read_ahead(self, batch: dict) -> list:
        """Ops reading ``batch``'s cold rows (values and slots) from the PS."""
        return self.hot.fetch(batch, self.cat_names, self.multi_names) if self.hot is not None else []

    def keep_ahead(self, ahead: list, done: Optional[list] = None) -> None:
        """Make ``ahead`` the next step's cold rows, patched with this step's updates ``done``."""
        if self.hot is not None:
            self.hot.store(ahead, done)

    @contextmanager
    def step_errors(self, where: str) -> Iterator[None]:
        """Turn a step failure that the package caused into its typed error. ``where`` prefixes
        the message (``rank 0, step 12``)."""
        try:
            yield
        except tf.errors.InvalidArgumentError:
            missed = [t for t in self.tables if isinstance(t, HotColdTable) and t.local_only
                      and int(t.misses.numpy()) > 0]
            if missed:
                t = missed[0]
                raise HotSetMissError(f"{where}: hot table {t.name}: {MISS_TEXT} "
                                      f"({int(t.misses.numpy())} such id(s) in this batch)") from None
            raise

    # -- boundaries -------------------------------------------------------------------------------
    def quiesce(self) -> None:
        """This rank's pending (write-behind) cold-row updates go to the PS now: call on every rank
        before anyone reads the PS tables whole (validation, checkpoint)."""
        if self.hot is not None:
            self.hot.flush()

    def sync_hot(self) -> bool:
        """Every rank, at the same point between steps: close the hot rows' open window
        (``model.hot_sync_every > 1``, ``hot/stale.py``) so the replicas are the synced ones
        before anything saves or reads them as the run's state. True if there was one."""
        return self.hot is not None and self.hot.sync_now(self._opt())

    def step_boundary(self) -> None:
        """Make the PS tables canonical again: rank 0 copies the hot rows and their slots there
        (the replicas are identical, so rank 0's copy is everyone's)."""
        if self.hot is not None:
            self.hot.write_back(self._opt())

    def evict(self, max_rows: Mapping[str, int]) -> Dict[str, int]:
        """Bound each named table to ``max_rows[name]`` rows (``EmbeddingTable.evict``): rank 0,
        between steps, after every rank's updates reached the PS; rows removed per table."""
        by_name = {t.name: t for t in self.tables}
        return {name: by_name[name].evict(limit, self._opt().for_shadow(by_name[name].shadow))
                for name, limit in max_rows.items()}

    def load_hot(self) -> None:
        """Rank 0 reads the hot rows from the (restored) PS tables; the caller broadcasts
        ``replicated_state`` to the other ranks."""
        if self.hot is not None:
            self.hot.load(self._opt())

    def start_hot_window(self) -> None:
        """Every rank, after the start broadcast: the hot window starts from the rows it got."""
        if self.hot is not None:
            self.hot.restart_window()

    def replicated_state(self) -> List[tf.Variable]:
        """What rank 0 broadcasts so every replica starts identical: the tables' step counters
        and the hot rows with their slots."""
        return list(self._opt().iterations().values()) + (self.hot.state_variables if self.hot is not None else [])

    # -- checkpoint -------------------------------------------------------------------------------
    def step_counters(self) -> Dict[str, object]:
        """The optimizers' step counters, one per model table: what the dense checkpoint tracks.
        The members of a fused table share one, saved under each name (``fused.CounterView``)."""
        return fused.step_counters(self.tables, table_iterations(self.tables, self._opt()))

    def rows(self) -> Iterator[Tuple[str, np.ndarray, np.ndarray]]:
        """``(file key, keys, values)`` of every table, slot table and update count, by model
        table: a fused table's rows are decoded into its members' (``FusedTable.logical_rows``),
        so the files are the same whether the run fused its tables or not."""
        for key, var in self._files().items():
            yield (key, *table_files.export_variable(var))
        for table in self.fused():
            for key, (keys, values) in table.logical_rows(self._opt().for_shadow(table.shadow)).items():
                yield key, keys, values

    def export(self, checkpoint_dir: str) -> Dict[str, int]:
        """Write every model table and slot table under ``checkpoint_dir/tables``; rows per file."""
        return table_files.write_rows(checkpoint_dir, self.rows())

    def restore(self, checkpoint_dir: str) -> None:
        """Refill every table and slot table from ``checkpoint_dir`` (re-cutting column splits,
        encoding a fused table's keys) after the step counters were read (a split table's blocks
        take its one counter)."""
        sync_block_iterations(self.tables, self._opt())
        table_files.restore_tables(checkpoint_dir, self._files(), self.names)
        for table in self.fused():
            opt = self._opt().for_shadow(table.shadow)
            keys = [m.name + suffix for suffix in table.file_suffixes(opt) for m in table.members]
            table.restore_rows({k: table_files.load_rows(checkpoint_dir, k, self.names) for k in keys}, opt)

    def _files(self) -> Dict[str, object]:
        """``{file key: TFRA variable}`` of the tables saved as they are (not fused)."""
        return table_files.files_of(fused.saved_as_is(self.storage()), self._opt())

    def _opt(self) -> TableOptimizers:
        if self.optimizers is None:
            raise RuntimeError("Embeddings.build_slots must run before the optimizers are used")
        return self.optimizers
