"""The standard greedy sharding heuristics the planner is compared against (and seeded from).

Each greedy sorts tables by its key (largest first) and puts each table on the least-loaded
PS that has memory room, where a PS's load is the same key summed over its tables:

* ``size-greedy``: bytes (rows x dim, with optimizer slots);
* ``dim-greedy``: dim;
* ``lookup-greedy``: dim x pooling (values read per sample);
* ``size-lookup-greedy``: dim x pooling x log10(rows);
* ``random``: random order, random PS among those with room (seeded).

A table that fits no single PS is row-split over the fewest PS that can each hold a shard
(the least-loaded ones), so every baseline handles the same inputs the planner does.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional

import numpy as np

from gmeta_tf.errors import PlanError
from gmeta_tf.plan.assignment import Registry, State
from gmeta_tf.plan.shard_layouts import WHOLE, ShardLayout, shards_of
from gmeta_tf.plan.spec import TableStats

KEYS: Dict[str, Callable[[TableStats, int], float]] = {
    "size-greedy": lambda t, slots: float(t.bytes(slots)),
    "dim-greedy": lambda t, slots: float(t.dim),
    "lookup-greedy": lambda t, slots: t.dim * t.pooling,
    "size-lookup-greedy": lambda t, slots: t.dim * t.pooling * math.log10(max(t.rows, 1)),
}
BASELINES = ["random", *KEYS]
# Not a baseline: best-fit decreasing by bytes, the planner's fallback seed when memory is so
# tight that every baseline fragments it and fails.
PACK = "best-fit"


def _place_greedy(state: State, t: TableStats, mem_per_ps: int, pick: Callable[[List[int], int], List[int]],
                  load: List[float], key: float) -> None:
    """Whole on one PS if any has room, else row-split over the fewest PS that have room."""
    for k in range(1, state.ps + 1):
        lay = WHOLE if k == 1 else ShardLayout("row", k)
        need = shards_of(t, lay)[0].bytes(state.slots)
        room = [p for p in range(state.ps) if state.mem[p] + need <= mem_per_ps]
        if len(room) >= k:
            chosen = pick(room, k)
            state.place(t.name, lay, chosen)
            for p in chosen:
                load[p] += key / k
            return
    free = max(mem_per_ps - m for m in state.mem)
    raise PlanError(f"table {t.name!r} ({t.bytes(state.slots) / 2**20:,.1f} MiB with optimizer slots) does not "
                    f"fit: the most free memory left on any of the {state.ps} PS is {free / 2**20:,.1f} MiB; "
                    "raise --mem-per-ps or --ps")


def greedy(tables: List[TableStats], ps: int, mem_per_ps: int, slots: int, algo: str, seed: int = 0,
           reg: Optional[Registry] = None) -> State:
    """Run baseline ``algo`` (one of ``BASELINES``); costs are not scored here."""
    state = State.empty(tables, ps, slots, reg)
    load = [0.0] * ps
    if algo == "random":
        rng = np.random.default_rng(seed)
        order = [tables[i] for i in rng.permutation(len(tables))]

        def pick(room, k):
            return sorted(int(p) for p in rng.choice(room, size=k, replace=False))

        for t in order:
            _place_greedy(state, t, mem_per_ps, pick, load, 0.0)
        return state
    if algo == PACK:
        order = sorted(tables, key=lambda t: (-t.bytes(slots), t.name))

        def fullest(room, k):  # best fit: the PS with the least memory left that has room
            return sorted(sorted(room, key=lambda p: (-state.mem[p], p))[:k])

        for t in order:
            _place_greedy(state, t, mem_per_ps, fullest, load, 0.0)
        return state
    if algo not in KEYS:
        raise PlanError(f"unknown algorithm {algo!r}; choose planner or one of {', '.join(BASELINES)}")
    keyf = KEYS[algo]
    keys = {t.name: keyf(t, slots) for t in tables}
    order = sorted(tables, key=lambda t: (-keys[t.name], t.name))

    def least_loaded(room, k):
        return sorted(sorted(room, key=lambda p: (load[p], p))[:k])

    for t in order:
        _place_greedy(state, t, mem_per_ps, least_loaded, load, keys[t.name])
    return state
