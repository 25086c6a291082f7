"""The ``sharding_network`` bench section: the planner's placement against the greedy one,
trained on emulated hosts whose links cost something (issue 41, item 6).

What it does, and why this way:

* **the link the planner is told**: ``POINT`` (``rate=5mbit``, each host, each way), the point
  where the network section's default path waits on its links for most of its step (0.79,
  docs/network.md): on this box's tiny model (dim 16, a ~40 ms CPU step) that is where PS
  bytes are the step, as they are for a production model at Gbit/s. The planner scores every
  placement with the shipped PS cost model (``gmeta plan calibrate``'s fit; the PS's CPU per
  step does not depend on the link) plus the link term of ``plan/network.py`` at that rate
  (``with_network``, the same call as ``gmeta plan --network rate=5mbit``);
* **the data**: the network section's (bench/hot_split.py's ``_prepare``: 2,000 synthetic
  users, Zipf 1.2): seven tables of very different sizes and access rates (``item_id`` 11k
  rows read once per sample, ``item_tags`` 5k rows read ~3.7 times per sample, five tables of
  10-200 rows), what a recommendation data set looks like; no table or rate was chosen for a
  result;
* **the arms**: ``planner`` (``make_plan(algo="planner")``), ``greedy`` (the greedy baseline
  with the lowest predicted cost under the same model, which ``gmeta plan`` reports as the
  best baseline) and ``default`` (no placement file: every table row-sharded over every PS,
  what a job gets without the planner), each written as a ``placement.yaml`` and trained with
  ``cluster.placement``, hot tier off (``hot.budget=0``: the planner models the plain PS path);
* **the cluster**: ``WORKERS`` workers + ``PS`` PS, each on its own emulated host
  (``bench.network_paths.run_point``: its window, its link counters). 4 workers, not 2: with
  2 workers on links of one rate, each worker's link carries all of its own PS bytes plus the
  all-reduce, more than a PS link carries unless one PS serves over ~85% of the bytes
  (docs/network.md), so no placement of these tables changes the step. With more workers than
  PS, as PS clusters are run, the PS links carry the most and the slowest PS's bytes are the step;
* **side by side**: ``REPEATS`` passes, the arms alternated (the order reversed every other
  pass), so the box's load drifts over all of them alike.

Keys (``results["sharding"]["network"]``, ``summarize``):

* ``improvement_measured_mean``: the mean over passes of planner / greedy tasks/s - 1 (each
  pass's two runs side by side); ``improvement_predicted``: greedy / planner predicted max-PS
  ms - 1, the same ratio if a step took what the slowest PS is predicted to take;
* ``cost_model_error``: the planner's predicted max-PS ms per step (CPU + link) against the
  measured step time, each arm's median run: geometric mean of max/min - 1 over the arms
  (``cost_model.ratio_error``). The step also holds what the model does not see (the worker's
  own compute, the all-reduce), so this is an upper bound on the model's own error where the
  link binds;
* ``link_bytes_ratio``: per arm and PS, the bytes its link counted per step over the payload
  the link term assumed; ``link_bytes_error`` their ``ratio_error``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

POINT = "rate=5mbit"
WORKERS, PS = 4, 2
REPEATS = 2
# ``smoke`` (bench/run.py --smoke): every arm planned, and trained once on 1 worker (+ the PS):
# the same planning, jobs and reading on the fewest processes. The greedy arm's job is the
# planner's with another placement file (``cluster.placement``: the same code reads either), so
# the smoke reads the planner's run for it (issue 53: three processes fewer; no figure is read).
SMOKE_WORKERS = 1
SMOKE_STAND_INS = {"greedy": "planner"}
ZIPF = 1.2  # the network section's data
MEM_PER_PS = 8 * 2**30  # ample: memory does not constrain these tables (a few MiB)
PLAIN = "hot.budget=0"  # the plain PS path, the one the cost model describes
# A run whose job fails is run once more (logged, and listed in ``failed_runs``). It was added
# when one of 12 runs died in the workers' Gloo rendezvous ("HTTP GET request failed too many
# times") before step 1; that cause is fixed (docs/startup.md, a rank now waits for the
# rendezvous), so a listed failure is something else, worth reading.
RETRIES = 1


@dataclass(frozen=True)
class Arm:
    """One placement the bench trains: its file (``None``: no file, every table row-sharded
    over every PS) and what the planner's model predicts for it, per PS."""
    name: str
    algo: str
    placement: Optional[str]
    predicted_ps_ms: List[float]
    predicted_ps_payload: List[float] = field(default_factory=list)

    @property
    def predicted_ms(self) -> float:
        return max(self.predicted_ps_ms)

    def sets(self) -> List[str]:
        return [PLAIN] + ([f"cluster.placement={self.placement}"] if self.placement else [])


