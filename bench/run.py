"""``make bench``: every benchmark, one table, one JSON file (``bench/results.json``).

``python -m bench.run [SECTION ...]`` runs only the named sections (``meta``, ``distributed``,
``sharding``, ``hot_split``, ``startup``, ``serve``, ``export``, ``delivery``, ``faults``, ``network``,
``wire_quality``, ``sharding_network``, ``network_repeats``); the other sections' previous results stay in the
JSON file. ``--help`` lists them. With none named, every section but ``ON_REQUEST``'s runs.
The file records its own wall times: ``bench_wall_s`` (this invocation), ``bench_sections`` (what
it ran), ``bench_section_wall_s.<name>`` (each section's latest) and ``bench_default_wall_s``
(the default sections' latest walls summed: what a whole `make bench` takes, against its 45
minutes).

``python -m bench.run --smoke [SECTION ...]`` (``make bench-smoke``, tests/test_bench_smoke.py)
runs every section (on-request ones included) on tiny sizes into ``bench/out/smoke/results.json``
(``--results PATH`` elsewhere; never ``bench/results.json``): the same code, so a section that
no longer runs is caught before it lands. Its sections run two at a time (bench/smoke_lanes.py;
``--serial``: one after another in one process); each section's smoke runs every code path of it
once, on the fewest processes and configurations that do (a sweep's loop once, side-by-side
duplicates once), each shrink said where it is made.

Each benchmark owns one section of the JSON object; later benchmarks (distributed, sharding,
hot/cold split) add their own sections through ``SECTIONS``. Ratios are measured side by side
in one run: absolute numbers on a 2-core box are noise, ratios are what we track.
"""
from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List

import gmeta_tf  # noqa: F401
from bench.data import BENCH_DIR, SMOKE_WORK, work_dir
from bench.data import prepared_data as _prepared_data
from gmeta_tf import exit_codes

RESULTS = BENCH_DIR / "results.json"
SMOKE_RESULTS = SMOKE_WORK / "results.json"


JIT_ROWS = {"meta_step_inner_steps_3": ["meta.inner_steps=3"],
            "meta_step_dense_embedding": ["meta.adapt=dense+embedding"],
            "meta_step_erm": ["meta.algo=erm"],
            "meta_step_newton": ["meta.adapt=head", "meta.inner_solver=newton"]}
# The smoke's meta step: 4 tasks a batch, so the per-task loops (the unrolled one is T copies of
# the task's graph) trace in seconds; the step's code is the same at any T.
SMOKE_META_SETS = ["data.tasks_per_batch=4"]
# The smoke traces one of JIT_ROWS' configs (the others' are loaded, not traced: measure_jit is
# the same code for each), the steps_per_call sweep's ends, the features copied twice only.
SMOKE_JIT_ROW, SMOKE_KS, SMOKE_COPIES = "meta_step_newton", (1, 8), (2,)


