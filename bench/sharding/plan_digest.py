"""Every suite task's plan by every algorithm, written out exactly, to prove a planner change
changes no plan: ``python -m bench.sharding.plan_digest OUT.json`` before and after, then
``python -m bench.sharding.plan_digest --compare A.json B.json``.

Floats are written with ``repr`` (every bit), so the comparison is exact.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Dict

from bench.sharding.run import ALGOS
from bench.sharding.suite import OPTIMIZER_SLOTS, tasks
from gmeta_tf import exit_codes
from gmeta_tf.errors import PlanError
from gmeta_tf.plan.cost_model import load_cost_model


def _record(plan) -> Dict:
    return {"shards": [[repr(s) for s in ps] for ps in plan.shards], "memory": plan.memory,
            "costs": [repr(c) for c in plan.costs], "max_cost": repr(plan.max_cost), "layouts": plan.layouts,
            "placement": {k: repr(v) for k, v in plan.placement.items()},
            "baselines": {k: repr(v) for k, v in plan.baselines.items()}}


def digest() -> Dict:
    """The suite's tables and every (task, algorithm) plan, or the error that refused it."""
    from gmeta_tf.plan.planner import make_plan

    t0 = time.perf_counter()
    suite = tasks()
    out: Dict = {"tables": {t.name: [repr(x) for x in t.tables] for t in suite}, "plans": {}, "seconds": {}}
    out["seconds"]["suite"] = time.perf_counter() - t0
    model = load_cost_model(None)
    for task in suite:
        for algo in ALGOS:
            t1 = time.perf_counter()
            try:
                plan = make_plan(list(task.tables), task.ps, task.mem_per_ps, algo=algo, cost_model=model,
                                 samples_per_step=task.samples_per_step, optimizer_slots=OPTIMIZER_SLOTS)
                out["plans"][f"{task.name}/{algo}"] = _record(plan)
            except PlanError as e:
                out["plans"][f"{task.name}/{algo}"] = {"error": str(e)}
            out["seconds"][f"{task.name}/{algo}"] = time.perf_counter() - t1
    return out


def compare(a: Dict, b: Dict) -> int:
    """Print what differs (tables, plans); the number of differences."""
    bad = [k for k in ("tables", "plans") if set(a[k]) != set(b[k])]
    bad += [f"{k}:{n}" for k in ("tables", "plans") for n in a[k] if n in b[k] and a[k][n] != b[k][n]]
    for line in bad:
        print("differs:", line)
    print(f"{len(a['plans'])} plans, {len(a['tables'])} tasks compared: {len(bad)} difference(s)")
    return len(bad)


def main(argv) -> int:
    if argv[:1] == ["--compare"]:
        with open(argv[1]) as fa, open(argv[2]) as fb:
            return 1 if compare(json.load(fa), json.load(fb)) else 0
    out = digest()
    with open(argv[0], "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)
    plans = sum(v for k, v in out["seconds"].items() if k != "suite")
    print(f"suite built in {out['seconds']['suite']:.1f} s; {len(out['plans'])} plans in {plans:.1f} s")
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
