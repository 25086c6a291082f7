"""The ``sharding`` section of ``make bench``: planner vs the five greedy baselines.

For every suite task and algorithm, ``make_plan`` gives a placement and its predicted max-PS
cost (the shipped cost model). For the measured subset (2- and 4-PS tasks), every PS's shard
set of every algorithm's plan is run on a real local PS process, one PS at a time, with the
calibration microbenchmark (``gmeta_tf.calibration.calibrate.measure_sets``); the measured max-PS cost
is the slowest PS's cost as calibration measures it (the PS process's CPU ms per step,
``calibrate.COST``). The client's wall time per step is reported too (``*_wall``): on a
shared 2-core box it also carries the client's own work and other processes' load.

Improvement per task = 1 - planner / best baseline, where the best baseline is the one with the
lowest cost *on that task* (predicted or measured, each on its own). The measured per-PS costs
also give an out-of-sample check of the cost model (``cost_model_error_bench``).
"""
from __future__ import annotations

import time
from typing import Callable, Dict

import numpy as np

from bench.sharding.suite import MEASURED_PER_PS_COUNT, OPTIMIZER_SLOTS, tasks
from gmeta_tf.errors import PlanError
from gmeta_tf.plan.cost_model import load_cost_model, ratio_error

BASELINES = ("random", "size-greedy", "dim-greedy", "lookup-greedy", "size-lookup-greedy")
ALGOS = ("planner", *BASELINES)


def _improvement(costs: Dict[str, float]) -> Dict:
    """Against the cheapest baseline that found a placement at all (``None``: it did not)."""
    feasible = [b for b in BASELINES if costs.get(b) is not None]
    best = min(feasible, key=lambda b: costs[b])
    return {"best_baseline": best, "improvement": 1.0 - costs["planner"] / costs[best]}


# ``smoke`` (bench/run.py --smoke): the measured task with the fewest tables, planned by every
# algorithm, the planner's and the best predicted baseline's PS sets measured for one step (the
# other baselines' are the same measuring loop, each a PS set more): the same planning,
# measuring, scoring.
SMOKE_STEPS = 1


def _smoke_suite(suite):
    return [min((t for t in suite if t.measured), key=lambda t: (len(t.tables), t.ps))]