def bench_meta(results: Dict, smoke: bool = False) -> None:
    from bench.meta_io import measure_read_rate
    from bench.meta_step import (
        measure,
        measure_features,
        measure_flat_call,
        measure_hot_in_program,
        measure_jit,
        measure_model_key,
        measure_steps_per_call,
    )
    from gmeta_tf.config.loader import load_config

    data, prep = _prepared_data(smoke=smoke)
    results["prepare"] = prep
    sets = [f"data.path={data}", *(SMOKE_META_SETS if smoke else [])]
    cfg = load_config("configs/quickstart.yaml", sets)
    step = measure(cfg, smoke=smoke)
    # Every id hot in one process: the hot rows and both optimizers inside the XLA program
    # (meta.hot_in_program) against the compiled step before it, side by side.
    step.update(measure_hot_in_program(cfg, smoke=smoke))
    results["meta_step"] = step
    # The traced step called flat (meta/flat_call.py) against the tf.function call, side by side.
    results["meta_step_flat_call"] = measure_flat_call(cfg, smoke=smoke)
    # The dense math compiled by XLA or not, side by side, where the compiled program differs most.
    # The smoke: every row's config loaded (a renamed key fails it), one row measured: the same code.
    for section, row_sets in JIT_ROWS.items():
        row_cfg = load_config("configs/quickstart.yaml", [*sets, *row_sets])
        if not smoke or section == SMOKE_JIT_ROW:
            results[section] = measure_jit(row_cfg, smoke=smoke)
    # train.steps_per_call: k steps per compiled call against one (the default is chosen from this).
    results["meta_step_steps_per_call"] = measure_steps_per_call(cfg, ks=SMOKE_KS if smoke else (1, 4, 8), smoke=smoke)
    # model.init_rows: initial rows for the missing ids only, or TFRA's draw for every id.
    # model.ps_requests: one request per PS for all tables, or TFRA's per-table ops (one process).
    # The smoke measures one model key (fuse_tables, below: the same function) and only checks
    # that these two keys still take their values.
    for section, key, values in (("meta_step_init_rows", "init_rows", ["missing", "all"]),
                                 ("meta_step_ps_requests", "ps_requests", ["per_ps", "per_table"])):
        if smoke:
            for v in values:
                replace(cfg.model, **{key: v})  # an unknown key is a TypeError, a section broken
        else:
            results[section] = measure_model_key(cfg, key, values)
    # model.fuse_tables: the 7 tables as one fused TFRA table, or one each (one process). 8 s (was
    # 16): two 16-s runs gave 1.02 and 0.95 (per CPU second 1.04, 1.01; README): the spread between
    # runs, not the window, bounds it, and meta_step_features asks the same question at 7 tables.
    results["meta_step_fused"] = measure_model_key(cfg, "fuse_tables", [True, False], seconds=8.0,
                                                   labels=["fused", "per_table"], smoke=smoke)
    # The same step with 7, 14, 28 tables of one width (the features copied), fused and per table;
    # the smoke copies them twice only (14 tables: the same widening code, half the steps).
    results["meta_step_features"] = measure_features(cfg, copies=SMOKE_COPIES if smoke else (1, 2, 4), smoke=smoke)
    io = measure_read_rate(data, cfg.data, seconds=0.2 if smoke else 5.0)
    results["meta_io"] = {
        "read_tasks_per_s": io["tasks_per_s"],
        "read_samples_per_s": io["samples_per_s"],
        "train_consumes_tasks_per_s": step["tasks_per_s_vectorized"],
        "read_over_consume": io["tasks_per_s"] / step["tasks_per_s_vectorized"],
    }
    results["memory"] = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def bench_distributed(results: Dict, smoke: bool = False) -> None:
    from bench.distributed import COMPARED, measure, measure_ab

    data, _ = _prepared_data(smoke=smoke)
    work = work_dir(smoke)
    results["distributed"] = dist = measure(data, work, smoke=smoke)
    # model.fuse_tables: the default (fused tables, one request per PS) against one TFRA table per
    # feature (one request per PS), 2 workers + 2 PS, side by side. One round (was 2): three
    # alternating runs gave 0.90, 1.00, 0.95 (README), inside the 4-process job's +-15% run-to-run
    # noise whatever the rounds, and the load-robust answer to the same question is the next row
    # (ps_cpu_fused: the PS's CPU per step, 1.17-1.25). Two 2w2ps jobs (~1 min) off make bench.
    variants = {"fused": [], "per_ps": ["model.fuse_tables=false"]}
    if smoke:  # "fused" is dist's launched job exactly (no sets, the same steps and hosts): its run stands in
        from bench.distributed import SMOKE_AB, SMOKE_JOBS

        assert SMOKE_JOBS == (SMOKE_AB,), "the smoke's fused A/B run is the launched row's only on the same hosts"
        del variants["fused"]
    ab = measure_ab(data, work / "fused", variants, rounds=1, smoke=smoke)
    if smoke:
        launched = dist["tasks_per_s_{}w{}ps".format(*SMOKE_AB)]
        ab.update(tasks_per_s_fused=launched, runs_fused=[launched])
    results["distributed_fused"] = {**ab, "speedup_2w2ps_fused_over_per_ps": ab["tasks_per_s_fused"] / ab["tasks_per_s_per_ps"]}
    # The same tables fused or one each: the PS's CPU per step on one real PS (bench/ps_cpu.py).
    from bench.ps_cpu import measure as ps_cpu

    results["ps_cpu_fused"] = ps_cpu(data, smoke=smoke)
    # model.ps_requests: the default (one request per PS, the tables being on PS, fused) against
    # TFRA's own per-table path (one TFRA table per feature), the same row again in this run.
    per_table_sets = ["model.ps_requests=per_table", "model.fuse_tables=false"]
    if smoke:  # the same measure() as the row above on other sets: the sets loaded, dist's jobs reused
        from gmeta_tf.config.loader import load_config

        load_config("configs/quickstart.yaml", per_table_sets)
        per_table = dist
    else:
        per_table = measure(data, work / "per_table", sets=per_table_sets)
    results["distributed_ps_requests"] = {
        **{f"{k}_per_table": per_table[k] for k in COMPARED},
        "speedup_2w2ps_per_ps_over_per_table": dist["tasks_per_s_2w2ps"] / per_table["tasks_per_s_2w2ps"],
        "speedup_2w1ps_per_ps_over_per_table": dist["tasks_per_s_2w1ps"] / per_table["tasks_per_s_2w1ps"],
        "step_ms_per_ps_over_per_table": dist["step_ms"] / per_table["step_ms"],
    }


def bench_hot_split(results: Dict, smoke: bool = False) -> None:
    from bench.hot_split import measure

    results["hot_split"] = measure(work_dir(smoke), smoke=smoke)


