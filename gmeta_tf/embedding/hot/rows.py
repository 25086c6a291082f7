"""The hot rows of one worker: built from the profile, loaded from / written back to the PS tables.

The PS tables stay the canonical store. A hot row is *read* from them when training starts
(rank 0 reads, then every rank receives rank 0's copy through the broadcast that already
equalises the dense weights) and *written back* to them, with its optimizer slots, before
every checkpoint. Checkpoints therefore contain only PS tables, exactly as without the split,
and a resumed run may use another budget or another profile.

Between two write-backs the PS copy of a hot row is stale, which is safe because no worker ever
reads a hot id from the PS: the hot set is a pure function of the profile file and the config,
the same on every rank (``check_same_everywhere``).
"""
from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from gmeta_tf.data.id_profile import PROFILE_NPZ, load_profile
from gmeta_tf.data.task_format import load_schema
from gmeta_tf.embedding.column_split import ColumnSplitTable
from gmeta_tf.embedding.hot.auto import allreduce_bytes, decide, hot_touched, ps_payload
from gmeta_tf.embedding.hot.by_bytes import TablePay, paying_rows
from gmeta_tf.embedding.hot.prefetch import ColdPrefetch, read_rows
from gmeta_tf.embedding.hot.select import HotSet, select_hot
from gmeta_tf.embedding.hot.stale import StaleWindow
from gmeta_tf.embedding.hot.sync import HotGradSync, choose_mode, touched_slots
from gmeta_tf.embedding.hot_cold import HotColdTable
from gmeta_tf.embedding.lookup import feature_ids
from gmeta_tf.embedding.optimizers import LazyRowOptimizer
from gmeta_tf.errors import ClusterError
from gmeta_tf.metaio.rare_ids import pooled_profiles
from gmeta_tf.plan.network import Link


