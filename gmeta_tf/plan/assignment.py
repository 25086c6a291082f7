"""Who-goes-where: the mutable assignment the search edits, its cost, and the ``Plan`` result.

Why one module: baselines and search must produce the *same* result type, scored by the same
objective, or "never worse than the best baseline" would compare different things.

Objective (smaller is better), compared as a tuple: the slowest PS's predicted cost, then the
sum over PS, then the whole cost vector sorted from the slowest down. The last part only
breaks ties: it lets the search make progress when two PS share the maximum.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from gmeta_tf.plan.cost_model import CostModel, ShardColumns, shard_terms
from gmeta_tf.plan.placement_file import ColumnSplit, TablePlacement
from gmeta_tf.plan.shard_layouts import WHOLE, ShardLayout, shards_of
from gmeta_tf.plan.spec import Shard, TableStats

Key = Tuple


def objective(costs: Sequence[float]) -> Key:
    r = [round(c, 9) for c in costs]
    return (max(r) if r else 0.0, round(sum(r), 9), tuple(sorted(r, reverse=True)))


class Registry:
    """Interns shards as small ints: the search builds hundreds of thousands of shard sets, and
    hashing an int is far cheaper than hashing a ``Shard`` (17-bin skew tuple included)."""

    def __init__(self, tables: Iterable[TableStats], slots: int):
        self.tables = {t.name: t for t in tables}
        self.slots = slots
        self.shard: List[Shard] = []
        self.nbytes: List[int] = []
        self.order: List[Tuple[str, str, int]] = []  # (table, kind, index): a PS's shards in cost-model order
        self._ids: Dict[Tuple[str, ShardLayout], Tuple[int, ...]] = {}

    def ids(self, name: str, lay: ShardLayout) -> Tuple[int, ...]:
        k = (name, lay)
        got = self._ids.get(k)
        if got is None:
            got = []
            for s in shards_of(self.tables[name], lay):
                got.append(len(self.shard))
                self.shard.append(s)
                self.nbytes.append(s.bytes(self.slots))
                self.order.append((s.table, s.kind, s.index))
            got = self._ids[k] = tuple(got)
        return got

    def interned(self, name: str, lay: ShardLayout) -> Optional[Tuple[int, ...]]:
        """``ids`` if that layout's shards have ids already, else ``None`` (interns nothing: the
        search's fast path must not change the order ids are handed out in)."""
        return self._ids.get((name, lay))


class Evaluator:
    """Memoised ``cost_model.ps_cost`` of a PS's shard set (the search asks for the same sets often).

    A cost model may offer ``ps_costs(list_of_shard_lists, samples_per_step) -> list`` to score
    many sets in one call (one ``predict`` for a fitted model); ``ps_cost`` is used otherwise.
    """

    def __init__(self, cost_model, samples_per_step: int):
        self.model = cost_model
        self.samples = int(samples_per_step)
        self.cache: Dict[FrozenSet[int], float] = {frozenset(): 0.0}
        self.calls = 0
        self._columns_reg: Optional[Registry] = None
        self._columns_of = ShardColumns()

    def costs(self, reg: Registry, sets: Sequence[FrozenSet[int]]) -> List[float]:
        missing = list(dict.fromkeys(s for s in sets if s not in self.cache))
        if missing:
            self.calls += len(missing)
            ordered = [sorted(s, key=reg.order.__getitem__) for s in missing]
            for s, v in zip(missing, self._score(reg, ordered)):
                self.cache[s] = float(v)
        return [self.cache[s] for s in sets]

    def _score(self, reg: Registry, ordered: List[List[int]]) -> List[float]:
        """Cost of each list of shard ids (in cost-model order), in one batch where the model allows."""
        if type(self.model) is CostModel:  # its batch, from each shard's terms computed once
            return self.model.predict_columns(self._columns(reg, ordered), ordered).tolist()
        lists = [[reg.shard[i] for i in ids] for ids in ordered]
        batch = getattr(self.model, "ps_costs", None)
        return batch(lists, self.samples) if batch else [self.model.ps_cost(x, self.samples) for x in lists]

    def _columns(self, reg: Registry, ordered: List[List[int]]) -> ShardColumns:
        """The shards' ``shard_terms``, each looked up once: hashing a shard's skew tuple on every
        set the search scores cost more than the cost model's own arithmetic."""
        if reg is not self._columns_reg:
            self._columns_reg, self._columns_of = reg, ShardColumns()
        cols = self._columns_of
        for ids in ordered:
            for i in ids:
                if i not in cols.known:
                    s = reg.shard[i]
                    cols.put(i, shard_terms(s.rows, s.dim, s.pooling, s.skew, self.samples))
        return cols


