"""Local search over placements, seeded from the best baselines (iterated local search).

A *move* re-places one or two tables (``(table, layout, PS of each shard)``): move a shard to
another PS, swap two shards of different tables, split a whole table row-wise (k = 2..M) or
column-wise (halves), add or drop one row shard, or merge a split table back onto one PS.

Descent: for the PS in order of predicted cost (slowest first), score every move that takes
something off that PS and apply the best one that improves the objective
(``assignment.objective``: max cost, then sum); stop when no move improves. Then a bounded
number of *kicks*, keeping the best state: alternately split the tables that dominate a PS
and rebalance around them (steps descent never takes on its own, see ``_split_kick``) or make
a few random feasible moves, then descend again.
Every move is checked against the per-PS memory limit (optimizer slots included), and the
search starts from the best baseline and only ever accepts improvements, so the result is
never worse than that baseline. All randomness comes from ``seed``; no wall-clock budget, so
the same inputs give the same plan on any machine.
"""
from __future__ import annotations

from collections import defaultdict
from typing import List, Optional, Sequence, Tuple

import numpy as np

from gmeta_tf.plan.assignment import Evaluator, Key, State, objective
from gmeta_tf.plan.shard_layouts import WHOLE, ShardLayout, candidate_layouts, smallest_fitting_row_split
from gmeta_tf.plan.spec import TableStats

Change = Tuple[str, ShardLayout, Tuple[int, ...]]
Move = Tuple[Change, ...]


class _Space:
    """Per-table allowed layouts, and each shard's cost alone (the surrogate's unit)."""

    def __init__(self, st: State, mem_per_ps: int, ev: Evaluator):
        self.ps, self.mem_per_ps, self.reg, self.ev = st.ps, mem_per_ps, st.reg, ev
        # Shard ids are handed out in the candidates' own order: iterating a set of layouts
        # (hashes of strings) numbered them by PYTHONHASHSEED, and the ids order the moves and
        # break ties, so two processes planned the same tables differently.
        layouts = {t.name: candidate_layouts(t, st.ps, mem_per_ps, st.slots) for t in st.tables.values()}
        self.allowed = {n: set(lays) for n, lays in layouts.items()}
        ids = sorted({i for n, lays in layouts.items() for lay in lays for i in self.reg.ids(n, lay)}
                     | {i for s in st.sets for i in s})
        self.solo = dict(zip(ids, ev.costs(self.reg, [frozenset([i]) for i in ids])))
        self.changes = _Changes(self.ps)

    def solo_cost(self, i: int) -> float:
        c = self.solo.get(i)
        if c is None:
            c = self.solo[i] = self.ev.costs(self.reg, [frozenset([i])])[0]
        return c


def _delta(st: State, sp: _Space, move: Move):
    """``{ps: (removed ids, added ids, new memory)}`` of a move, or ``None`` if a PS runs out of memory."""
    rem, add = defaultdict(list), defaultdict(list)
    reg = sp.reg
    for name, lay, where in move:
        for i, p in zip(reg.ids(name, st.layout[name]), st.where[name]):
            rem[p].append(i)
        for i, p in zip(reg.ids(name, lay), where):
            add[p].append(i)
    out = {}
    nb = reg.nbytes
    for p in set(rem) | set(add):
        r, a = rem.get(p, ()), add.get(p, ())
        mem = st.mem[p] - sum(nb[i] for i in r) + sum(nb[i] for i in a)
        if mem > sp.mem_per_ps:
            return None
        out[p] = (r, a, mem)
    return out


def _commit(st: State, move: Move, new) -> None:
    for name, lay, where in move:
        st.layout[name] = lay
        st.where[name] = list(where)
    for p, (s, mem, cost) in new.items():
        st.sets[p], st.mem[p], st.costs[p] = s, mem, cost