class HotRows:
    def __init__(self, tables: Sequence, hot_set: HotSet, sync, optimizer: str, lr: float,
                 touched: Dict[str, float], prefetch: bool = True, sync_every: int = 1):
        """``touched``: the distinct hot rows of each table one exchange is expected to carry
        (``expected_touched`` over a window of ``sync_every`` steps), which sizes each table's
        gradient exchange (``hot/sync.py``). ``sync_every`` (``model.hot_sync_every``): 1 syncs
        every step; k > 1 trains each replica locally and syncs every k steps (``hot/stale.py``)."""
        if int(sync_every) < 1:
            raise ValueError(f"hot rows: sync_every must be >= 1, got {sync_every!r}")
        self.sync_every = int(sync_every)
        self.hot_set = hot_set
        self.prefetch = bool(prefetch)
        self.kind, self.lr = optimizer, float(lr)
        self.prefetched: List[HotColdTable] = []  # filled by attach
        self.own: Dict[str, tf.Variable] = {}  # shadow -> step counter this tier advances (attach)
        self.tables: List[HotColdTable] = []
        self.skipped: List[str] = []
        # ``tables`` with the hot/cold ones in place of their plain tables: the owner
        # (``collection.Embeddings.add_hot_tier``) takes this as its table list.
        self.all_tables = list(tables)
        for i, table in enumerate(tables):
            ids = hot_set.ids.get(table.name)
            if isinstance(table, ColumnSplitTable):
                # The planner cut this table into column blocks on several PS; a hot copy would
                # have to be cut the same way. Keep it wholly on the PS (hot.select's coverage
                # print still lists it; rank 0 logs the skip).
                self.skipped.append(table.name)
                continue
            if ids is not None and len(ids):
                self.all_tables[i] = HotColdTable(table, ids, hot_set.local_only.get(table.name, False))
                self.tables.append(self.all_tables[i])
        self.names = [t.name for t in self.tables]
        self.opt = LazyRowOptimizer(optimizer, lr, {t.name: t.values for t in self.tables})
        self.grad_sync = HotGradSync(sync, {t.name: t.num_hot for t in self.tables},
                                     {t.name: t.dim for t in self.tables}, touched)
        # k > 1: the window's anchors and accumulators; whether a window has steps not yet synced
        # (the same on every rank: set by the step schedule, ``TrainStep.step``).
        self.window = (StaleWindow({t.name: t.values for t in self.tables}, self.opt.slots)
                       if self.sync_every > 1 else None)
        self.window_open = False
        self._sync_fn = None

    def attach(self, emb_opt, cold_together=lambda table: False) -> None:
        """Give every table with PS work a ``ColdPrefetch`` (``hot.prefetch``), but those whose
        cold rows are read with other tables' (``cold_together``: a fused table's member, a PS
        request's table). Called by the meta step once the TFRA optimizer has created the slot
        tables the prefetch reads and writes."""
        if self.prefetch and not self.prefetched:
            for table in self.tables:
                if not table.local_only and not cold_together(table):
                    table.prefetch = ColdPrefetch(table, self.kind, self.lr, self._slot_tables(table, emb_opt))
                    self.prefetched.append(table)
            self._flush_fn = tf.function(self.flush_ops, autograph=False)
        # The TFRA tables whose step this tier applies: every logical table on them is served
        # without TFRA's apply (local-only or read ahead). A fused table is the tier's only when
        # all its members are: then the tier advances its one counter, once a step.
        users: Dict[str, List] = {}
        for t in self.all_tables:
            for s in t.storage():
                users.setdefault(s.shadow.name, []).append(t)
        self.own = {name: emb_opt.by_shadow[name].iterations for name, ts in users.items()
                    if all(isinstance(t, HotColdTable) and (t.local_only or t.prefetch is not None) for t in ts)}

    # -- inside the compiled step --------------------------------------------------------------
    @property
    def variables(self) -> List[tf.Variable]:
        return [t.values for t in self.tables]

    @property
    def cold_variables(self) -> List[tf.Variable]:
        """The prefetched cold rows the step differentiates (one buffer per prefetched table)."""
        return [t.prefetch.trainable for t in self.prefetched]

    def remote_shadows(self, shadows: List) -> List:
        """The shadows the TFRA optimizer (or a PS request) still applies to: not those of
        local-only tables (no PS work) nor of prefetched ones (``apply`` updates their cold rows)."""
        return [s for s in shadows if s.name not in self.own]

    def apply(self, grads: List, emb_opt, cold_grads: List = (), sync: bool = True,
              hot_applied: bool = False) -> List:
        """Aggregate over ranks, then update. Call before the tables' own apply (it reads their
        step counters, which that apply increments; for a table with no TFRA apply, local-only
        or prefetched, the counter is advanced here, so Adam's bias correction and the
        checkpointed counter stay what the PS path has). Returns the prefetched tables' updates
        (``store``'s patch). With ``sync_every > 1``, ``sync`` says whether this step closes the
        window (``hot/stale.py``); otherwise each rank applies its own gradient and exchanges
        nothing. ``hot_applied``: the compiled step did this step's own part already
        (``meta.hot_in_program``, ``ProgramStep``): in one process the apply, inside a window the
        accumulate and the local apply; what is left is the window's close, the cold rows and the
        counters, and ``grads`` is unused."""
        cold = dict(zip([t.name for t in self.prefetched], cold_grads))
        done = []
        counters = {t.name: emb_opt.for_shadow(t.base.shadow).iterations for t in self.tables}
        if self.window is None and not hot_applied:  # every step: the exact path as it always was
            for table, (slots, grad) in zip(self.tables, self.grad_sync.aggregate(self.names, grads)):
                self.opt.apply(table.values, table.name, slots, grad, counters[table.name])
        elif self.window is not None:
            for table, g in ([] if hot_applied else zip(self.tables, grads)):  # else: the program did it
                slots, grad = touched_slots(g, table.num_hot)
                self.window.add(table.name, slots, grad)
                if not sync:  # the rank's own step, undone at the sync (``StaleWindow.rewind``)
                    self.opt.apply(table.values, table.name, slots, grad, counters[table.name])
            if sync:
                self.window.merge(self.names, self.grad_sync,
                                  lambda t, rows, grad: self.opt.apply(self.values_of[t], t, rows, grad, counters[t]))
        for table in self.tables:
            if table.prefetch is not None:
                done.append(table.prefetch.update(cold[table.name], counters[table.name]))
        for iterations in self.own.values():  # after every read above; once per TFRA table
            iterations.assign_add(1)
        return done

    def apply_rows(self, table: HotColdTable, slot: tf.Tensor, row_grads: tf.Tensor, iterations: tf.Tensor) -> None:
        """``table``'s update from the gradients of a step's unique ids (``slot``: each one's hot
        slot, -1 for a cold id or the pad), inside the compiled step (``meta.hot_in_program``): the
        rank's own gradient, which is the mean in one process and the local step inside a window
        (``ProgramStep``'s ``apply`` and ``local``). ``iterations``:
        the table's step counter read before the step, as ``apply`` reads it."""
        self.opt.apply_rows(table.values, table.name, slot, row_grads, iterations)

    @property
    def values_of(self) -> Dict[str, tf.Variable]:
        return {t.name: t.values for t in self.tables}

    def sync_now(self, emb_opt) -> bool:
        """Close an open window between steps (every rank, at the same point: before a
        checkpoint or an eviction), so what is saved is the synced replica. The one optimizer
        step takes ``t`` = the window's last step: the counters, advanced by that step, less one
        (``hot/stale.py``). Returns whether there was a window to close."""
        if self.window is None or not self.window_open:
            return False
        if self._sync_fn is None:
            def close():
                counters = {t.name: emb_opt.for_shadow(t.base.shadow).iterations for t in self.tables}
                self.window.merge(self.names, self.grad_sync, lambda t, rows, grad: self.opt.apply(
                    self.values_of[t], t, rows, grad, counters[t].read_value() - 1))
            self._sync_fn = tf.function(close, autograph=False)
        self._sync_fn()
        self.window_open = False
        return True

    def restart_window(self) -> None:
        """Start a window from the rows as they are (after ``load`` and the start broadcast)."""
        if self.window is not None:
            self.window.restart()
        self.window_open = False

    def fetch(self, batch, cat_names, multi_names) -> List:
        """Read ahead: ``batch``'s cold ids and their PS rows, per prefetched table."""
        ids = dict(zip(list(cat_names) + list(multi_names), feature_ids(batch, cat_names, multi_names)))
        out = []
        for t in self.prefetched:
            s_ids, q_ids, _ = ids[t.name]
            cold = t.cold_ids([s_ids, q_ids])
            out.append((cold, t.prefetch.fetch(cold)))
        return out

    def store(self, fetched: List, done: Optional[List] = None) -> None:
        for i, (t, (ids, rows)) in enumerate(zip(self.prefetched, fetched)):
            t.prefetch.store(ids, rows, done[i] if done is not None else None)

    def flush_ops(self) -> None:
        """The pending writes, as ops (inside a compiled step)."""
        for t in self.prefetched:
            t.prefetch.flush()

    def flush(self) -> None:
        """Write every prefetched table's pending update to the PS now (each rank, before a
        checkpoint: the write-behind would otherwise land after the export)."""
        if self.prefetched:
            self._flush_fn()

    # -- state ----------------------------------------------------------------------------------
    @property
    def state_variables(self) -> List[tf.Variable]:
        """Values and slots: what rank 0 broadcasts so every replica starts identical."""
        return self.variables + [v for t in self.names for _, v in sorted(self.opt.slots[t].items())]

    def _slot_tables(self, table, emb_opt) -> Dict[str, object]:
        return table.base.slot_tables(emb_opt.for_shadow(table.base.shadow))

    def load(self, emb_opt) -> None:
        """Read hot rows and their slots from the (PS) tables. Rows the tables do not hold yet
        get the table's initializer value, slots their optimizer's initial value."""
        for table in self.tables:
            keys = tf.constant(table.hot_ids, tf.int64)
            fetched = read_rows({"value": table.base.variable, **self._slot_tables(table, emb_opt)}, keys, table.dim,
                                table.base)
            table.values.assign(fetched["value"][0])
            for name, var in self.opt.slots[table.name].items():
                if name in fetched:
                    var.assign(fetched[name][0])
        self.restart_window()

    def write_back(self, emb_opt) -> None:
        """Upsert hot values and slots into the canonical (PS) tables (after this rank's pending
        cold writes)."""
        self.flush()
        for table in self.tables:
            keys = tf.constant(table.hot_ids, tf.int64)
            table.base.variable.upsert(keys, table.values)
            slot_tables = self._slot_tables(table, emb_opt)
            for name, var in self.opt.slots[table.name].items():
                if name in slot_tables:
                    slot_tables[name].upsert(keys, var)

    def ps_mismatches(self) -> int:
        """Hot rows whose value in the (PS) table differs from this worker's (0 after write_back)."""
        bad = 0
        for table in self.tables:
            vals, exists = table.base.variable.lookup(tf.constant(table.hot_ids, tf.int64), return_exists=True)
            same = np.all(vals.numpy() == table.values.numpy(), axis=1) & exists.numpy()
            bad += int((~same).sum())
        return bad

    def digest(self) -> str:
        """sha256 over (table, hot ids, values): equal digests mean bit-identical hot replicas."""
        return hot_digest({t.name: (t.hot_ids, t.values.numpy()) for t in self.tables})

    def check_same_everywhere(self, sync) -> None:
        crc = 0
        for t in self.tables:
            crc = zlib.crc32(t.name.encode() + t.hot_ids.tobytes(), crc)
        if sync.broadcast_int(crc) != crc:
            raise ClusterError(f"rank {sync.rank}: hot set differs from rank 0's; every worker must "
                               f"read the same id profile and hot.* config")


