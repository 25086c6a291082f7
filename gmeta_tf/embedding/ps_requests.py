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
counts them) or ``init_rows: all`` keeps TFRA's path, as does every column-split table (its
blocks are looked up by the split table itself); a hot/cold table's cold rows are its base's.

**Fused tables** (``fused.py``). A request's ids are logical ids, cut by shard with the
fused table's partition function; on the PS the ids of every member of one fused table and
shard are encoded (``KeyCodec``) and found together, so the finds, slot finds and inserts are
one per (physical table, shard) whatever the number of logical tables: a PS's hash-table ops
per step depend on its fused tables, not its features. Initial rows stay per logical table
(each id's own table key), and new large ids are recorded (``FusedTable.record``) on the PS.
The hot/cold split's cold rows join their table's request the same way (``lookup.together``):
hot rows stay on the worker, a table whose rows are all hot sends nothing.

**Wire precision** (``cluster.wire_dtype``, ``wire.py``). The rows are cast to the wire dtype
on the PS, inside the request's device scope, so the PS-to-worker tensor is already narrow, and
cast back to float32 on the worker; the gradients are cast on the worker and back to float32 on
the PS before the update. The rows the update starts from are the PS's own float32 ``rows``
(kept there since the lookup), the slots never leave the PS, and the update runs in float32:
only what crosses is rounded. Ids and sizes cross as they are. TFRA's per-table path (the
tables ``serves`` refuses) stays float32 on the wire: its wrapped optimizer moves no gradient to
the PS at all; it reads the slot rows to the worker, runs the optimizer there and writes rows
and slots back, and rounding optimizer state on every step is what this key must not do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from gmeta_tf.embedding import initial_rows
from gmeta_tf.embedding.hot_cold import HotColdTable
from gmeta_tf.embedding.optimizers import TableOptimizers, optimizer_kind, row_update
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.embedding.wire import Wire

MODES = ("auto", "per_table", "per_ps")
# The name scopes of this module's ops: ``bench/ps_rpcs.py`` and the profile bucket by them.
LOOKUP_SCOPE = "ps_request_lookup"
APPLY_SCOPE = "ps_request_apply"


@dataclass
class _Member:
    """One logical table's ids on one shard, in a request: ``owner`` (an ``EmbeddingTable`` or
    a ``FusedMember``) reads rows of ``phys`` (itself, or its fused table)."""

    owner: object
    phys: EmbeddingTable
    shard: int


@dataclass
class _Group:
    """The members of one request on one (physical table, shard), consecutive in the request:
    one find and one write per slot table for all of them. PS-side tensors."""

    phys: EmbeddingTable
    shard: int
    members: List[int]
    keys: Optional[tf.Tensor] = None  # the physical keys (encoded for a fused table)
    exists: Optional[tf.Tensor] = None  # ``bp_v2``'s accum


@dataclass
class _Request:
    """What one PS device serves for one row width: ``members`` in the order their ids are
    concatenated, grouped by (physical table, shard). ``sizes`` is worker-side; the groups'
    keys and ``rows`` (found and filled) live on the PS, where the apply reuses them."""

    index: int  # in the step's list of requests
    device: str
    dim: int
    members: List[_Member] = field(default_factory=list)
    pieces: List[tf.Tensor] = field(default_factory=list)  # worker-side logical ids of each member
    sizes: Optional[tf.Tensor] = None
    groups: List[_Group] = field(default_factory=list)
    rows: Optional[tf.Tensor] = None  # PS-side [N, dim]
    parts: List[tf.Tensor] = field(default_factory=list)  # worker-side: ``rows`` split per member


@dataclass
class _Cut:
    """How one lookup part's ids were cut by shard: ``part`` (shard of each id, for cutting its
    gradient the same way) and, per shard, the (request, member) that carries it."""

    part: tf.Tensor
    positions: List[tf.Tensor]
    slots: List[Tuple[int, int]]
    size: tf.Tensor  # the part's ids


class UnmatchedApplyError(RuntimeError):
    """An apply's gradients are not for the shadows its own step's lookup set: a programming
    error in the step, which would otherwise update rows the gradient does not belong to."""


def physical(owner) -> EmbeddingTable:
    """The TFRA table holding a served table's rows (its ``storage``: a fused member's fused
    table, else itself)."""
    return owner.storage()[0]


def serves(table) -> bool:
    """Whether a table's lookup and apply can go through a PS request with the per-table path's
    exact semantics (module docstring): a plain table or a member of a fused one
    (``ps_requestable``), not counted, initial rows for missing ids only."""
    if not getattr(table, "ps_requestable", False):
        return False
    t = physical(table)
    return t.init_rows == "missing" and t.frequency is None