def _moves_from(st: State, sp: _Space, p: int, frozen: frozenset = frozenset()) -> List[Move]:
    """Every move that takes (part of) something off PS ``p``; ``frozen`` tables keep their layout."""
    ps = sp.ps
    order = sorted(range(ps), key=lambda q: (st.costs[q], q))  # cheapest PS first
    shard = sp.reg.shard
    on_p = sorted({shard[i].table for i in st.sets[p]})
    moves: List[Move] = []
    for n in on_p:
        lay, where = st.layout[n], tuple(st.where[n])
        i = where.index(p)
        allowed = sp.allowed[n]
        others = [q for q in range(ps) if q not in where]
        for q in others:
            moves.append(((n, lay, where[:i] + (q,) + where[i + 1:]),))
        if n in frozen:
            pass
        elif lay.kind == "table":
            col = ShardLayout("column", 2)
            if col in allowed:
                moves += [((n, col, (p, q)),) for q in others]
            for k in range(2, ps + 1):
                row = ShardLayout("row", k)
                if row not in allowed:
                    continue
                if k == 2:
                    moves += [((n, row, (p, q)),) for q in others]
                else:
                    moves.append(((n, row, tuple(sorted([p] + [q for q in order if q != p][:k - 1]))),))
        else:
            moves += [((n, WHOLE, (q,)),) for q in range(ps) if WHOLE in allowed]
            if lay.kind == "row":
                grow = ShardLayout("row", lay.parts + 1)
                free = [q for q in order if q not in where]
                if grow in allowed and free:
                    moves.append(((n, grow, where + (free[0],)),))
                shrink = ShardLayout("row", lay.parts - 1)
                if lay.parts > 2 and shrink in allowed:
                    moves.append(((n, shrink, where[:i] + where[i + 1:]),))
        # swaps with a cheaper shard of another table on another PS (a dearer one cannot
        # relieve ``p`` under the additive surrogate that ranks moves anyway)
        mine = sp.solo_cost(sp.reg.ids(n, lay)[i])
        for q in others:
            for k2 in st.sets[q]:
                if sp.solo_cost(k2) >= mine:
                    continue
                s2 = shard[k2]
                m = s2.table
                if m == n or p in st.where[m]:
                    continue
                w2 = tuple(st.where[m])
                j = s2.index
                moves.append(((n, lay, where[:i] + (q,) + where[i + 1:]), (m, st.layout[m], w2[:j] + (p,) + w2[j + 1:])))
    return moves


def _exact(st: State, sp: _Space, cands) -> List[Tuple[Key, Move, dict]]:
    """Score ``(move, delta)`` pairs with the cost model: ``(key, move, {ps: (set, mem, cost)})``."""
    sets = [(st.sets[p] - frozenset(r)) | frozenset(a) for _, d in cands for p, (r, a, _) in d.items()]
    costs = iter(sp.ev.costs(sp.reg, sets))
    sets_it = iter(sets)
    out = []
    for mv, d in cands:
        full = list(st.costs)
        new = {}
        for p, (_, _, mem) in d.items():
            c = next(costs)
            full[p] = c
            new[p] = (next(sets_it), mem, c)
        out.append((objective(full), mv, new))
    return out


def _surrogate_slow(st: State, sp: _Space, mv: Move) -> Optional[Tuple[float, float]]:
    """The additive surrogate of one move, from ``_delta`` (``None``: infeasible).

    The reference ``_Ranker`` must match bit for bit, and its fallback for moves whose shards
    are not all interned and costed yet (here ``_delta`` interns them and ``solo_cost`` scores
    them, in move order, exactly as the search always did).
    """
    d = _delta(st, sp, mv)
    if d is None:
        return None
    approx = list(st.costs)
    for p, (r, a, _) in d.items():
        approx[p] += sum(sp.solo_cost(i) for i in a) - sum(sp.solo_cost(i) for i in r)
    return max(approx), sum(approx)