def bench_startup(results: Dict, smoke: bool = False) -> None:
    from bench.startup import PS, SMOKE_PS, SMOKE_SAME_AS, SMOKE_WORKERS, WORKERS, measure

    # every rank reads its own shards: one per worker at 8 workers
    data, _ = _prepared_data(shards=8, smoke=smoke)
    results["startup"] = measure(data, work_dir(smoke), SMOKE_WORKERS if smoke else WORKERS,
                                 ps=SMOKE_PS if smoke else PS, same_as=SMOKE_SAME_AS if smoke else None)


def bench_serve(results: Dict, smoke: bool = False) -> None:
    from bench.serve import measure

    results["serve"] = measure(work_dir(smoke) / "serve", smoke=smoke)


def bench_sharding(results: Dict, smoke: bool = False) -> None:
    import os

    from bench.sharding.run import run

    # GMETA_BENCH_SHARDING_MEASURE=all measures every 2- and 4-PS task (~40 min) not the subset.
    previous = results.get("sharding", {})
    results["sharding"] = run(measure_all=os.environ.get("GMETA_BENCH_SHARDING_MEASURE") == "all", smoke=smoke)
    if "network" in previous:  # the sharding_network section's rows stay until it runs again
        results["sharding"]["network"] = previous["network"]


def bench_sharding_network(results: Dict, smoke: bool = False) -> None:
    from bench.sharding import calibrate_links
    from bench.sharding.network import measure

    # `gmeta plan calibrate` on emulated links against loopback (does the link change the fit or
    # the plan?), then the planner's placement against the best greedy one, trained on emulated
    # 5 Mbit/s links.
    calibration = calibrate_links.measure(smoke=smoke)
    results.setdefault("sharding", {})["network"] = {**measure(work_dir(smoke) / "sharding_network", smoke=smoke),
                                                     "calibration": calibration}


def bench_delivery(results: Dict, smoke: bool = False) -> None:
    from bench.delivery import measure

    results["delivery"] = measure(work_dir(smoke) / "delivery", smoke=smoke)


def bench_faults(results: Dict, smoke: bool = False) -> None:
    from bench.faults import measure

    data, _ = _prepared_data(smoke=smoke)
    results["faults"] = measure(data, work_dir(smoke) / "faults", smoke=smoke)


def bench_network(results: Dict, smoke: bool = False) -> None:
    from bench.network import measure

    previous = results.get("network", {})
    results["network"] = measure(work_dir(smoke) / "network", smoke=smoke)
    if "repeats" in previous:  # the network_repeats section's rows stay until it runs again
        results["network"]["repeats"] = previous["repeats"]


def bench_network_repeats(results: Dict, smoke: bool = False) -> None:
    from bench.hot_split import _prepare
    from bench.network_paths import measure_paths, repeat_sweeps, smoke_sweep
    from bench.network_summary import repeats_summary

    # The fast points again with 300-step windows and three interleaved passes: today's default
    # wire against float32 unshaped, and auto's split choice against lean (network_paths.py).
    work = work_dir(smoke) / "network"
    data = _prepare(work, 1.2, smoke=smoke)
    res: Dict = {}
    for sweep in repeat_sweeps():
        # the smoke: two paths of each sweep (the unshaped bf16 / float32 pair, auto / lean)
        paths = [p for p in ("default", "bf16", "auto", "lean") if p in sweep.paths][:2]
        res.update(measure_paths(data, work, smoke_sweep(sweep, paths=paths) if smoke else sweep))
    results.setdefault("network", {})["repeats"] = {**res, **repeats_summary(res)}


def bench_hot_in_program_2w(results: Dict, smoke: bool = False) -> None:
    from bench.hot_split import _prepare
    from bench.network_paths import UNSHAPED, measure_paths, profile_key, program_sweep, smoke_sweep

    # meta.hot_in_program at 2 workers + 2 PS, unshaped: in the program / outside it / uncompiled,
    # three interleaved passes of 300-step windows (network_paths.py's PROGRAM_PATHS).
    work = work_dir(smoke) / "network"
    sweep = smoke_sweep(program_sweep()) if smoke else program_sweep()
    res = measure_paths(_prepare(work, 1.2, smoke=smoke), work, sweep)[profile_key(UNSHAPED)]
    paths = {n: p for n, p in res.items() if isinstance(p, dict) and "runs_tasks_per_s" in p}

    def over(a: str, b: str) -> Dict:
        runs = [x / y for x, y in zip(paths[a]["runs_tasks_per_s"], paths[b]["runs_tasks_per_s"])]
        return {"median": paths[a]["tasks_per_s"] / paths[b]["tasks_per_s"], "by_pass": runs}

    results["hot_in_program_2w"] = {"paths": paths, "in_program_over_jit": over("lean_in_program", "lean_jit"),
                                    "in_program_over_uncompiled": over("lean_in_program", "lean")}


