"""``gmeta plan calibrate`` on emulated links, against the same sets on loopback (issue 41, item 6).

The planner's model is the PS's CPU per step (what ``gmeta plan calibrate`` fits) plus a link
term (``plan/network.py``). Calibrating on the cluster's own links is what a user would do; the
question this answers is whether that changes the fit, i.e. whether the shipped model (fitted on
loopback) can stand for an emulated or real network, or the link leaks into the CPU figure (more
TCP work, longer waits that a CPU clock still counts, ...).

What it runs: the same random table sets (``SETTINGS``, one seed) measured twice by the
calibration's own path (``calibrate.measure_configs``: a fresh PS, the client in its own
process), once on loopback and once with the PS and the client on two emulated hosts joined by
``RATE`` links (``calibrate --network``). Then it fits a model on the emulated measurements, plans
the ``sharding_network`` section's tables with it, and compares the placement with the one the
shipped model gives.

Keys (``results["sharding"]["network"]["calibration"]``): ``cpu_ratio_median`` / ``cpu_ratio_max``
(emulated over loopback PS CPU ms per step, per set; ``max``: the farthest from 1 either way),
``wall_ratio_median`` (the client's wall ms per step: the link shows here), ``sets``, ``rate``,
``same_placement`` (the emulated-links model places every table where the shipped one does) and
``predicted_ms`` of the planner's placement under each model.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict

RATE = "rate=100mbit"  # slow enough to show in wall time; fast enough for the sets' MBs per step


def _settings(smoke: bool = False):
    from gmeta_tf.calibration.calibrate import QUICK, Settings

    if smoke:  # bench/run.py --smoke: `gmeta plan calibrate --quick`'s sets, one measured step
        return Settings(configs=QUICK.configs, variants=QUICK.variants, max_tables=QUICK.max_tables, warmup=1, steps=1)
    # the FULL settings' shapes, fewer of them: 8 sets of up to 8 tables, two variants each
    return Settings(configs=4, variants=2, max_tables=8, warmup=1, steps=3)


def measure(log: Callable[[str], None] = print, rate: str = RATE, seed: int = 0, smoke: bool = False) -> Dict:
    from gmeta_tf.calibration.calibrate import COST, measure_configs, random_configs

    settings = _settings(smoke)
    configs, records = random_configs(settings, seed)
    # The smoke (issue 53) reads the emulated links' measurement for loopback's too: the loopback
    # measurement is the calibration's own path with no network, which the sharding section's
    # smoke runs (``measure_sets``); two processes fewer, and no figure is read.
    loop = None if smoke else measure_configs(configs, settings.warmup, settings.steps, log)
    links = measure_configs(configs, settings.warmup, settings.steps, log, network=rate)
    loop = links if loop is None else loop
    both = [i for i in loop if i in links and loop[i][COST] > 0]
    cpu = [links[i][COST] / loop[i][COST] for i in both]
    wall = [links[i]["wall_ms"] / loop[i]["wall_ms"] for i in both]
    out = {"rate": rate, "sets": len(both), "cpu_ratio_median": statistics.median(cpu),
           "cpu_ratio_max": max(cpu, key=lambda r: abs(r - 1.0)), "wall_ratio_median": statistics.median(wall)}
    out.update(_same_plan(records, {"loopback": loop, "emulated": links}, seed, smoke))
    log(f"[calibrate on links] {len(both)} sets, {rate}: PS CPU {out['cpu_ratio_median']:.2f}x loopback's "
        f"(farthest {out['cpu_ratio_max']:.2f}x), wall {out['wall_ratio_median']:.2f}x; "
        f"same placement as the loopback fit's: {out['same_placement']}")
    return out


def _same_plan(records, measured: Dict[str, Dict], seed: int, smoke: bool = False) -> Dict:
    """A model fitted on each measurement of the same sets, the ``sharding_network`` tables planned
    with each (plus that section's link term): do the links change where the planner puts a table?
    (Both fitted on these few sets, so a difference is the links', not the set count's.)"""
    from bench.data import work_dir
    from bench.hot_split import _prepare
    from bench.network_paths import PER_WORKER_T
    from bench.sharding.network import MEM_PER_PS, POINT, PS, WORKERS, ZIPF
    from gmeta_tf.calibration.calibrate import COST
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.config.schema import wire_dtype_for
    from gmeta_tf.embedding.wire import Wire
    from gmeta_tf.plan.cost_model import CostModel, fit_document, shard_record
    from gmeta_tf.plan.network import with_network
    from gmeta_tf.plan.planner import make_plan, optimizer_slots_for, step_samples
    from gmeta_tf.plan.tables_from_data import tables_from_data
    from launch.network.profile import parse_profile

    cfg = load_config("configs/quickstart.yaml", [f"data.tasks_per_batch={PER_WORKER_T}"])
    tables = tables_from_data(_prepare(work_dir(smoke) / "sharding_network", ZIPF, smoke), cfg)
    samples, slots = step_samples(cfg.data, WORKERS), optimizer_slots_for(cfg.train.embedding_optimizer)
    plans = {}
    for name, by_index in measured.items():
        rows = [{"group": r["group"], "samples_per_step": r["samples_per_step"], "ms": by_index[r["index"]][COST],
                 "wall_ms": by_index[r["index"]]["wall_ms"], "shards": [shard_record(s) for s in r["shards"]]}
                for r in records if r["index"] in by_index]
        rate = parse_profile(POINT).rate_bit_s
        model = with_network(CostModel(fit_document(rows, seed=seed)), rate, workers=WORKERS, optimizer_slots=slots,
                             value_bytes=Wire(wire_dtype_for(cfg.cluster.wire_dtype, rate)).value_bytes)
        plans[name] = make_plan(list(tables), PS, MEM_PER_PS, "planner", cost_model=model, samples_per_step=samples,
                                optimizer_slots=slots, seed=0)
    return {"same_placement": plans["loopback"].placement == plans["emulated"].placement,
            "predicted_ms": {n: max(p.costs) for n, p in plans.items()}}