class _Ranker:
    """The additive surrogate of many moves from one state, without building ``_delta``'s dicts.

    Why: ranking is the search's hot loop (millions of moves per suite), and ``_delta`` builds
    lists, sets and tuples per move. Here a move is the ``_Changes`` rows of its changes and of
    its tables' current placements, and numpy folds them into the PS (``rank``). The arithmetic
    is ``_surrogate_slow``'s, in its order: per PS a sequential sum of the added shards' solo
    costs and one of the removed ones' (move order, then shard order), ``cost + (added -
    removed)``, then ``max`` and ``sum`` over all PS. So the ranking, ties included, is
    unchanged. Built per state: a commit invalidates it.

    A move that names a layout the registry has not interned yet, or a shard with no solo cost
    yet, goes to ``_surrogate_slow``, which interns and costs it as the search always did (the
    order of those side effects decides shard ids and the evaluator's cache).
    """

    def __init__(self, st: State, sp: _Space):
        self.st, self.sp = st, sp
        self._now: dict = {}  # table -> the ``_Changes`` row of where it is now

    def approx(self, mv: Move) -> Optional[Tuple[float, float]]:
        """``_surrogate_slow(st, sp, mv)``, bit for bit."""
        return self.rank([mv])[0]

    def rank(self, moves: Sequence[Move]) -> List[Optional[Tuple[float, float]]]:
        """``approx`` of every move, in one numpy pass over a (move x PS) table.

        Why: ranking is the search's hot loop, and folding each move's shards into per-PS
        accumulators in Python cost more than the rest of the search. A change's shards spread
        over the PS are a row of ``_Changes``, built once per search; a move is the rows of its
        changes (added) and of its tables' current placements (removed), summed slot by slot
        from 0.0, which is ``_surrogate_slow``'s sequence of additions, so every float is the
        same. A move that needs the fallback is scored there, at its place in the sequence.
        """
        slots: List[Tuple[list, list, list]] = [([], [], []), ([], [], [])]  # per change: (move, added row, removed row)
        (at0, add0, rem0), (at1, add1, rem1) = slots
        slow = {}
        index, now = self.sp.changes.index, self._now
        for idx, mv in enumerate(moves):  # the two shapes _moves_from makes, where their rows are known
            if len(mv) == 1:
                a, r = index.get(mv[0]), now.get(mv[0][0])
                if a is not None and r is not None:
                    at0.append(idx)
                    add0.append(a)
                    rem0.append(r)
                    continue
            elif len(mv) == 2:
                a, r, a1, r1 = index.get(mv[0]), now.get(mv[0][0]), index.get(mv[1]), now.get(mv[1][0])
                if a is not None and r is not None and a1 is not None and r1 is not None:
                    at0.append(idx)
                    add0.append(a)
                    rem0.append(r)
                    at1.append(idx)
                    add1.append(a1)
                    rem1.append(r1)
                    continue
            rows = self._rows(mv)
            if rows is None:
                slow[idx] = _surrogate_slow(self.st, self.sp, mv)
                continue
            while len(slots) < len(rows):
                slots.append(([], [], []))
            for (add, rem), (at, added, removed) in zip(rows, slots):
                at.append(idx)
                added.append(add)
                removed.append(rem)
        keys = self.sp.changes.keys(len(moves), slots, self.st, self.sp.mem_per_ps)
        for idx, key in slow.items():
            keys[idx] = key
        return keys

    def _rows(self, mv: Move) -> Optional[List[Tuple[int, int]]]:
        """Per change, its ``_Changes`` row and its table's current one; ``None`` if some shard is
        not interned or costed yet (the caller falls back)."""
        changes, st = self.sp.changes, self.st
        out = []
        for ch in mv:
            name = ch[0]
            rem = self._now.get(name)
            if rem is None:
                rem = changes.row(self.sp, (name, st.layout[name], tuple(st.where[name])))
                if rem is None:
                    return None
                self._now[name] = rem
            add = changes.row(self.sp, ch)
            if add is None:
                return None
            out.append((add, rem))
        return out