def hot_digest(tables: Dict[str, tuple]) -> str:
    h = hashlib.sha256()
    for name in sorted(tables):
        ids, values = tables[name]
        h.update(name.encode())
        h.update(np.asarray(ids, np.int64).tobytes())
        h.update(np.asarray(values, np.float32).tobytes())
    return h.hexdigest()


def touched_bounds(cat_names: Sequence[str], multi_names: Sequence[str], data_cfg) -> Dict[str, int]:
    """Most distinct ids one step can look up per table (what ``lookups_per_step`` caps)."""
    per_sample = {n: 1 for n in cat_names} | {n: data_cfg.max_multi_hot for n in multi_names}
    samples = data_cfg.tasks_per_batch * (data_cfg.support + data_cfg.query)
    return {n: samples * k for n, k in per_sample.items()}


def lookups_per_step(cfg, bounds: Dict[str, int]) -> Dict[str, float]:
    """Lookups one step makes per table: samples x the pooling ``schema.json``'s table_stats
    measured (capped by ``bounds``); the bound itself where the schema has no stats."""
    try:
        stats = json.loads((Path(cfg.data.path) / "schema.json").read_text()).get("table_stats", {})
    except (OSError, ValueError):
        stats = {}
    samples = cfg.data.tasks_per_batch * (cfg.data.support + cfg.data.query)
    return {t: min(b, samples * float(stats[t]["pooling"])) if "pooling" in stats.get(t, {}) else b
            for t, b in bounds.items()}