def bench_wire_quality(results: Dict, smoke: bool = False) -> None:
    import os

    from bench.wire_quality import measure, pick

    # bf16 on the wire and a stale hot tier against exact fp32 every-step sync, validation users.
    # GMETA_BENCH_WIRE_QUALITY=synthetic (or movielens) runs one dataset; the other's rows stay.
    datasets = pick(os.environ.get("GMETA_BENCH_WIRE_QUALITY"))
    results["wire_quality"] = {**results.get("wire_quality", {}), **measure(work_dir(smoke), datasets, smoke=smoke)}


def bench_scale(results: Dict, smoke: bool = False) -> None:
    from bench.scale import measure_scale

    # synth, prepare, train (1 process; 2 workers + 2 PS), eval at 1M and 10M rows (bench/scale.png)
    results["scale"] = {**results.get("scale", {}),
                        **measure_scale((1_000_000, 10_000_000), smoke=smoke, previous=results.get("scale"))}


def bench_scale_100m(results: Dict, smoke: bool = False) -> None:
    from bench.scale import SMOKE_ROWS, measure_scale

    # on request: the 100M-row point joins the 1M and 10M ones (scale.100000000.*, the same figure),
    # its one-process run one epoch: the end-to-end run of docs/scale.md. The smoke runs every size
    # at bench/scale.py's SMOKE_ROWS: where the scale section's smoke ran that already (its "20000"
    # row), this one's would be the same commands again (but one epoch: tests/test_scale_bench.py
    # checks epoch_steps), so it is kept.
    if smoke and str(SMOKE_ROWS) in results.get("scale", {}):
        return
    results["scale"] = {**results.get("scale", {}),
                        **measure_scale((100_000_000,), smoke=smoke, previous=results.get("scale"), epoch=True)}


def bench_table_scale(results: Dict, smoke: bool = False) -> None:
    from bench.table_scale import measure_tables

    # bytes per row of a TFRA table + Adam slots (local, on a PS) and model.max_rows at 1M, 10M ids
    # scale.table.<ids>.bytes_per_row beside the pipeline's rows (and scale.eviction.<ids>)
    results["scale"] = {**results.get("scale", {}), **measure_tables((1_000_000, 10_000_000), smoke=smoke)}


def bench_export(results: Dict, smoke: bool = False) -> None:
    from bench.export_lookup import measure

    results["export"] = measure(work_dir(smoke), smoke=smoke)


# Every section is ``f(results, smoke)``: ``smoke`` (``--smoke``) runs the same code on tiny
# sizes and short windows (each measure function says what shrinks), so `make bench-smoke` shows
# every section still runs whole in a few minutes; its figures mean nothing.
SECTIONS: Dict[str, Callable[[Dict, bool], None]] = {"meta": bench_meta, "distributed": bench_distributed,
                                                "sharding": bench_sharding, "hot_split": bench_hot_split,
                                                "startup": bench_startup, "serve": bench_serve,
                                                "export": bench_export, "delivery": bench_delivery,
                                                "faults": bench_faults,
                                                "network": bench_network,
                                                "network_repeats": bench_network_repeats,
                                                "hot_in_program_2w": bench_hot_in_program_2w,
                                                "wire_quality": bench_wire_quality,
                                                "sharding_network": bench_sharding_network,
                                                "scale": bench_scale, "scale_100m": bench_scale_100m,
                                                "table_scale": bench_table_scale}
# Run only when named: the quality guard trains twelve 2-worker jobs (about 10 minutes), and it
# answers a quality question, like ``make quality``, not a speed one; ``sharding_network`` trains
# six 4-worker jobs on 5 Mbit/s emulated links (about 7 minutes); ``network_repeats`` runs the
# sweep's two fast points again, 18 jobs with longer windows (about 15 minutes); ``hot_in_program_2w``
# nine 2-worker jobs with such windows (about 8 minutes). Without them ``make bench`` is meant
# to stay within 45 minutes on this box; the last notes had it at ~50 (meta ~9.4, network ~14.6),
# so issue 53 trimmed repeated windows, each trim justified where it is made: meta's jit rows,
# fused and features windows (~1.6 min), hot_split's Zipf 1.05 run once a side (~1.2 min),
# distributed_fused's second round (~1 min), the network's 5 Mbit/s window (~0.75 min). No key
# is gone. The file says whether it fits: ``bench_default_wall_s`` (and each section's wall).
ON_REQUEST = ("wire_quality", "sharding_network", "network_repeats", "hot_in_program_2w", "scale_100m")


def default_sections() -> List[str]:
    return [n for n in SECTIONS if n not in ON_REQUEST]


def smoke_sections() -> List[str]:
    """Every section, the on-request ones too: on tiny sizes each is cheap, and a broken one
    must not land whether `make bench` runs it by default or not."""
    return list(SECTIONS)