class _Changes:
    """Each change ``(table, layout, PS of each shard)`` the search has ranked, as a row over the
    PS: its shards' solo costs, bytes, and which PS it touches (``_Ranker.rank``).

    A row depends only on the change (solo costs and bytes of a shard never change), so it is
    built the first time a move names it and reused by every later state of the search.
    """

    def __init__(self, ps: int):
        self.ps = ps
        self.index: dict = {}
        self.cost = np.zeros((64, ps))
        self.nbytes = np.zeros((64, ps), dtype=np.int64)
        self.on = np.zeros((64, ps), dtype=bool)

    def row(self, sp: "_Space", ch: Change) -> Optional[int]:
        """The row of ``ch``; ``None`` while its shards are not interned and costed."""
        got = self.index.get(ch)
        if got is None:
            name, lay, where = ch
            ids = sp.reg.interned(name, lay)
            if ids is None:
                return None
            solo = [sp.solo.get(i) for i in ids]
            if any(c is None for c in solo):
                return None
            got = self.index[ch] = len(self.index)
            if got == len(self.cost):
                self._grow()
            for i, c, p in zip(ids, solo, where):
                self.cost[got, p] = c
                self.nbytes[got, p] = sp.reg.nbytes[i]
                self.on[got, p] = True
        return got

    def _grow(self) -> None:
        self.cost = np.concatenate([self.cost, np.zeros_like(self.cost)])
        self.nbytes = np.concatenate([self.nbytes, np.zeros_like(self.nbytes)])
        self.on = np.concatenate([self.on, np.zeros_like(self.on)])

    def keys(self, n: int, slots, st: State, limit: int) -> List[Optional[Tuple[float, float]]]:
        """``(max, sum)`` of each move's PS costs after it, ``None`` where a PS it touches runs
        out of memory: ``cost + (added - removed)``, each of those summed change by change
        from 0.0; the sum over PS column by column, as Python's ``sum`` adds."""
        added, removed = np.zeros((n, self.ps)), np.zeros((n, self.ps))
        dmem, touched = np.zeros((n, self.ps), dtype=np.int64), np.zeros((n, self.ps), dtype=bool)
        for at, add, rem in slots:
            if not at:
                continue
            at, add, rem = np.asarray(at), np.asarray(add), np.asarray(rem)
            added[at] += self.cost[add]
            removed[at] += self.cost[rem]
            dmem[at] += self.nbytes[add] - self.nbytes[rem]
            touched[at] |= self.on[add] | self.on[rem]
        approx = np.asarray(st.costs, dtype=np.float64) + (added - removed)
        full = ((np.asarray(st.mem, dtype=np.int64) + dmem > limit) & touched).any(axis=1)
        total = approx[:, 0].copy()
        for p in range(1, self.ps):
            total += approx[:, p]
        top = approx.max(axis=1)
        return [None if f else (m, t) for f, m, t in zip(full.tolist(), top.tolist(), total.tolist())]


def _score(st: State, sp: _Space, moves: List[Move], top_k: int):
    """Best feasible move by the cost model, among the ``top_k`` best by the additive surrogate.

    The surrogate (a PS's cost + the added shards' costs alone - the removed ones') ranks the
    thousands of candidate moves cheaply; the cost model then scores only the most promising.
    """
    ranked = [(key, idx) for idx, key in enumerate(_Ranker(st, sp).rank(moves)) if key is not None]
    if not ranked:
        return None
    ranked.sort()
    scored = _exact(st, sp, [(moves[idx], _delta(st, sp, moves[idx])) for _, idx in ranked[:top_k]])
    return min(scored, key=lambda x: x[0])


def descend(st: State, sp: _Space, top_k: int, max_steps: int = 10_000, frozen: frozenset = frozenset()) -> State:
    for _ in range(max_steps):
        cur = st.key()
        improved = False
        for p in sorted(range(sp.ps), key=lambda q: (-st.costs[q], q)):
            if not st.sets[p]:
                continue
            best = _score(st, sp, _moves_from(st, sp, p, frozen), top_k)
            if best is not None and best[0] < cur:
                _commit(st, best[1], best[2])
                improved = True
                break
        if not improved:
            return st
    return st


def _kick(st: State, sp: _Space, rng: np.random.Generator, n_moves: int) -> None:
    """Apply ``n_moves`` random feasible moves, whatever they cost (leaves a local optimum)."""
    for _ in range(n_moves):
        busy = [p for p in range(sp.ps) if st.sets[p]]
        p = int(busy[rng.integers(len(busy))])
        moves = _moves_from(st, sp, p)
        for idx in rng.permutation(len(moves))[:20]:
            d = _delta(st, sp, moves[int(idx)])
            if d is not None:
                (_, mv, new), = _exact(st, sp, [(moves[int(idx)], d)])
                _commit(st, mv, new)
                break