def plan_arms(tables, ps: int, workers: int, samples: int, rate_bit_s: Optional[int], slots: int, out_dir: Path,
              mem_per_ps: int = MEM_PER_PS, value_bytes: int = 4) -> Dict[str, Arm]:
    """The three arms for ``tables`` on ``ps`` PS behind links of ``rate_bit_s``, their
    placement files written under ``out_dir``. The model is ``gmeta plan --network``'s
    (``value_bytes``: the trained job's wire, ``cluster.wire_dtype``)."""
    from gmeta_tf.plan.cost_model import load_cost_model
    from gmeta_tf.plan.network import with_network
    from gmeta_tf.plan.placement_file import write_placement
    from gmeta_tf.plan.planner import baseline_plans, make_plan
    from gmeta_tf.plan.shard_layouts import ShardLayout, shards_of

    model = with_network(load_cost_model(None), rate_bit_s, workers=workers, optimizer_slots=slots,
                         value_bytes=value_bytes)
    kw = dict(cost_model=model, samples_per_step=samples, optimizer_slots=slots, seed=0)
    planner = make_plan(list(tables), ps, mem_per_ps, "planner", **kw)
    greedies = baseline_plans(list(tables), ps, mem_per_ps, **kw)
    best = min(greedies, key=lambda b: greedies[b].max_cost)
    payloads = getattr(model, "payloads", lambda lists, sps: [])  # loopback: no link term
    out_dir.mkdir(parents=True, exist_ok=True)
    arms: Dict[str, Arm] = {}
    for name, plan in (("planner", planner), ("greedy", greedies[best])):
        path = out_dir / f"{name}.yaml"
        write_placement(str(path), plan.placement, header=f"sharding_network bench: {plan.algo}")
        arms[name] = Arm(name, plan.algo, str(path), list(plan.costs), payloads(plan.shards, samples))
    rows = [shards_of(t, ShardLayout("row", ps)) if ps > 1 else shards_of(t, ShardLayout("table", 1))
            for t in tables]
    default = [[s[p] for s in rows] for p in range(ps)]
    arms["default"] = Arm("default", "row-sharded over every PS", None, model.ps_costs(default, samples),
                          payloads(default, samples))
    return arms


def order(names: Sequence[str], rep: int) -> List[str]:
    """The arms' order in pass ``rep``: as given, reversed every other pass."""
    return list(names) if rep % 2 == 0 else list(reversed(names))


def summarize(arms: Dict[str, Arm], runs: Dict[str, List[Dict]]) -> Dict:
    """The section's keys from each arm's runs (``run_point``'s figures, in pass order)."""
    from gmeta_tf.plan.cost_model import ratio_error

    pairs = [p["tasks_per_s"] / g["tasks_per_s"] - 1.0 for p, g in zip(runs["planner"], runs["greedy"])]
    per_arm, bytes_ratio = {}, {}
    for name, arm in arms.items():
        r = runs[name]
        step_ms = statistics.median(x["step_ms"] for x in r)
        per_arm[name] = {"algo": arm.algo, "placement": arm.placement, "predicted_ms": arm.predicted_ms,
                         "predicted_ps_ms": arm.predicted_ps_ms, "step_ms": step_ms,
                         "tasks_per_s": statistics.median(x["tasks_per_s"] for x in r),
                         "runs_tasks_per_s": [x["tasks_per_s"] for x in r],
                         "busiest_link_kb_per_step": statistics.median(x["busiest_link_kb_per_step"] for x in r)}
        if arm.predicted_ps_payload and all("wire_bytes_per_step_by_host" in x for x in r):
            measured = [statistics.median(x["wire_bytes_per_step_by_host"][f"ps{p}"] for x in r)
                        for p in range(len(arm.predicted_ps_payload))]
            per_arm[name]["ps_link_bytes_per_step"] = measured
            per_arm[name]["predicted_ps_payload"] = arm.predicted_ps_payload
            bytes_ratio[name] = [m / max(pred, 1e-9) for m, pred in zip(measured, arm.predicted_ps_payload)]
    names = list(arms)
    out = {
        "improvement_measured_mean": float(np.mean(pairs)),
        "improvement_measured_runs": pairs,
        "improvement_predicted": arms["greedy"].predicted_ms / arms["planner"].predicted_ms - 1.0,
        "default_over_greedy": per_arm["default"]["tasks_per_s"] / per_arm["greedy"]["tasks_per_s"] - 1.0
        if "default" in per_arm else None,
        "cost_model_error": ratio_error(np.array([arms[n].predicted_ms for n in names]),
                                        np.array([per_arm[n]["step_ms"] for n in names])),
        "greedy_algo": arms["greedy"].algo,
        "arms": per_arm,
    }
    if bytes_ratio:
        out["link_bytes_ratio"] = bytes_ratio
        flat = [(p, m) for n in bytes_ratio for p, m in zip(arms[n].predicted_ps_payload,
                                                              per_arm[n]["ps_link_bytes_per_step"])]
        out["link_bytes_error"] = ratio_error(np.array([p for p, _ in flat]), np.array([m for _, m in flat]))
    return out