def expected_touched(cfg, profiles, hot_ids: Dict[str, np.ndarray], bounds: Dict[str, int],
                     steps: int = 1) -> Dict[str, float]:
    """Distinct hot ids ``steps`` steps (one sync window, ``model.hot_sync_every``) are expected
    to touch per table (``auto.hot_touched`` under the profile; ``steps`` x the bound for a table
    the profile lacks): what sizes the hot gradient exchange, for the exchange itself
    (``HotRows``) and for ``model.hot_split: auto``'s cost of it."""
    got = hot_touched(profiles, hot_ids, {t: n * steps for t, n in lookups_per_step(cfg, bounds).items()})
    return {t: got.get(t, float(b) * steps) for t, b in bounds.items()}


def auto_decision(cfg, profiles, dims: Dict[str, int], hot_set, bounds: Dict[str, int], workers: int,
                  value_bytes: int = 4):
    """``model.hot_split: auto``'s verdict for this config, hot set and job (hot/auto.py); every
    rank computes the same from the same inputs. ``value_bytes``: a float's bytes on the wire."""
    sizes = {t: len(hot_set.ids.get(t, ())) for t in dims}
    every = cfg.model.hot_sync_every  # one exchange per window, its bytes spread over its steps
    touched = expected_touched(cfg, profiles, hot_set.ids, bounds, every)
    modes = {t: choose_mode(sizes[t], dims[t], touched[t], workers, value_bytes) for t in dims if sizes[t]}
    n = lookups_per_step(cfg, bounds)
    return decide(ps_payload(profiles, dims, n, value_bytes=value_bytes),
                  ps_payload(profiles, dims, n, hot_set.ids, hot_set.local_only, value_bytes),
                  allreduce_bytes(modes, sizes, dims, touched, workers, value_bytes) / every,
                  Link(cfg.cluster.link_rate_bit_s),
                  workers, max(len(cfg.cluster.ps), 1), hot_rows=hot_set.rows)


def select_by_bytes(cfg) -> bool:
    """``hot.select`` resolved: ``auto`` is ``bytes`` under ``model.hot_split: auto``, else ``count``."""
    return cfg.hot.select == "bytes" or (cfg.hot.select == "auto" and cfg.model.hot_split == "auto")