def _split_kick(st: State, sp: _Space) -> frozenset:
    """Split every whole table that costs more than half a PS's fair share; return their names.

    Each goes to column halves (or 2 row shards), the second shard on the cheapest PS with
    room. Descent never takes this step by itself when such tables dominate: each half it sends
    away makes the receiving PS the slowest, and merging it back is the best single move. The
    caller therefore rebalances with these tables' layouts frozen before a free descent.
    """
    fair_half = sum(st.costs) / sp.ps / 2
    split, used = [], set()  # a PS takes at most one new half, or halves pile up again
    names = sorted((n for n, lay in st.layout.items() if lay.kind == "table"),
                   key=lambda n: (-sp.solo_cost(sp.reg.ids(n, WHOLE)[0]), n))
    for n in names:
        if sp.solo_cost(sp.reg.ids(n, WHOLE)[0]) <= fair_half:
            break
        p = st.where[n][0]
        done = False
        for lay in (ShardLayout("column", 2), ShardLayout("row", 2)):
            if lay not in sp.allowed[n] or done:
                continue
            for q in sorted(range(sp.ps), key=lambda q: (q in used, st.costs[q], q)):
                d = _delta(st, sp, ((n, lay, (p, q)),)) if q != p else None
                if d is not None:
                    (_, mv, new), = _exact(st, sp, [(((n, lay, (p, q)),), d)])
                    _commit(st, mv, new)
                    split.append(n)
                    used.update((p, q))
                    done = True
                    break
    return frozenset(split)