@dataclass
class State:
    """Shard layout and PS of every shard of every table, plus per-PS shard sets, memory and cost."""

    reg: Registry
    ps: int
    slots: int
    layout: Dict[str, ShardLayout] = field(default_factory=dict)
    where: Dict[str, List[int]] = field(default_factory=dict)  # PS of shard i of the table
    sets: List[FrozenSet[int]] = field(default_factory=list)  # shard ids (``Registry``) per PS
    mem: List[int] = field(default_factory=list)
    costs: List[float] = field(default_factory=list)

    @classmethod
    def empty(cls, tables: Iterable[TableStats], ps: int, slots: int, reg: Optional[Registry] = None) -> "State":
        """``reg``: share one registry between states the search compares (shard ids must agree)."""
        return cls(reg or Registry(tables, slots), ps, slots, sets=[frozenset()] * ps, mem=[0] * ps, costs=[0.0] * ps)

    @property
    def tables(self) -> Dict[str, TableStats]:
        return self.reg.tables

    def copy(self) -> "State":
        return State(self.reg, self.ps, self.slots, dict(self.layout),
                     {k: list(v) for k, v in self.where.items()}, list(self.sets), list(self.mem), list(self.costs))

    def place(self, name: str, layout: ShardLayout, where: List[int]) -> None:
        """Add a table that is not placed yet (costs are refreshed by ``rescore``)."""
        self.layout[name] = layout
        self.where[name] = list(where)
        for i, p in zip(self.reg.ids(name, layout), where):
            self.sets[p] = self.sets[p] | {i}
            self.mem[p] += self.reg.nbytes[i]

    def rescore(self, ev: Evaluator) -> None:
        self.costs = ev.costs(self.reg, self.sets)

    def key(self) -> Key:
        return objective(self.costs)


@dataclass
class Plan:
    """A placement of every table, with what the cost model predicts for each PS."""

    algo: str
    ps: int
    mem_per_ps: int
    optimizer_slots: int
    samples_per_step: int
    shards: List[List[Shard]]  # per PS
    costs: List[float]  # predicted ms per step, per PS
    memory: List[int]  # bytes per PS (values + optimizer slots + keys)
    layouts: Dict[str, str]  # table -> "whole" | "rowxk" | "columnx2"
    placement: Dict[str, TablePlacement]  # what placement.yaml holds
    baselines: Dict[str, float] = field(default_factory=dict)  # algo -> max cost (planner only)

    @property
    def max_cost(self) -> float:
        return max(self.costs) if self.costs else 0.0

    @property
    def sum_cost(self) -> float:
        return float(sum(self.costs))

    def key(self) -> Key:
        return objective(self.costs)


def to_plan(state: State, algo: str, mem_per_ps: int, samples_per_step: int) -> Plan:
    placement: Dict[str, TablePlacement] = {}
    for name in state.tables:
        lay, where = state.layout[name], state.where[name]
        placement[name] = ColumnSplit([[p] for p in where]) if lay.kind == "column" else list(where)
    shards = [sorted((state.reg.shard[i] for i in s), key=lambda x: (x.table, x.index)) for s in state.sets]
    return Plan(algo, state.ps, mem_per_ps, state.slots, samples_per_step, shards, list(state.costs),
                list(state.mem), {n: str(state.layout[n]) for n in state.tables}, placement)


__all__ = ["WHOLE", "Evaluator", "Plan", "Registry", "State", "objective", "to_plan"]
