"""``make_plan``: the one entry point for the CLI, the benchmark suite and the tests.

``algo="planner"`` runs every baseline, seeds the local search with the best few by predicted
cost plus split-first greedy seeds (``search.split_seed``, ``search.repair_seed``), and returns the best placement found (``search.py``); a baseline name returns that
baseline's placement, scored by the same cost model, so every algorithm goes through one code
path and one result type (``Plan``).
"""
from __future__ import annotations

from typing import Dict, List, Optional

from gmeta_tf.errors import PlanError
from gmeta_tf.plan.assignment import Evaluator, Plan, Registry, State, to_plan
from gmeta_tf.plan.baselines import BASELINES, PACK, greedy
from gmeta_tf.plan.cost_model import load_cost_model
from gmeta_tf.plan.search import repair_seed, row_seed, search, split_seed
from gmeta_tf.plan.shard_layouts import ShardLayout, shards_of
from gmeta_tf.plan.spec import TableStats

ALGOS = ["planner", *BASELINES]
N_SEEDS = 3  # the best this many baselines seed the local search


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def check_feasible(tables: List[TableStats], ps: int, mem_per_ps: int, slots: int) -> None:
    """Refuse what no placement can hold, naming the table at fault."""
    if ps < 1:
        raise PlanError(f"--ps must be >= 1, got {ps}")
    if mem_per_ps <= 0:
        raise PlanError(f"--mem-per-ps must be > 0, got {mem_per_ps}")
    if not tables:
        raise PlanError("no tables to place")
    names = [t.name for t in tables]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PlanError(f"table name(s) {dup} appear more than once")
    for t in tables:
        if t.rows < 0 or t.dim < 1 or t.pooling < 0:
            raise PlanError(f"table {t.name!r}: rows, dim and pooling must be >= 0, >= 1, >= 0 "
                            f"(got {t.rows}, {t.dim}, {t.pooling})")
        finest = shards_of(t, ShardLayout("row", ps)) if ps > 1 else shards_of(t, ShardLayout("table", 1))
        if finest[0].bytes(slots) > mem_per_ps:
            raise PlanError(f"table {t.name!r} needs {_mib(t.bytes(slots))} with {slots} optimizer slot(s): "
                            f"even row-split over all {ps} PS a shard ({_mib(finest[0].bytes(slots))}) exceeds "
                            f"--mem-per-ps {_mib(mem_per_ps)}")
    total = sum(t.bytes(slots) for t in tables)
    if total > ps * mem_per_ps:
        big = max(tables, key=lambda t: t.bytes(slots))
        raise PlanError(f"the {len(tables)} tables need {_mib(total)} with optimizer slots, more than "
                        f"{ps} PS x {_mib(mem_per_ps)}; the largest is table {big.name!r} ({_mib(big.bytes(slots))})")


def make_plan(tables: List[TableStats], ps: int, mem_per_ps: int, algo: str = "planner", cost_model=None,
              samples_per_step: int = 1024, optimizer_slots: int = 2, seed: int = 0) -> Plan:
    """Place ``tables`` on ``ps`` parameter servers of ``mem_per_ps`` bytes each.

    ``samples_per_step``: samples whose ids reach the PS per step, all workers together.
    ``optimizer_slots``: extra copies of every row the optimizer keeps (Adam 2, Adagrad 1).
    Raises ``PlanError`` (a ``UserError``) when the request cannot be met.
    """
    if algo not in ALGOS:
        raise PlanError(f"unknown algorithm {algo!r}; choose one of {', '.join(ALGOS)}")
    tables = list(tables)
    check_feasible(tables, ps, mem_per_ps, optimizer_slots)
    ev = Evaluator(cost_model if cost_model is not None else load_cost_model(None), samples_per_step)
    if algo != "planner":
        st = greedy(tables, ps, mem_per_ps, optimizer_slots, algo, seed)
        st.rescore(ev)
        return to_plan(st, algo, mem_per_ps, samples_per_step)
    reg = Registry(tables, optimizer_slots)
    seeds: List[State] = []
    scores = {}
    first_error: Optional[PlanError] = None
    for b in BASELINES:
        try:
            st = greedy(tables, ps, mem_per_ps, optimizer_slots, b, seed, reg)
        except PlanError as e:
            first_error = first_error or e
            continue
        st.rescore(ev)
        seeds.append(st)
        scores[b] = max(st.costs)
    if not seeds:
        try:
            st = greedy(tables, ps, mem_per_ps, optimizer_slots, PACK, seed, reg)
        except PlanError:
            raise first_error from None  # names the table the first baseline could not fit
        st.rescore(ev)
        seeds.append(st)
    seeds.sort(key=lambda s: s.key())
    seeds = seeds[:N_SEEDS]
    if ps > 1:  # seeds that split the tables dominating a PS (local search alone rarely does)
        extra = [split_seed(tables, ps, mem_per_ps, optimizer_slots, ev, reg),
                 row_seed(tables, ps, mem_per_ps, optimizer_slots, ev, reg)]
        extra += [repair_seed(s, mem_per_ps, ev) for s in seeds]
        seeds += [s for s in extra if s is not None]
    best = search(seeds, mem_per_ps, ev, seed=seed)
    plan = to_plan(best, "planner", mem_per_ps, samples_per_step)
    plan.baselines = scores
    return plan


def baseline_plans(tables: List[TableStats], ps: int, mem_per_ps: int, **kw) -> Dict[str, Plan]:
    """Every greedy baseline's plan that fits (``make_plan``'s keywords): what ``gmeta plan`` and
    the ``sharding_network`` bench compare the planner with; a baseline that cannot place the
    tables in this memory is left out, as ``gmeta plan`` leaves it out of its comparison."""
    out: Dict[str, Plan] = {}
    for b in BASELINES:
        try:
            out[b] = make_plan(tables, ps, mem_per_ps, b, **kw)
        except PlanError:
            pass
    return out


def step_samples(data, workers: int) -> int:
    """Samples whose ids reach the PS tier per step, all workers together (``data``: the
    config's ``data`` section): each worker's meta-batch, support and query."""
    return int(workers) * data.tasks_per_batch * (data.support + data.query)


def optimizer_slots_for(optimizer: str) -> int:
    """Slot tables TFRA keeps per embedding table: Adam m and v, Adagrad's accumulator."""
    return {"adam": 2, "adagrad": 1}[optimizer]