def split_seed(tables: Sequence[TableStats], ps: int, mem_per_ps: int, slots: int, ev: Evaluator,
               reg) -> Optional[State]:
    """LPT with splitting: a seed the greedy baselines never produce.

    A table that alone costs more than half a PS's fair share (total cost / M) is cut into the
    fewest shards (column halves or k row shards) that each cost at most that much; then every
    shard, dearest first, goes to the PS with the least summed cost that has memory room and no
    other shard of its table. Local search cannot reach this from a baseline when one hot table
    dominates: splitting it first makes some other PS the slowest, so the descent never takes
    that step. ``None`` if memory is too tight for this greedy.
    """
    def solo(ids):
        return ev.costs(reg, [frozenset([i]) for i in ids])

    whole = {t.name: solo(reg.ids(t.name, WHOLE))[0] for t in tables}
    half_share = sum(whole.values()) / ps / 2
    items = []  # (cost, table, layout, shard position)
    layouts = {}
    for t in tables:
        lays = candidate_layouts(t, ps, mem_per_ps, slots)
        lay = smallest_fitting_row_split(t, ps, mem_per_ps, slots) or lays[0]  # as the baselines do
        if whole[t.name] > half_share:
            split = sorted((x for x in lays if x.parts > 1), key=lambda x: x.parts)
            scored = [(max(solo(reg.ids(t.name, x))), x) for x in split]
            ok = [x for c, x in scored if c <= half_share]
            lay = ok[0] if ok else min(scored, key=lambda cx: (cx[0], cx[1].parts))[1] if scored else lay
        layouts[t.name] = lay
        for i, c in enumerate(solo(reg.ids(t.name, lay))):
            items.append((c, t.name, i))
    def nbytes(name, i):
        return reg.nbytes[reg.ids(name, layouts[name])[i]]

    # dearest first (LPT); if memory is too tight for that, biggest first with the big ones
    # packed best-fit (each on the fullest PS that still has room), the rest still by cost
    dearest = sorted(items, key=lambda x: (-x[0], x[1], x[2]))
    biggest = sorted(items, key=lambda x: (-nbytes(x[1], x[2]), -x[0], x[1], x[2]))
    for order, big in ((dearest, None), (biggest, mem_per_ps // 20)):
        where = _lpt(order, layouts, ps, mem_per_ps, nbytes, big)
        if where is not None:
            st = State.empty(tables, ps, slots, reg)
            for name, lay in layouts.items():
                st.place(name, lay, where[name])
            st.rescore(ev)
            return st
    return None


def row_seed(tables: Sequence[TableStats], ps: int, mem_per_ps: int, slots: int, ev: Evaluator,
             reg) -> Optional[State]:
    """Every table row-sharded over every PS: what the trainer does without a placement file.

    No baseline produces it (they place small tables whole), and where bytes cost (a link term,
    ``plan/network.py``) it is the layout that spreads every table's rows evenly over the links;
    as a seed, the plan is never predicted worse than no placement at all. ``None`` where a
    table has fewer rows than PS or the rows do not fit."""
    if ps < 2 or any(t.rows < ps for t in tables):
        return None
    st = State.empty(tables, ps, slots, reg)
    lay = ShardLayout("row", ps)
    for t in tables:
        st.place(t.name, lay, list(range(ps)))
    if max(st.mem) > mem_per_ps:
        return None
    st.rescore(ev)
    return st


def repair_seed(base: State, mem_per_ps: int, ev: Evaluator, light_frac: float = 0.05) -> Optional[State]:
    """``base`` with its memory-light tables re-placed by LPT, dominant ones split first.

    Under tight memory the big tables decide what fits where and the baselines place them
    feasibly, while the hot tables that decide the cost are often small. So keep the big
    tables where ``base`` put them, take every table of at most ``light_frac`` of a PS's memory
    out, split those that cost more than half a PS's fair share, and put their shards back
    dearest first onto the PS with the lowest cost (memory and one-shard-per-PS permitting).
    """
    reg, ps, slots = base.reg, base.ps, base.slots
    light = [n for n, t in base.tables.items() if t.bytes(slots) <= light_frac * mem_per_ps]
    if not light:
        return None
    st = State.empty(base.tables.values(), ps, slots, reg)
    for n in base.tables:
        if n not in light:
            st.place(n, base.layout[n], base.where[n])
    st.rescore(ev)

    def solo(ids):
        return ev.costs(reg, [frozenset([i]) for i in ids])

    fair_half = sum(base.costs) / ps / 2
    items, layouts = [], {}
    for n in light:
        t = base.tables[n]
        lay = WHOLE
        if solo(reg.ids(n, WHOLE))[0] > fair_half:  # the fewest parts that get under it, else the cheapest
            scored = [(max(solo(reg.ids(n, x))), x.parts, x) for x in candidate_layouts(t, ps, mem_per_ps, slots)]
            under = [x for c, _, x in sorted(scored, key=lambda y: y[1]) if c <= fair_half]
            lay = under[0] if under else min(scored, key=lambda y: (y[0], y[1]))[2]
        layouts[n] = lay
        items += [(c, n, i) for i, c in enumerate(solo(reg.ids(n, lay)))]
    load, mem = list(st.costs), list(st.mem)
    where = {n: [None] * lay.parts for n, lay in layouts.items()}
    for c, n, i in sorted(items, key=lambda x: (-x[0], x[1], x[2])):
        need = reg.nbytes[reg.ids(n, layouts[n])[i]]
        room = [p for p in range(ps) if mem[p] + need <= mem_per_ps and p not in where[n]]
        if not room:
            return None
        p = min(room, key=lambda q: (load[q], q))
        where[n][i] = p
        load[p] += c
        mem[p] += need
    for n, lay in layouts.items():
        st.place(n, lay, where[n])
    st.rescore(ev)
    return st


def _lpt(items, layouts, ps: int, mem_per_ps: int, nbytes, big: Optional[int]):
    """Each item on the least-loaded PS with room (items of ``big`` bytes or more: best fit)."""
    load, mem = [0.0] * ps, [0] * ps
    where = {n: [None] * lay.parts for n, lay in layouts.items()}
    for c, name, i in items:
        need = nbytes(name, i)
        room = [p for p in range(ps) if mem[p] + need <= mem_per_ps and p not in where[name]]
        if not room:
            return None
        if big is not None and need >= big:
            p = min(room, key=lambda q: (mem_per_ps - mem[q] - need, q))
        else:
            p = min(room, key=lambda q: (load[q], q))
        where[name][i] = p
        load[p] += c
        mem[p] += need
    return where


def search(seeds: Sequence[State], mem_per_ps: int, ev: Evaluator, seed: int = 0, kicks: int = 8,
           kick_moves: int = 3, top_k: int = 48) -> State:
    """Best state reachable from ``seeds`` (each already scored); never worse than the best seed."""
    if not seeds:
        raise ValueError("search needs at least one seed placement")
    sp = _Space(seeds[0], mem_per_ps, ev)
    rng = np.random.default_rng(seed)
    best = min(seeds, key=lambda s: s.key()).copy()
    best_key: Key = best.key()
    for s in seeds:
        cur = descend(s.copy(), sp, top_k)
        if cur.key() < best_key:
            best, best_key = cur, cur.key()
    if sp.ps < 2:
        return best
    for r in range(kicks):
        cur = best.copy()
        frozen = _split_kick(cur, sp) if r % 2 == 0 else frozenset()
        if frozen:  # rebalance around the split tables first, then descend freely
            cur = descend(cur, sp, top_k, frozen=frozen)
        else:
            _kick(cur, sp, rng, kick_moves)
        cur = descend(cur, sp, top_k)
        if cur.key() < best_key:
            best, best_key = cur, cur.key()
    return best