def choose_hot_set(cfg, profiles, dims: Dict[str, int], bounds: Dict[str, int], workers: int,
                   value_bytes: int = 4, log=None) -> HotSet:
    """The hot set for this config and job: by lookups per byte within ``hot.budget``, only among
    the rows that pay by bytes where ``hot.select`` resolves to ``bytes``. Every rank computes the
    same from the same inputs."""
    cap = None
    if select_by_bytes(cfg):
        pay: Dict[str, TablePay] = paying_rows(profiles, dims, lookups_per_step(cfg, bounds), workers,
                                               cfg.model.hot_sync_every, value_bytes, cfg.hot.min_count)
        cap = {t: p.rows for t, p in pay.items()}
        if log is not None:
            every = cfg.model.hot_sync_every
            log(f"hot rows by bytes ({workers} workers, sync every {every} step{'s' if every > 1 else ''}, "
                f"{value_bytes}-byte values): " + ", ".join(
                    f"{t} {p.rows:,} of {len(profiles[t].counts):,} pay ({p.mode}, saves "
                    f"{p.saved_bytes:,.0f} B/step)" for t, p in pay.items()))
    return select_hot(profiles, dims, cfg.train.embedding_optimizer, cfg.hot.budget_bytes, cfg.hot.min_count, cap)


def profile_path(cfg) -> Path:
    return Path(cfg.hot.profile) if cfg.hot.profile else Path(cfg.data.path) / PROFILE_NPZ


def hot_profiles(cfg) -> Dict:
    """The id profile (``hot.profile``) over the ids training looks up: with ``data.min_id_count``
    the profile's raw ids pooled as Meta-IO reads them (``rare_ids.pooled_profiles``). Everything
    the hot tier decides (the hot set, ``hot.select: bytes``, ``auto``'s verdict, the hot exchange's
    size, the printed coverage) reads this, never the raw profile: a hot set chosen over raw ids
    held rare ids the reader never emits and missed ``RARE_ID``, which it emits often, so a budget
    holding every profiled id made the tables local-only and step 1 failed on ``RARE_ID``."""
    profiles = load_profile(profile_path(cfg))
    if not cfg.data.min_id_count:
        return profiles
    return pooled_profiles(profiles, cfg.data.path, load_schema(cfg.data.path), cfg.data.min_id_count)


def build_hot_rows(cfg, tables: Sequence, cat_names: Sequence[str], multi_names: Sequence[str], sync,
                   log=print) -> Optional[HotRows]:
    """The hot rows for this config over ``tables``; None when the budget is 0 (then nothing is
    wrapped and training is the plain PS path). ``Embeddings.add_hot_tier`` calls this."""
    budget = cfg.hot.budget_bytes
    if budget <= 0 or cfg.model.hot_split is False:
        return None
    profiles = hot_profiles(cfg)
    dims = {t.name: t.dim for t in tables}
    bounds = touched_bounds(cat_names, multi_names, cfg.data)
    hot_set = choose_hot_set(cfg, profiles, dims, bounds, sync.size, sync.wire.value_bytes,
                             log if sync.rank == 0 else None)
    if sync.rank == 0:
        log(hot_set.format())
    if cfg.model.hot_split == "auto":
        decision = auto_decision(cfg, profiles, dims, hot_set, bounds, sync.size, sync.wire.value_bytes)
        if sync.rank == 0:
            log(decision.format(cfg.cluster.link_rate))
        if not decision.on:
            if sync.rank == 0 and cfg.model.hot_sync_every > 1:
                log(f"model.hot_sync_every={cfg.model.hot_sync_every} has no effect: no hot tier")
            return None
    if hot_set.rows == 0 and select_by_bytes(cfg):  # hot.select: bytes with the split forced on
        if sync.rank == 0:
            log(f"hot.select=bytes: no row saves link bytes as a hot row at {sync.size} workers: no hot tier")
        return None
    scale = sync.size if cfg.train.scale_lr else 1
    every = cfg.model.hot_sync_every
    rows = HotRows(tables, hot_set, sync, cfg.train.embedding_optimizer,
                   cfg.train.embedding_learning_rate * scale,
                   expected_touched(cfg, profiles, hot_set.ids, bounds, every),
                   prefetch=cfg.hot.prefetch, sync_every=every)
    if sync.rank == 0 and rows.skipped:
        log(f"hot split: {', '.join(rows.skipped)} stay wholly on the PS (column-split by cluster.placement)")
    if sync.rank == 0:
        log("hot gradient exchange" + (f" every {every} steps" if every > 1 else "") + ": "
            + ", ".join(f"{t} {m}" for t, m in rows.grad_sync.modes.items()))
    return rows