HEADLINES = [
    ("meta_step.speedup_vs_task_loop", "vectorized step / per-task while-loop (tasks/s)", "≥ 10"),
    ("meta_step_flat_call.speedup_flat_call", "the step called flat / as a tf.function (tasks/s, one process)", ""),
    ("meta_step_flat_call.speedup_flat_call_in_program", "… the same, every id hot in the XLA program", ""),
    ("meta_step_steps_per_call.speedup_k8_over_k1", "train.steps_per_call 8 / 1 (tasks/s, one process)", ""),
    ("meta_step_steps_per_call.speedup_k4_over_k1", "… 4 / 1", ""),
    ("meta_step.tasks_per_s_vectorized", "vectorized meta step, tasks/s", ""),
    ("meta_step.tasks_per_s_task_loop", "per-task loop (tf.while_loop), tasks/s", ""),
    ("meta_step.speedup_vs_unrolled_loop", "vectorized / unrolled per-task loop", ""),
    ("meta_step.jit_speedup", "dense math in XLA / uncompiled (tasks/s), quickstart", ""),
    ("meta_step.speedup_compiled_over_previous", "hot rows + optimizers in the XLA program / dense math only "
     "(tasks/s, every id hot, 1 process)", ""),
    ("hot_in_program_2w.in_program_over_jit.median", "… the same at 2 workers + 2 PS, hot rows synced every 4th "
     "step (tasks/s, unshaped links)", ""),
    ("hot_in_program_2w.in_program_over_uncompiled.median", "… in the program / today's uncompiled step, same run", ""),
    ("meta_step_inner_steps_3.jit_speedup", "… same, inner_steps: 3", ""),
    ("meta_step_dense_embedding.jit_speedup", "… same, adapt: dense+embedding", ""),
    ("meta_step_erm.jit_speedup", "… same, algo: erm", ""),
    ("meta_step_newton.jit_speedup", "… same, inner_solver: newton (adapt: head)", ""),
    ("meta_step_init_rows.speedup_missing_over_all", "init_rows: missing / all (tasks/s, quickstart)", ""),
    ("meta_step_ps_requests.speedup_per_ps_over_per_table", "ps_requests: per_ps / per_table (tasks/s, 1 process)", ""),
    ("meta_step_fused.speedup_fused_over_per_table", "fuse_tables: fused / one table each (tasks/s, 1 process)", "≥ 1.5"),
    ("meta_step_fused.cpu_speedup_fused_over_per_table", "… same, tasks per CPU second", ""),
    ("meta_step_features.7.tasks_per_s", "… fused step, 7 tables of one width, tasks/s", ""),
    ("meta_step_features.14.tasks_per_s", "… 14 tables", ""),
    ("meta_step_features.28.tasks_per_s", "… 28 tables", ""),
    ("meta_step_features.28.tasks_per_s_per_table", "… 28 tables, one TFRA table each", ""),
    ("meta_step_features.28.cpu_speedup_fused_over_per_table", "… 28 tables, fused / one each, tasks per CPU second", ""),
    ("meta_io.read_over_consume", "Meta-IO read rate / training consumption", "≥ 3"),
    ("meta_io.read_tasks_per_s", "Meta-IO read, tasks/s", ""),
    ("prepare.prepare_rows_per_s", "prepare, input rows/s", ""),
    ("distributed.speedup_2w2ps_over_1proc", "2 workers + 2 PS / 1 process (tasks/s)", ""),
    ("distributed.speedup_2w1ps_over_1proc", "2 workers + 1 PS / 1 process (tasks/s)", ""),
    ("distributed.ps_time_share", "share of step time in PS round-trips (2w2ps)", ""),
    ("distributed.ps_rpcs_per_step", "PS RPCs per worker step (2w2ps): calls + tensor transfers", ""),
    ("distributed.ps_lookup_transfers_per_step", "… of which the lookups' tensor transfers", ""),
    ("distributed.ps_apply_transfers_per_step", "… of which the apply's tensor transfers", ""),
    ("distributed_ps_requests.speedup_2w2ps_per_ps_over_per_table", "ps_requests: per_ps / per_table, 2w2ps tasks/s", ""),
    ("distributed_ps_requests.step_ms_per_ps_over_per_table", "… same, worker step time (2w2ps)", ""),
    ("distributed_ps_requests.ps_rpcs_per_step_per_table", "… PS RPCs per step on TFRA's per-table path", ""),
    ("distributed_fused.speedup_2w2ps_fused_over_per_ps", "fuse_tables: fused / one table each, 2w2ps tasks/s", "≥ 1.3"),
    ("ps_cpu_fused.7.ps_cpu_per_table_over_fused", "… PS CPU per step, one table each / fused, 7 tables", ""),
    ("ps_cpu_fused.28.ps_cpu_per_table_over_fused", "… same, 28 tables", ""),
    ("distributed.ps_lookup_ops_per_step", "hash-table lookups on the PS per worker step (2w2ps)", ""),
    ("distributed.ps_apply_ops_per_step", "hash-table finds + inserts of the apply on the PS, per step", ""),
    ("sharding.cost_model_error", "PS cost model, held-out error (geo. mean)", "≤ 0.10"),
    ("sharding.cost_model_error_bench", "PS cost model error on the bench's PS sets", ""),
    ("sharding.improvement_predicted_mean", "planner vs best baseline, predicted, mean", ""),
    ("sharding.improvement_predicted_max", "planner vs best baseline, predicted, max", ""),
    ("sharding.improvement_measured_mean", "planner vs best baseline, measured, mean", "≥ 0.10"),
    ("sharding.improvement_measured_max", "planner vs best baseline, measured, max", ""),
    ("sharding.network.improvement_measured_mean", "planner / best greedy tasks/s - 1, 4w2ps on 5 Mbit/s emulated links",
     "≥ 0.10"),
    ("sharding.network.improvement_predicted", "… the same, predicted (max-PS ms, CPU + link)", ""),
    ("sharding.network.cost_model_error", "… predicted max-PS ms vs measured step (geo. mean over arms)", "≤ 0.10"),
    ("sharding.network.link_bytes_error", "… PS link bytes counted vs the link term's payload", ""),
    ("sharding.network.default_over_greedy", "… no placement (every table row-sharded) / best greedy - 1", ""),
    ("hot_split.speedup_zipf_1_2", "hot/cold split on / off, Zipf 1.2 (best-window tasks/s, 2w2ps)", "≥ 1.5"),
    ("hot_split.speedup_mean_zipf_1_2", "… same, whole-run aggregate tasks/s", ""),
    ("hot_split.local_share_zipf_1_2", "lookups served by hot rows, Zipf 1.2", ""),
    ("hot_split.speedup_no_local_only_zipf_1_2", "… same, no table served wholly by hot rows", ""),
    ("hot_split.speedup_no_prefetch_zipf_1_2", "… same, cold rows not read ahead / written behind", ""),
    ("hot_split.speedup_zipf_1_05", "hot/cold split on / off, Zipf 1.05 (tasks/s, 2w2ps)", ""),
    ("hot_split.local_share_zipf_1_05", "lookups served by hot rows, Zipf 1.05", ""),
    ("startup.ratio_8w_over_1w", "start-up to first step, 8 workers / 1 worker (2 PS)", "≤ 1.5"),
    ("startup.seconds_1w", "start-up to first step, 1 worker, s (from ring joined)", ""),
    ("startup.seconds_8w", "start-up to first step, 8 workers, s (from ring joined)", ""),
    ("startup.wall_seconds_8w", "… 8 workers, s from launch (8 TF imports on this box)", ""),
    ("serve.predict.c1.p50_ms", "gmeta serve predict (8 rows), 1 client, p50 ms", ""),
    ("serve.predict.c1.p99_ms", "… p99 ms", ""),
    ("serve.predict.c16.rps", "gmeta serve predict, 16 clients, requests/s", ""),
    ("serve.predict.c16.p99_ms", "… p99 ms", ""),
    ("serve.adapt_and_predict.c1.p50_ms", "gmeta serve adapt_and_predict (16+8), 1 client, p50 ms", ""),
    ("serve.adapt_and_predict.c16.rps", "gmeta serve adapt_and_predict, 16 clients, requests/s", ""),
    ("serve.batched_over_unbatched_rps_c16", "predict requests/s, micro-batching on / off, 16 clients", ""),
    ("serve.predict_1row.c16.rps", "gmeta serve predict, 1-row requests, 16 clients, requests/s", ""),
    ("serve.predict_1row_batched.c16.rps", "… same, micro-batching on", ""),
    ("serve.predict_1row_batched.c16.rows_per_call", "… rows per merged model call", ""),
    ("serve.batched_over_unbatched_rps_1row_c16", "1-row predict requests/s, micro-batching on / off, 16 clients",
     "≥ 1.5"),
    ("serve.predict_1row_batched.c64.rps", "gmeta serve predict, 1-row requests, 64 clients, micro-batching on, "
     "requests/s", ""),
    ("serve.predict_1row_batched.c64.p99_ms", "… p99 ms", ""),
    ("serve.rss_mib_after", "… that server's resident memory after every serve point, MiB", ""),
    ("faults.worker_kill_recovery_s", "worker (rank 1) kill -9 to the next completed step, --max-restarts 1, s (2w2ps)", "≤ 15"),
    ("faults.worker_kill_steps_redone", "… steps redone (train.checkpoint_every 50)", "≤ 50"),
    ("faults.ps_kill_recovery_s", "PS kill -9 to the next completed step, --max-restarts 1, s (2w2ps)", "≤ 30"),
    ("faults.ps_kill_steps_redone", "… steps redone (train.checkpoint_every 50)", "≤ 50"),
    ("faults.elastic_worker_kill_recovery_s", "worker (rank 1) kill -9 with --elastic to rank 0's next logged step "
     "(10 steps after the rollback included), s (2w2ps)", "≤ 15"),
    ("faults.elastic_steps_10_s", "… those 10 steps' share: 10 steps before the kill, s", ""),
    ("faults.elastic_worker_kill_restarts", "… restarts of the job (none: the survivor goes on)", "0"),
    ("faults.preempt_steps_redone", "SIGTERM to the launcher: steps redone after the resume", "0"),
    ("faults.preempt_checkpoint_s", "… the preemption checkpoint, s (2w2ps)", ""),
    ("faults.preempt_exit_s", "… SIGTERM to the job's exit, s", ""),
    ("memory.peak_rss_mib", "peak RSS of the bench process, MiB", ""),
    ("export.static_ns_per_id_hit", "exported table lookup (1M rows), ns per id", ""),
    ("export.static_over_tfra", "exported table lookup / TFRA lookup (per id)", ""),
    ("network.emulation.rate_error", "emulated link: bulk TCP rate / set rate - 1 (worst of 100 Mbit/s, 1 Gbit/s)",
     "within ±0.10"),
    ("network.bridge.default.tasks_per_s", "2w2ps on emulated hosts, unshaped, default path, tasks/s", ""),
    ("network.5mbit.default.wait_share", "… 5 Mbit/s links: share of the step the link adds (default path)", ""),
    ("network.5mbit.default.busiest_link_kb_per_step", "… 5 Mbit/s: busiest link, busier direction, kB per step (default)",
     ""),
    ("network.5mbit.lean.busiest_link_kb_per_step", "… same, lean (bf16 wire + hot split synced every 4)", ""),
    ("network.lean_best.speedup", "… where the default waits >= 50%: best path / default (tasks/s)", "≥ 2.0"),
    ("network.lean_best.wait_share_default", "… the default's wait share there", "≥ 0.50"),
    ("network.lean_best.bytes_ratio", "… busiest link bytes per step, best path / default", "≤ 0.40"),
    ("network.lean_4w.speedup", "… same point, 4 workers + 2 PS: best path / default (tasks/s)", "≥ 1.8"),
    ("network.lean_unshaped", "… unshaped: lean / default path (tasks/s)", "≥ 0.97"),
    ("network.unshaped_over_default.bf16", "… unshaped: bf16 wire / default", ""),
    ("network.unshaped_over_default.hot_split", "… unshaped: hot split / default", ""),
    ("network.unshaped_over_default.hot_stale", "… unshaped: hot split synced every 4 / default", ""),
    ("network.repeats.unshaped_bf16_over_float32", "… unshaped, 3 passes x 300 steps: bf16 wire (the default) / float32", "≥ 0.97"),
    ("network.repeats.auto_picks_faster", "… unshaped and 100 Mbit/s, 3 passes x 300 steps: auto within 5% of lean or ahead", ""),
    ("network.auto.picks_faster", "… hot_split auto (rows by bytes, told the rate) within 5% of the faster of split on / off, every point",
     "true"),
    ("wire_quality.synthetic.bf16.diff", "valid AUC, bf16 wire - exact fp32 (synthetic, 2w2ps; interval in JSON)", ""),
    ("wire_quality.synthetic.stale.diff", "… hot tier synced every 4 - every step", ""),
    ("wire_quality.synthetic.lean.diff", "… both", ""),
    ("wire_quality.synthetic.exact_repeat.diff", "… exact - exact again (the run-to-run noise floor)", ""),
    ("wire_quality.movielens.bf16.diff", "valid MAE, bf16 wire - exact fp32 (MovieLens fold 0, 2w2ps)", ""),
    ("wire_quality.movielens.stale.diff", "… hot tier synced every 4 - every step", ""),
    ("wire_quality.movielens.lean.diff", "… both", ""),
    ("wire_quality.movielens.exact_repeat.diff", "… exact - exact again (the run-to-run noise floor)", ""),
    ("delivery.steps_ratio_warm_over_scratch", "steps to the from-scratch best valid AUC, warm start / scratch", "≤ 0.25"),
    ("delivery.time_ratio_warm_over_scratch", "… same, wall time", "≤ 0.25"),
    ("scale.10000000.prepare_rows_per_s", "prepare at 10M rows, rows/s (out of core)", ""),
    ("scale.10000000.prepare_peak_rss_mb", "… peak RSS, MB", "≤ 2048"),
    ("scale.10000000.synth_peak_rss_mb", "synth at 10M rows, peak RSS, MB", "≤ 1024"),
    ("scale.10000000.eval_users_per_s", "gmeta eval at 10M rows' test users, users/s", "≥ 2000"),
    ("scale.table.10000000.bytes_per_row", "TFRA table + Adam slots at 10M ids, bytes per row", ""),
    ("bench_default_wall_s", "make bench's default sections, wall s", "≤ 2700"),
]


