"""Local search over placements, seeded from the best baselines (iterated local search).

A *move* re-places one or two tables (``(table, layout, PS of each shard)``): move a shard to
another PS, swap two shards of different tables, split a whole table row-wise (k = 2..M) or
column-wise (halves), add or drop one row shard, or merge a split table back onto one PS.

Descent: for the PS in order of predicted cost (slowest first), score every move that takes
something off that PS and apply the best one that improves the objective
(``assignment.objective``: max cost, then sum); stop when no move improves. Then a bounded
number of *kicks* (a few random feasible moves, then descent again), keeping the best state.
Every move is checked against the per-PS memory limit (optimizer slots included), and the
search starts from the best baseline and only ever accepts improvements, so the result is
never worse than that baseline. All randomness comes from ``seed``; no wall-clock budget, so
the same inputs give the same plan on any machine.
"""
from __future__ import annotations

from collections import defaultdict
from typing import List, Sequence, Tuple

import numpy as np

from gmeta_tf.plan.assignment import Evaluator, Key, State, objective
from gmeta_tf.plan.enumerate import WHOLE, Layout, candidate_layouts

Change = Tuple[str, Layout, Tuple[int, ...]]
Move = Tuple[Change, ...]


class _Space:
    """Per-table allowed layouts, and each shard's cost alone (the surrogate's unit)."""

    def __init__(self, st: State, mem_per_ps: int, ev: Evaluator):
        self.ps, self.mem_per_ps, self.reg, self.ev = st.ps, mem_per_ps, st.reg, ev
        self.allowed = {t.name: set(candidate_layouts(t, st.ps, mem_per_ps, st.slots)) for t in st.tables.values()}
        ids = sorted({i for n, lays in self.allowed.items() for lay in lays for i in self.reg.ids(n, lay)}
                     | {i for s in st.sets for i in s})
        self.solo = dict(zip(ids, ev.costs(self.reg, [frozenset([i]) for i in ids])))

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


def _moves_from(st: State, sp: _Space, p: int) -> List[Move]:
    """Every move that takes (part of) something off PS ``p``."""
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
        if lay.kind == "table":
            col = Layout("column", 2)
            if col in allowed:
                moves += [((n, col, (p, q)),) for q in others]
            for k in range(2, ps + 1):
                row = Layout("row", k)
                if row not in allowed:
                    continue
                if k == 2:
                    moves += [((n, row, (p, q)),) for q in others]
                else:
                    moves.append(((n, row, tuple(sorted([p] + [q for q in order if q != p][:k - 1]))),))
        else:
            moves += [((n, WHOLE, (q,)),) for q in range(ps) if WHOLE in allowed]
            if lay.kind == "row":
                grow = Layout("row", lay.parts + 1)
                free = [q for q in order if q not in where]
                if grow in allowed and free:
                    moves.append(((n, grow, where + (free[0],)),))
                shrink = Layout("row", lay.parts - 1)
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


def _score(st: State, sp: _Space, moves: List[Move], top_k: int):
    """Best feasible move by the cost model, among the ``top_k`` best by the additive surrogate.

    The surrogate (a PS's cost + the added shards' costs alone - the removed ones') ranks the
    thousands of candidate moves cheaply; the cost model then scores only the most promising.
    """
    ranked = []
    for mv in moves:
        d = _delta(st, sp, mv)
        if d is None:
            continue
        approx = list(st.costs)
        for p, (r, a, _) in d.items():
            approx[p] += sum(sp.solo_cost(i) for i in a) - sum(sp.solo_cost(i) for i in r)
        ranked.append(((max(approx), sum(approx)), len(ranked), mv, d))
    if not ranked:
        return None
    ranked.sort(key=lambda x: x[:2])
    scored = _exact(st, sp, [(mv, d) for _, _, mv, d in ranked[:top_k]])
    return min(scored, key=lambda x: x[0])


def descend(st: State, sp: _Space, top_k: int, max_steps: int = 10_000) -> State:
    for _ in range(max_steps):
        cur = st.key()
        improved = False
        for p in sorted(range(sp.ps), key=lambda q: (-st.costs[q], q)):
            if not st.sets[p]:
                continue
            best = _score(st, sp, _moves_from(st, sp, p), top_k)
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
    for _ in range(kicks):
        cur = best.copy()
        _kick(cur, sp, rng, kick_moves)
        cur = descend(cur, sp, top_k)
        if cur.key() < best_key:
            best, best_key = cur, cur.key()
    return best
