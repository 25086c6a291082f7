"""One request per parameter server per step (``model.ps_requests: per_ps``).

TFRA looks each table up, and its optimizer applies each table, shard by shard: every
(table, shard) is its own find on the PS, and the apply's finds and inserts on the table and
on each slot table each move their own keys and values between worker and PS. A step of 7
tables on 2 PS with Adam crosses the network 214 times (``bench/ps_rpcs.py``), and that count
grows with tables x shards x slots. Table-batched embeddings (FBGEMM's TBE, TorchRec) answer
this by sending one request per server; this module does the same with TFRA's own tables:

* **lookup**: the worker cuts every table's unique ids by shard with the table's own partition
  function, concatenates all the ids one PS serves into one tensor (one per row width), and
  the PS finds them in each of its shards, fills the missing ids' initial rows there
  (``initial_rows.py``, the same function the per-table path runs on the worker) and sends back
  one tensor of rows. Per PS: ids and sizes out, rows back.
* **apply**: the gradients of the same rows go to the PS as one tensor, with each table's step
  counter; the PS finds the slot rows, runs the optimizer's row update (``row_update``, the
  formulas TFRA's wrapped Keras optimizer runs, also used by the hot rows) once on all of them,
  and inserts values and slots into each shard. The ids, sizes and rows the lookup left on the
  PS are reused, not sent again. Per PS: gradients and step counters out, nothing back.

The tables, their shards, their slot tables and their files are TFRA's and unchanged: placement,
column blocks, checkpoints and export see the same tables. What changes is who issues the
ops, and what crosses the network: the same finds and inserts, a few tensors per PS.

The apply consumes what the lookup of the same traced step left behind (``_pending``): a
shadow's gradient is only meaningful for the ids its step looked up (TFRA's shadow variable
works the same way, hazard 3 in docs/architecture.md). A table is served here only where its
semantics are the per-table path's exactly (``serves``), ``bp_v2`` included (the apply adds
deltas, as TFRA's does). A table with counted rows (``model.max_rows``: TFRA's apply also
counts them) or ``init_rows: all`` keeps TFRA's path, as does every hot/cold table and every
column-split table (its blocks are looked up by the split table itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
import tensorflow_recommenders_addons as tfra

import gmeta_tf  # noqa: F401
from gmeta_tf.embedding import initial_rows
from gmeta_tf.embedding.optimizers import TableOptimizers, optimizer_kind, row_update
from gmeta_tf.embedding.table import EmbeddingTable

de = tfra.dynamic_embedding

MODES = ("auto", "per_table", "per_ps")
# The name scopes of this module's ops: ``bench/ps_rpcs.py`` and the profile bucket by them.
LOOKUP_SCOPE = "ps_request_lookup"
APPLY_SCOPE = "ps_request_apply"


@dataclass
class _Request:
    """What one PS device serves for one row width: ``members`` are (table, shard) pairs in the
    order their ids are concatenated. ``sizes`` is worker-side; ``ids`` and ``rows`` (found and
    filled) live on the PS, where the apply reuses them."""

    index: int  # in the step's list of requests
    device: str
    dim: int
    members: List[Tuple[EmbeddingTable, int]] = field(default_factory=list)
    pieces: List[tf.Tensor] = field(default_factory=list)  # worker-side ids of each member
    sizes: Optional[tf.Tensor] = None
    ids: List[tf.Tensor] = field(default_factory=list)  # PS-side, per member
    rows: Optional[tf.Tensor] = None  # PS-side [N, dim]
    parts: List[tf.Tensor] = field(default_factory=list)  # worker-side: ``rows`` split per member
    exists: List[tf.Tensor] = field(default_factory=list)  # PS-side, per member (``bp_v2``'s accum)


@dataclass
class _Cut:
    """How one table's unique ids were cut by shard: ``part`` (shard of each id, for cutting its
    gradient the same way) and, per shard, the (request, member) that carries it."""

    part: tf.Tensor
    positions: List[tf.Tensor]
    slots: List[Tuple[int, int]]


class UnmatchedApplyError(RuntimeError):
    """An apply's gradients are not for the shadows its own step's lookup set: a programming
    error in the step, which would otherwise update rows the gradient does not belong to."""


def serves(table) -> bool:
    """Whether a table's lookup and apply can go through a PS request with the per-table path's
    exact semantics (module docstring)."""
    return type(table) is EmbeddingTable and table.init_rows == "missing" and table.frequency is None


def resolve(mode: str, tables: Sequence) -> str:
    """``auto`` is ``per_ps`` where a served table has a shard on a parameter server and
    ``per_table`` otherwise: in one process there are no round trips to save, and the requests'
    cutting and stitching of ids made the step 0.93-1.06x as fast (``bench/run.py``'s
    ``meta_step_ps_requests``), while at 2 workers + 2 PS they took it from 77 to 33 ms."""
    if mode != "auto":
        return mode
    on_ps = any("/job:ps" in d for t in tables if serves(t) for d in t.devices)
    return "per_ps" if on_ps else "per_table"


class PsRequests:
    """The step's PS requests for the tables it ``serves``; built once the slot tables exist."""

    def __init__(self, tables: Sequence[EmbeddingTable], optimizers: TableOptimizers):
        self.tables = [t for t in tables if serves(t)]
        self.optimizers = optimizers
        self.kind = optimizer_kind(optimizers.kind)
        self._slots: Dict[str, Dict[str, object]] = {}
        for t in self.tables:
            slots = t.slot_tables(optimizers.for_shadow(t.shadow))
            if sorted(slots) != sorted(self.kind.slots) or any(s.devices != t.devices for s in slots.values()):
                raise RuntimeError(f"table {t.name}: slot tables {sorted(slots)} are not placed shard for shard "
                                   f"with the table; PS requests need them beside their rows")
            self._slots[t.name] = slots
        self._shadows = {t.shadow.name for t in self.tables}
        self._pending: Dict[str, Tuple[EmbeddingTable, _Cut]] = {}  # shadow name -> its step's cut
        self._requests: List[_Request] = []

    def takes(self, table) -> bool:
        return any(table is t for t in self.tables)

    # -- lookup -------------------------------------------------------------------------------
    def find(self, tables: Sequence[EmbeddingTable], ids: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """Rows of each table's unique real ``ids`` (found, missing ones filled), one request per
        PS and row width, and each table's shadow set to them as TFRA's trainable lookup does:
        what the tape differentiates and what ``apply`` later updates."""
        requests: Dict[Tuple[str, int], _Request] = {}
        cuts = []
        with tf.name_scope(LOOKUP_SCOPE):
            for table, real in zip(tables, ids):
                var = table.variable
                part = var.partition_fn(real, var.shard_num)
                pieces = tf.dynamic_partition(real, part, var.shard_num)
                positions = tf.dynamic_partition(tf.range(tf.shape(real)[0]), part, var.shard_num)
                slots = []
                for shard, device in enumerate(table.devices):
                    if (device, table.dim) not in requests:
                        requests[(device, table.dim)] = _Request(len(requests), device, table.dim)
                    req = requests[(device, table.dim)]
                    slots.append((req.index, len(req.members)))
                    req.members.append((table, shard))
                    req.pieces.append(pieces[shard])
                cuts.append(_Cut(part, positions, slots))
            self._requests = list(requests.values())
            for req in self._requests:
                self._send(req)
            out = []
            for table, real, cut in zip(tables, ids, cuts):
                shards = [self._requests[r].parts[m] for r, m in cut.slots]
                rows = tf.dynamic_stitch(cut.positions, shards) if len(shards) > 1 else shards[0]
                rows = tf.reshape(rows, [-1, table.dim])
                out.append(table.remember(real, rows))
                self._pending[table.shadow.name] = (table, cut)
        return out

    def _send(self, req: _Request) -> None:
        """The worker concatenates the ids, the PS splits them, finds and fills each member's rows
        and concatenates them: one tensor each way (and the sizes)."""
        req.sizes = tf.stack([tf.shape(p)[0] for p in req.pieces])
        cat = tf.concat(req.pieces, axis=0)
        with tf.device(req.device):
            req.ids = tf.split(cat, req.sizes, num=len(req.members))
            found = []
            for (table, shard), ids in zip(req.members, req.ids):
                rows, exists = _find(table.variable, shard, ids, 0.0)
                found.append(initial_rows.fill_missing(rows, exists, ids, table.row_key, table.dim,
                                                       table.init_stddev))
                req.exists.append(exists)
            req.rows = tf.concat(found, axis=0)
        req.parts = tf.split(req.rows, req.sizes, num=len(req.members))

    # -- apply --------------------------------------------------------------------------------
    def apply(self, grads_and_shadows: Sequence[Tuple[tf.Tensor, tf.Variable]]) -> List[Tuple[tf.Tensor, tf.Variable]]:
        """Apply the gradients of the shadows this step's ``find`` set, one request per PS and row
        width; return the other (gradient, shadow) pairs, for TFRA's optimizers."""
        rest, mine = [], {}
        for grad, shadow in grads_and_shadows:
            if shadow.name in self._shadows:
                mine[shadow.name] = grad
            else:
                rest.append((grad, shadow))
        if not mine:
            return rest
        if set(mine) != set(self._pending):
            raise UnmatchedApplyError(f"PS requests: gradients for {sorted(mine)} but this step looked up "
                               f"{sorted(self._pending)}; a step's apply must follow its own lookup")
        grads: Dict[Tuple[int, int], tf.Tensor] = {}
        counters = []
        with tf.name_scope(APPLY_SCOPE):
            for name, grad in mine.items():
                table, cut = self._pending[name]
                grad = tf.reshape(tf.convert_to_tensor(grad), [-1, table.dim])
                for slot, piece in zip(cut.slots, tf.dynamic_partition(grad, cut.part, table.variable.shard_num)):
                    grads[slot] = piece
                counters.append(self.optimizers.for_shadow(table.shadow).iterations)
            for r, req in enumerate(self._requests):
                steps = tf.stack([tf.cast(self.optimizers.for_shadow(t.shadow).iterations, tf.int64)
                                  for t, _ in req.members])
                cat = tf.concat([grads[(r, m)] for m in range(len(req.members))], axis=0)
                with tf.device(req.device):
                    self._update(req, cat, steps)
            for it in counters:  # after every read above (the update's bias correction)
                it.assign_add(1)
        self._pending, self._requests = {}, []
        return rest

    def _update(self, req: _Request, grads: tf.Tensor, steps: tf.Tensor) -> None:
        """On the PS: the members' slot rows, one row update for all, then per member and table
        what TFRA's update would write: the new rows (``upsert``) or, with ``bp_v2``, their
        difference to the rows the step read (``accum``)."""
        split = lambda x: tf.split(x, req.sizes, num=len(req.members))  # noqa: E731
        old = {s: [_find(self._slots[t.name][s], shard, ids, self.kind.slot_init)
                   for (t, shard), ids in zip(req.members, req.ids)] for s in self.kind.slots}
        iterations = tf.repeat(steps, req.sizes)[:, None]
        values, slots = row_update(self.kind.name, self.optimizers.lr, req.rows,
                                   {s: tf.concat([r for r, _ in old[s]], axis=0) for s in old}, grads, iterations)
        values, rows, slots = split(values), split(req.rows), {s: split(v) for s, v in slots.items()}
        for i, ((t, shard), ids) in enumerate(zip(req.members, req.ids)):
            _write(t.variable, shard, ids, rows[i], values[i], req.exists[i])
            for s in slots:
                _write(self._slots[t.name][s], shard, ids, old[s][i][0], slots[s][i], old[s][i][1])


def _find(var, shard: int, ids: tf.Tensor, default: float) -> Tuple[tf.Tensor, tf.Tensor]:
    """``ids``' rows in shard ``shard`` of TFRA variable ``var`` (``default`` for missing ids, as
    its zeros initializer gives them) and whether each exists."""
    return var._tables[shard].lookup(ids, dynamic_default_values=tf.fill([tf.shape(ids)[0], var.dim], default),
                                     return_exists=True)


def _write(var, shard: int, ids: tf.Tensor, old: tf.Tensor, new: tf.Tensor, exists: tf.Tensor) -> None:
    """TFRA's ``update_op`` on one shard: ``bp_v2`` adds ``new - old`` to the rows that existed
    when read (another worker's update in between is kept) and inserts the others."""
    if var.bp_v2:
        delta = tf.where(exists[:, None], new - old, new)
        var._tables[shard].accum(ids, delta, exists)
    else:
        var._tables[shard].insert(ids, new)