def _get(d: Dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _parse(argv: List[str]):
    """``(sections, smoke, results path)`` from ``[--smoke] [--serial] [--results PATH] [SECTION ...]``
    (``--serial``: read by ``main``)."""
    smoke, path, names = False, None, []
    it = iter(argv)
    for a in it:
        if a == "--smoke":
            smoke = True
        elif a == "--serial":
            continue
        elif a == "--results":
            path = Path(next(it, ""))
        elif a.startswith("--results="):
            path = Path(a.split("=", 1)[1])
        else:
            names.append(a)
    return names, smoke, path or (SMOKE_RESULTS if smoke else RESULTS)


def run_sections(wanted: List[str], results: Dict, path: Path, smoke: bool = False) -> List[str]:
    """Run ``wanted`` in order, the JSON file rewritten after each with its wall time
    (``bench_section_wall_s.<name>``) and the run's so far (``bench_wall_s``: the sections
    run this time, so `make bench`'s 45-minute budget is read off the file itself). A smoke run
    goes on past a failing section (all of them are what it checks) and returns the failures;
    the real run stops at the first, as before."""
    failed: List[str] = []
    walls = results.setdefault("bench_section_wall_s", {})
    t_run = time.perf_counter()
    for name in wanted:
        t0 = time.perf_counter()
        try:
            SECTIONS[name](results, smoke)
        except Exception:
            if not smoke:
                raise
            traceback.print_exc()
            failed.append(name)
        walls[name] = round(time.perf_counter() - t0, 1)
        results["bench_wall_s"] = round(time.perf_counter() - t_run, 1)
        results["bench_sections"] = wanted
        if smoke:  # what bench/smoke_lanes.py reads back from a lane
            results["bench_failed"] = failed
        if all(n in walls for n in default_sections()):
            results["bench_default_wall_s"] = round(sum(walls[n] for n in default_sections()), 1)
        print(f"[bench] {name}: {walls[name]:.0f} s{' FAILED' if name in failed else ''}", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, sort_keys=True))
    return failed