def run(measure: bool = True, log: Callable[[str], None] = print, steps: int = 5, measure_all: bool = False,
        smoke: bool = False) -> Dict:
    """``measure_all``: measure *every* 2- and 4-PS task (24 tasks of up to 80 tables, about
    40 min on 2 cores) instead of the suite's fixed subset (6 tasks, about 5 min)."""
    from gmeta_tf.calibration.calibrate import COST, measure_sets
    from gmeta_tf.plan.planner import make_plan

    model = load_cost_model(None)
    suite = _smoke_suite(tasks()) if smoke else tasks()
    steps = SMOKE_STEPS if smoke else steps
    detail: Dict[str, Dict] = {}
    plans = {}
    plan_s = []
    for task in suite:
        row = {"ps": task.ps, "tables": len(task.tables), "memory": task.memory,
               "mem_per_ps_gib": task.mem_per_ps / 2**30, "predicted": {}}
        for algo in ALGOS:
            t0 = time.perf_counter()
            try:
                plan = make_plan(list(task.tables), task.ps, task.mem_per_ps, algo=algo, cost_model=model,
                                 samples_per_step=task.samples_per_step, optimizer_slots=OPTIMIZER_SLOTS, seed=0)
            except PlanError as e:
                if algo == "planner":
                    raise
                row["predicted"][algo] = None  # this greedy cannot place the tables in this memory
                row.setdefault("infeasible", {})[algo] = str(e)
                continue
            if algo == "planner":
                plan_s.append(time.perf_counter() - t0)
                row["planner_layouts"] = {k: v for k, v in plan.layouts.items() if v != "whole"}
            if max(plan.memory) > task.mem_per_ps:
                raise AssertionError(f"{task.name}: {algo} exceeds memory")
            plans[(task.name, algo)] = plan
            row["predicted"][algo] = plan.max_cost
        row.update({f"predicted_{k}": v for k, v in _improvement(row["predicted"]).items()})
        detail[task.name] = row
    pred_imp = [r["predicted_improvement"] for r in detail.values()]
    out = {
        "cost_model_error": model.error,  # held-out calibration sets
        "cost_model_algo": model.algo,
        "cost_model_sets": len(model.doc["rows"]),
        "tasks": len(suite),
        "improvement_predicted_mean": float(np.mean(pred_imp)),
        "improvement_predicted_max": float(np.max(pred_imp)),
        "improvement_predicted_min": float(np.min(pred_imp)),
        "planner_seconds_max": float(np.max(plan_s)),
        "planner_seconds_mean": float(np.mean(plan_s)),
        "infeasible_baseline_plans": sum(len(r.get("infeasible", {})) for r in detail.values()),
        "samples_per_step": suite[0].samples_per_step,
    }
    log(f"[sharding] predicted: planner vs best baseline {out['improvement_predicted_mean']:.1%} mean, "
        f"{out['improvement_predicted_max']:.1%} max over {len(suite)} tasks")
    if measure:
        measured_tasks = [t for t in suite if (t.ps in MEASURED_PER_PS_COUNT if measure_all else t.measured)]
        if smoke:
            plans = {(n, a): p for (n, a), p in plans.items() if a in ("planner", detail[n]["predicted_best_baseline"])}
        sets, where = [], []
        for task in measured_tasks:
            for algo in ALGOS:
                if (task.name, algo) not in plans:
                    continue
                for p, shards in enumerate(plans[(task.name, algo)].shards):
                    sets.append((shards, task.samples_per_step))
                    where.append((task.name, algo, p))
        t0 = time.perf_counter()
        records = measure_sets(sets, warmup=1 if smoke else 2, steps=steps, log=log)
        per_ps: Dict = {}
        for (name, algo, p), rec in zip(where, records):
            per_ps.setdefault((name, algo), {})[p] = rec
        pred_ps, meas_ps = [], []
        for task in measured_tasks:
            row = detail[task.name]
            for kind, key in (("measured", COST), ("measured_wall", "wall_ms")):
                row[kind] = {}
                for algo in ALGOS:
                    if (task.name, algo) not in per_ps:
                        row[kind][algo] = None
                        continue
                    costs = per_ps[(task.name, algo)]
                    row[kind][algo] = max(costs[p][key] for p in costs)
                    row.setdefault(f"{kind}_per_ps", {})[algo] = [costs[p][key] for p in sorted(costs)]
                row.update({f"{kind}_{k}": v for k, v in _improvement(row[kind]).items()})
            for algo in ALGOS:
                plan = plans.get((task.name, algo))
                for p, c in enumerate(plan.costs if plan else []):
                    if plan.shards[p]:
                        pred_ps.append(c)
                        meas_ps.append(per_ps[(task.name, algo)][p][COST])
        meas_imp = [detail[t.name]["measured_improvement"] for t in measured_tasks]
        wall_imp = [detail[t.name]["measured_wall_improvement"] for t in measured_tasks]
        out.update({
            "improvement_measured_mean": float(np.mean(meas_imp)),
            "improvement_measured_max": float(np.max(meas_imp)),
            "improvement_measured_min": float(np.min(meas_imp)),
            "improvement_measured_wall_mean": float(np.mean(wall_imp)),
            "improvement_measured_wall_max": float(np.max(wall_imp)),
            "measured_cost": COST,
            "measured_tasks": len(measured_tasks),
            "measured_scope": "every 2- and 4-PS task" if measure_all else "fixed subset (first 3 of 2 PS and of 4 PS)",
            "measured_ps_sets": len(meas_ps),
            "cost_model_error_bench": ratio_error(np.array(pred_ps), np.array(meas_ps)),
            "measure_seconds": time.perf_counter() - t0,
        })
        log(f"[sharding] measured: planner vs best baseline {out['improvement_measured_mean']:.1%} mean, "
            f"{out['improvement_measured_max']:.1%} max over {len(measured_tasks)} tasks; cost model off by "
            f"{out['cost_model_error_bench']:.1%} on the bench's PS sets")
    out["per_task"] = detail
    return out