def owners(tables: Sequence) -> List:
    """Whose rows a request reads for each table: a hot/cold table's base (its cold rows)."""
    return [t.base if isinstance(t, HotColdTable) else t for t in tables]


def resolve(mode: str, tables: Sequence) -> str:
    """``auto`` is ``per_ps`` where a served table has a shard on a parameter server and
    ``per_table`` otherwise: in one process there are no round trips to save, and the requests'
    cutting and stitching of ids made the step 0.93-1.06x as fast (``bench/run.py``'s
    ``meta_step_ps_requests``), while at 2 workers + 2 PS they took it from 77 to 33 ms."""
    if mode != "auto":
        return mode
    on_ps = any("/job:ps" in d for t in owners(tables) if serves(t) for d in t.devices)
    return "per_ps" if on_ps else "per_table"


class PsRequests:
    """The step's PS requests for the tables it ``serves``; built once the slot tables exist."""

    def __init__(self, tables: Sequence, optimizers: TableOptimizers, wire: Wire = Wire()):
        self.wire = wire
        self.tables: List[EmbeddingTable] = []  # the physical tables served
        for t in owners(tables):
            if serves(t) and not any(physical(t) is p for p in self.tables):
                self.tables.append(physical(t))
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
        # shadow name -> (its physical table, each lookup part's cut in the order of its keys)
        self._pending: Dict[str, Tuple[EmbeddingTable, List[_Cut]]] = {}
        self._requests: List[_Request] = []

    def takes(self, table) -> bool:
        """Whether ``table`` (a plain table or a fused member; a hot table's base) is served."""
        return serves(table) and any(physical(table) is t for t in self.tables)

    # -- lookup -------------------------------------------------------------------------------
    def find(self, tables: Sequence, ids: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """Rows of each table's unique real ``ids`` (found, missing ones filled), one request per
        PS and row width, and each physical table's shadow set to them as TFRA's trainable
        lookup does: what the tape differentiates and what ``apply`` later updates."""
        phys = [physical(t) for t in tables]
        rank = {id(p): r for r, p in reversed(list(enumerate(phys)))}  # first appearance
        order = sorted(range(len(tables)), key=lambda k: rank[id(phys[k])])  # stable: parts of a table together
        cuts: Dict[int, _Cut] = {}
        keys = _keys(tables, ids, phys, order)
        entries = []
        with tf.name_scope(LOOKUP_SCOPE):
            for pos, k in enumerate(order):
                p, real = phys[k], ids[k]
                part = p.variable.partition_fn(keys[k], p.variable.shard_num)
                pieces = tf.dynamic_partition(real, part, p.variable.shard_num)
                positions = tf.dynamic_partition(tf.range(tf.shape(real)[0]), part, p.variable.shard_num)
                cuts[k] = _Cut(part, positions, [None] * len(p.devices), tf.shape(real)[0])
                for shard, device in enumerate(p.devices):
                    entries.append(((device, p.dim), (rank[id(p)], shard, pos), k, shard, pieces[shard]))
            requests: Dict[Tuple[str, int], _Request] = {}
            for key, _, k, shard, piece in sorted(entries, key=lambda e: e[1]):  # groups consecutive
                if key not in requests:
                    requests[key] = _Request(len(requests), key[0], key[1])
                req = requests[key]
                cuts[k].slots[shard] = (req.index, len(req.members))
                req.members.append(_Member(tables[k], phys[k], shard))
                req.pieces.append(piece)
            self._requests = list(requests.values())
            for req in self._requests:
                self._send(req)
            out: List[Optional[tf.Tensor]] = [None] * len(tables)
            for k in order:
                cut = cuts[k]
                shards = [self._requests[r].parts[m] for r, m in cut.slots]
                rows = tf.dynamic_stitch(cut.positions, shards) if len(shards) > 1 else shards[0]
                out[k] = tf.reshape(rows, [-1, phys[k].dim])
            for p in {id(q): q for q in phys}.values():  # one shadow write per physical table
                ks = [k for k in order if phys[k] is p]
                read = p.remember(tf.concat([keys[k] for k in ks], 0) if len(ks) > 1 else keys[ks[0]],
                                  tf.concat([out[k] for k in ks], 0) if len(ks) > 1 else out[ks[0]])
                for k, r in zip(ks, tf.split(read, [cuts[k].size for k in ks], num=len(ks)) if len(ks) > 1 else [read]):
                    out[k] = r
                self._pending[p.shadow.name] = (p, [cuts[k] for k in ks])
        return out

    def _send(self, req: _Request) -> None:
        """The worker concatenates the logical ids, the PS splits them, and per (physical table,
        shard) encodes, finds and fills its members' rows at once; the rows come back as one
        tensor (the ids and the sizes go out)."""
        req.sizes = tf.stack([tf.shape(p)[0] for p in req.pieces])
        cat = tf.concat(req.pieces, axis=0)
        for m, member in enumerate(req.members):
            last = req.groups[-1] if req.groups else None
            if last is not None and last.phys is member.phys and last.shard == member.shard:
                last.members.append(m)
            else:
                req.groups.append(_Group(member.phys, member.shard, [m]))
        with tf.device(req.device):
            ids = tf.split(cat, req.sizes, num=len(req.members))
            found = []
            for g in req.groups:
                owners_ = [req.members[m].owner for m in g.members]
                gids = [ids[m] for m in g.members]
                logical = tf.concat(gids, 0) if len(gids) > 1 else gids[0]
                g.keys = g.phys.encode_parts(owners_, gids)
                key = g.phys.row_keys(owners_, [tf.shape(i)[0] for i in gids])
                rows, g.exists = _find(g.phys.variable, g.shard, g.keys, 0.0)
                g.phys.record(g.keys, logical, g.exists, shard=g.shard)
                found.append(initial_rows.fill_missing(rows, g.exists, logical, key, g.phys.dim,
                                                       g.phys.init_stddev))
            req.rows = tf.concat(found, axis=0)
            sent = self.wire.send(req.rows)
        req.parts = tf.split(self.wire.receive(sent), req.sizes, num=len(req.members))

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
                phys, cuts = self._pending[name]
                grad = tf.reshape(tf.convert_to_tensor(grad), [-1, phys.dim])
                pieces = tf.split(grad, [c.size for c in cuts], num=len(cuts)) if len(cuts) > 1 else [grad]
                for cut, piece in zip(cuts, pieces):
                    for slot, g in zip(cut.slots, tf.dynamic_partition(piece, cut.part, phys.variable.shard_num)):
                        grads[slot] = g
                counters.append(self.optimizers.for_shadow(phys.shadow).iterations)
            for r, req in enumerate(self._requests):
                steps = tf.stack([tf.cast(self.optimizers.for_shadow(m.phys.shadow).iterations, tf.int64)
                                  for m in req.members])
                sent = self.wire.send(tf.concat([grads[(r, m)] for m in range(len(req.members))], axis=0))
                with tf.device(req.device):
                    self._update(req, self.wire.receive(sent), steps)
            for it in counters:  # after every read above (the update's bias correction)
                it.assign_add(1)
        self._pending, self._requests = {}, []
        return rest

    def _update(self, req: _Request, grads: tf.Tensor, steps: tf.Tensor) -> None:
        """On the PS: the groups' slot rows, one row update for all, then per group what TFRA's
        update would write: the new rows (``upsert``) or, with ``bp_v2``, their difference to
        the rows the step read (``accum``)."""
        sizes = [tf.shape(g.keys)[0] for g in req.groups]
        split = lambda x: tf.split(x, sizes, num=len(req.groups)) if len(req.groups) > 1 else [x]  # noqa: E731
        old = {s: [_find(self._slots[g.phys.name][s], g.shard, g.keys, self.kind.slot_init) for g in req.groups]
               for s in self.kind.slots}
        iterations = tf.repeat(steps, req.sizes)[:, None]
        values, slots = row_update(self.kind.name, self.optimizers.lr, req.rows,
                                   {s: tf.concat([r for r, _ in old[s]], axis=0) for s in old}, grads, iterations)
        values, rows, slots = split(values), split(req.rows), {s: split(v) for s, v in slots.items()}
        for i, g in enumerate(req.groups):
            _write(g.phys.variable, g.shard, g.keys, rows[i], values[i], g.exists)
            for s in slots:
                _write(self._slots[g.phys.name][s], g.shard, g.keys, old[s][i][0], slots[s][i], old[s][i][1])


def _keys(tables: Sequence, ids: Sequence[tf.Tensor], phys: Sequence, order: Sequence[int]) -> Dict[int, tf.Tensor]:
    """Each lookup part's physical keys (``encode_parts``: a plain table's ids, a fused member's
    encoded keys; the parts of one physical table encoded in one pass, then split)."""
    out = {}
    for p in {id(q): q for q in phys}.values():
        ks = [k for k in order if phys[k] is p]
        keys = p.encode_parts([tables[k] for k in ks], [ids[k] for k in ks])
        parts = tf.split(keys, [tf.shape(ids[k])[0] for k in ks], num=len(ks)) if len(ks) > 1 else [keys]
        out.update(zip(ks, parts))
    return out


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