def _smoke_in_lanes(wanted: List[str], results: Dict, path: Path) -> List[str]:
    """The smoke's sections in bench/smoke_lanes.py's lanes, written as ``run_sections`` writes
    them: each section's wall, this run's, the sections run and the failed ones."""
    from bench import smoke_lanes

    t0 = time.perf_counter()
    got, failed = smoke_lanes.run(wanted, work_dir(True))
    results.update(got)
    results.update(bench_wall_s=round(time.perf_counter() - t0, 1), bench_sections=wanted, bench_failed=failed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True))
    return failed


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: python -m bench.run [--smoke [--serial]] [--results PATH] [SECTION ...]\n"
              f"sections: {', '.join(SECTIONS)} (default: all but {', '.join(ON_REQUEST)})\n"
              f"--smoke: every named section (default: all, on-request ones included) on tiny sizes, "
              f"results to {SMOKE_RESULTS.relative_to(BENCH_DIR.parent)} (never {RESULTS.name}), two "
              f"sections at a time (bench/smoke_lanes.py; --serial: one after another, in this process)\n"
              f"GMETA_BENCH_NETWORK=full: the network section's five-rate sweep with TFRA's per-table path\n"
              f"GMETA_BENCH_WIRE_QUALITY=synthetic|movielens: the wire_quality section on one dataset")
        return exit_codes.DONE.code
    names, smoke, path = _parse(argv)
    # e.g. `python -m bench.run hot_split` runs one section; the smoke runs every one by default
    wanted = names or (smoke_sections() if smoke else default_sections())
    unknown = [n for n in wanted if n not in SECTIONS]
    if unknown:
        print(f"unknown bench section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}", file=sys.stderr)
        return exit_codes.USER_ERROR.code
    if smoke and path.resolve() == RESULTS.resolve():
        print(f"a smoke run never writes {RESULTS}", file=sys.stderr)
        return exit_codes.USER_ERROR.code
    # a smoke run starts from nothing: a previous file's rows would hide a section that wrote none
    results = json.loads(path.read_text()) if path.is_file() and not smoke else {}
    work_dir(smoke).mkdir(parents=True, exist_ok=True)
    if smoke and "--serial" not in argv and len(wanted) > 1:
        failed = _smoke_in_lanes(wanted, results, path)
    else:
        failed = run_sections(wanted, results, path, smoke)
    if smoke:
        print(f"\n[bench smoke] {len(wanted) - len(failed)} of {len(wanted)} sections ran in "
              f"{results['bench_wall_s']:.0f} s; wrote {path}")
        if failed:
            print(f"[bench smoke] FAILED: {', '.join(failed)}", file=sys.stderr)
            return exit_codes.FAILED.code
        return exit_codes.DONE.code
    rows = [(k, label, target, _get(results, k)) for k, label, target in HEADLINES]
    width = max(len(label) for _, label, _, _ in rows)
    print(f"\n{'benchmark'.ljust(width)}  {'value':>10}  target   key")
    for key, label, target, value in rows:
        # quality differences (wire_quality) live in the third decimal: small values get four
        v = "-" if value is None else f"{value:,.2f}" if abs(value) >= 0.1 or value == 0 else f"{value:.4f}"
        print(f"{label.ljust(width)}  {v:>10}  {target:7}  {key}")
    print(f"\nwrote {path}")
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