def measure(work: Path, log: Callable[[str], None] = print, workers: int = WORKERS, ps: int = PS,
            repeats: int = REPEATS, point: str = POINT, smoke: bool = False) -> Dict:
    """Plan, then train every arm ``repeats`` times on emulated hosts (module docstring);
    ``smoke`` (bench/run.py --smoke): one pass, 1 worker, the network smoke's short window."""
    from bench.hot_split import _prepare
    from bench.network_paths import FIRST, LOG_EVERY, PER_WORKER_T, SMOKE_LOG_EVERY, SMOKE_WINDOW, STEPS, run_point
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.config.schema import wire_dtype_for
    from gmeta_tf.embedding.wire import Wire
    from gmeta_tf.plan.planner import optimizer_slots_for, step_samples
    from gmeta_tf.plan.tables_from_data import tables_from_data
    from launch.network.profile import parse_profile

    if smoke:
        workers, repeats = SMOKE_WORKERS, 1
    window, log_every = (SMOKE_WINDOW, SMOKE_LOG_EVERY) if smoke else ((FIRST, STEPS), LOG_EVERY)
    data = _prepare(work, ZIPF, smoke)
    cfg = load_config("configs/quickstart.yaml", [f"data.tasks_per_batch={PER_WORKER_T}"])
    rate = parse_profile(point).rate_bit_s
    samples = step_samples(cfg.data, workers)
    arms = plan_arms(tables_from_data(data, cfg), ps, workers, samples, rate, optimizer_slots_for(cfg.train.embedding_optimizer),
                     work / "sharding-network", value_bytes=Wire(wire_dtype_for(cfg.cluster.wire_dtype, rate)).value_bytes)
    for a in arms.values():
        log(f"[sharding_network] {a.name} ({a.algo}): predicted {a.predicted_ms:.1f} ms/step "
            f"(per PS {', '.join(f'{c:.1f}' for c in a.predicted_ps_ms)})")
    runs: Dict[str, List[Dict]] = {n: [] for n in arms}
    failures: List[str] = []
    for rep in range(repeats):
        for name in order(list(arms), rep):
            if smoke and runs.get(SMOKE_STAND_INS.get(name, "")):
                runs[name].append(dict(runs[SMOKE_STAND_INS[name]][rep]))
                log(f"[sharding_network] smoke: the {name} arm reads the {SMOKE_STAND_INS[name]} arm's run")
                continue
            for attempt in range(1 + RETRIES):
                try:
                    r = run_point(data, work / f"shnet-{name}-{rep}", point, arms[name].sets(), workers=workers, ps=ps,
                                  window_steps=window, log_every=log_every)
                    break
                except RuntimeError as e:  # a start-up that failed (e.g. the Gloo rendezvous): once more
                    failures.append(f"pass {rep} {name}: {str(e).splitlines()[0]}")
                    log(f"[sharding_network] {failures[-1]}")
                    if attempt == RETRIES:
                        raise
            runs[name].append(r)
            log(f"[sharding_network] pass {rep} {name}: {r['tasks_per_s']:.0f} tasks/s, {r['step_ms']:.0f} ms/step, "
                f"busiest link {r['busiest_link_kb_per_step']:,.1f} kB/step, {r['wall_s']:.0f} s")
    out = summarize(arms, runs)
    out.update({"point": point, "workers": workers, "ps": ps, "repeats": repeats, "samples_per_step": samples,
                "failed_runs": failures})
    log(f"[sharding_network] planner / greedy ({out['greedy_algo']}) tasks/s - 1: "
        f"{out['improvement_measured_mean']:+.1%} measured, {out['improvement_predicted']:+.1%} predicted; "
        f"cost model off by {out['cost_model_error']:.1%} on the step")
    return out
