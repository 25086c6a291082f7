"""The distributed row of ``make bench``: 1 process vs 2 workers × 2 PS vs 2 workers × 1 PS.

All three run the same ``gmeta train`` step on the same data, one after another in one bench
run, each for a fixed number of steps; throughput is the aggregate tasks/s after the first
(tracing) step. The share of step time spent on PS round-trips is measured inside a worker of
the 2×2 run (``python -m bench.distributed worker``): the full compiled step against a compiled
lookup-only pass (the PS reads) plus a compiled apply-only pass (the PS writes) on the same
batches. The same worker counts one step's PS RPCs from its partitioned graph
(``bench/ps_rpcs.py``: component function calls + worker <-> PS tensor transfers).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

from bench.ps_rpcs import APPLY_SCOPES, top_scope

STEPS = 120
JOBS = ((2, 2), (2, 1))  # workers, PS of the launched rows
# ``smoke`` (bench/run.py --smoke): every kind of job of the section, a few steps each, on the
# fewest processes that run its code, 1 worker + 1 PS each: one launched row (whose figure stands
# for both rows), the PS-share job, the A/B variants. A process's start is ~6 s of CPU (its
# TensorFlow import) on this 2-core box: processes, not steps, are what the smoke's minutes are.
SMOKE_STEPS = 4
SMOKE_JOBS, SMOKE_SHARE, SMOKE_AB = ((1, 1),), (1, 1), (1, 1)
RPC_KEYS = ("ps_rpcs_per_step", "ps_component_calls_per_step", "ps_lookup_transfers_per_step",
            "ps_apply_transfers_per_step", "ps_control_transfers_per_step")


def _train_argv(data: str, out: Path, per_worker_T: int, sets: Sequence[str] = (), steps: int = STEPS) -> List[str]:
    return [*[a for s in sets for a in ("--set", s)], "--config", "configs/quickstart.yaml", "--data", data, "--out", str(out), "--no-resume",
            "--steps", str(steps), "--set", f"data.tasks_per_batch={per_worker_T}",
            "--set", f"train.log_every={steps}", "--set", f"train.checkpoint_every={steps * 10}"]


def _aggregate(out: Path) -> float:
    return json.loads((out / "train_summary.json").read_text())["aggregate_tasks_per_s"]


def launched_rows(rates: Dict[str, float], smoke: bool) -> Dict[str, float]:
    """Every launched row's ``tasks_per_s_<w>w<p>ps``: the smoke's one row stands for the others
    (its figures mean nothing); a whole run has measured each (and no smoke row to read)."""
    if not smoke:
        return rates
    ran = rates[f"tasks_per_s_{SMOKE_JOBS[0][0]}w{SMOKE_JOBS[0][1]}ps"]
    return {**{f"tasks_per_s_{w}w{p}ps": ran for w, p in JOBS}, **rates}


def measure(data: str, work: Path, log=print, sets: Sequence[str] = (), smoke: bool = False) -> Dict[str, float]:
    """The distributed row; ``sets`` (``KEY=VALUE`` overrides of the quickstart config) for A/B
    comparisons (``python -m bench.distributed compare``); ``smoke``: ``SMOKE_STEPS`` a job."""
    from gmeta_tf.cli.main import cli
    from launch.local_cluster import LocalCluster
    from launch.supervisor import launch_local

    quiet = lambda m: None  # noqa: E731
    steps = SMOKE_STEPS if smoke else STEPS
    single = work / "dist-1proc"
    cli.main(["train", *_train_argv(data, single, 32, sets, steps)], standalone_mode=False)
    rates = {"tasks_per_s_1proc": _aggregate(single)}
    for workers, ps in SMOKE_JOBS if smoke else JOBS:
        out = work / f"dist-{workers}w{ps}ps"
        launch_local(workers, ps, _train_argv(data, out, 16, sets, steps), log=quiet, timeout_s=900)
        rates[f"tasks_per_s_{workers}w{ps}ps"] = _aggregate(out)
    rates = launched_rows(rates, smoke)
    # PS round-trip share, inside rank 0 of a 2-worker, 2-PS job.
    cluster = LocalCluster(log=quiet)
    share_file = work / "ps_share.json"
    try:
        share_workers, share_ps = SMOKE_SHARE if smoke else (2, 2)
        cluster.start_ps(share_ps)
        code = cluster.run_workers(share_workers, [sys.executable, "-m", "bench.distributed", "worker", data,
                                       str(share_file), "--ps", ",".join(cluster.ps_addresses),
                                       *[a for s in sets for a in ("--set", s)],
                                       *(["--timed", str(SMOKE_TIMED)] if smoke else [])], timeout_s=900)
    finally:
        cluster.teardown()
    if code != 0:
        raise RuntimeError(f"PS-share worker failed ({code})")
    share = json.loads(share_file.read_text())
    return {
        **rates,
        "speedup_2w2ps_over_1proc": rates["tasks_per_s_2w2ps"] / rates["tasks_per_s_1proc"],
        "speedup_2w1ps_over_1proc": rates["tasks_per_s_2w1ps"] / rates["tasks_per_s_1proc"],
        "ps_time_share": share["ps_time_share"],
        "step_ms": share["step_ms"], "ps_lookup_ms": share["lookup_ms"], "ps_apply_ms": share["apply_ms"],
        "ps_lookup_ops_per_step": share["ps_lookup_ops_per_step"], "ps_apply_ops_per_step": share["ps_apply_ops_per_step"],
        **{k: share[k] for k in RPC_KEYS},
        "steps": steps,
    }


def measure_ab(data: str, work: Path, variants: Dict[str, Sequence[str]], rounds: int = 2,
               workers: int = 2, ps: int = 2, smoke: bool = False) -> Dict[str, float]:
    """Aggregate tasks/s of ``workers`` x ``ps`` ``gmeta launch local`` runs of each variant
    (name -> ``--set`` overrides), alternating (A, B, A, B: outside load hits both alike), the
    median over ``rounds``: ``tasks_per_s_<name>`` each and every run's figure. ``smoke``: one
    round of ``SMOKE_STEPS`` on ``SMOKE_AB``'s processes."""
    import statistics

    from launch.supervisor import launch_local

    got: Dict[str, List[float]] = {v: [] for v in variants}
    if smoke:
        workers, ps = SMOKE_AB
    for r in range(1 if smoke else rounds):
        for name, sets in variants.items():
            out = work / f"ab-{name}-{r}"
            launch_local(workers, ps, _train_argv(data, out, 16, sets, SMOKE_STEPS if smoke else STEPS),
                         log=lambda m: None, timeout_s=900)
            got[name].append(_aggregate(out))
    return {**{f"tasks_per_s_{v}": statistics.median(r) for v, r in got.items()},
            **{f"runs_{v}": r for v, r in got.items()}}


SMOKE_TIMED = 2  # the smoke's PS-share worker: 2 timed calls of each pass, not 20


def _worker(data: str, out_file: str, ps: str, sets: Sequence[str] = (), timed_n: int = 20) -> None:
    """Runs as a Horovod rank: times full steps, lookup-only and apply-only passes."""
    import tensorflow as tf

    import gmeta_tf  # noqa: F401
    from bench.ps_rpcs import run_step
    from gmeta_tf.cluster.worker import worker_runtime
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.metaio.reader import load_schema, make_dataset
    from gmeta_tf.train.trainer import build_tables_once

    cfg = load_config("configs/quickstart.yaml", [f"data.path={data}", "data.tasks_per_batch=16",
                                                  f"cluster.ps=[{ps}]", *sets])
    rt = worker_runtime(cfg, log=lambda m: None)
    model, _, _, step, _ = build_tables_once(cfg, load_schema(data), rt, Path(out_file).parent / "share-run")
    batches = list(make_dataset(data, "train", cfg.data, rank=rt.rank, size=rt.size).take(8))

    @tf.function
    def lookups(batch):
        s = model.embeddings.lookup(batch, trainable=True, per_task=False)
        return [tf.reduce_sum(r) for r in s.rows()]

    rows = model.embeddings.trainable()
    dims = {t.shadow.name: t.dim for t in model.storage_tables()}

    @tf.function
    def applies(batch):
        # Only the lookup's side effect matters: the shadows (and, with model.ps_requests: per_ps,
        # the PS requests) now hold this batch's ids, which the apply updates.
        model.embeddings.lookup(batch, trainable=True, per_task=False)
        model.embeddings.apply(rows, [tf.zeros([tf.shape(s.ids)[0], dims[s.name]]) for s in rows.shadows])
        return tf.constant(0.0)

    def timed(fn, n=timed_n):
        fn(batches[0])
        rt.sync.barrier()
        t0 = time.perf_counter()
        for i in range(n):
            out = fn(batches[i % len(batches)])
        tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, "numpy") else x, out)
        return (time.perf_counter() - t0) / n * 1000

    # Before the step's first trace: partition graphs are recorded when the function is built.
    rpcs = run_step(step, batches[0])
    step_ms = timed(step.step)
    lookup_ms = timed(lookups)
    apply_ms = timed(applies) - lookup_ms  # the apply pass also looks up (the shadow needs it)
    if rt.rank == 0:
        share = min(1.0, (lookup_ms + max(apply_ms, 0.0)) / step_ms)
        Path(out_file).write_text(json.dumps({"step_ms": step_ms, "lookup_ms": lookup_ms,
                                              "apply_ms": apply_ms, "ps_time_share": share,
                                              **{k: rpcs[k] for k in RPC_KEYS},
                                              **ps_table_ops(step._compiled.get_concrete_function(batches[0]).graph)}))


def ps_table_ops(graph) -> Dict[str, int]:
    """Hash-table ops one step runs on the PS, from the step's graph: the lookups' finds, and the
    optimizer's finds and inserts on the tables and their slot tables. Each runs in its own PS
    partition of the step; their count grows with tables × shards (× slots for the apply)."""
    lookups = applies = 0
    for op in graph.get_operations():
        if "/job:ps/" not in op.device or not op.type.startswith("TFRA>"):
            continue
        if top_scope(op.name) in APPLY_SCOPES:
            applies += 1
        else:
            lookups += 1
    return {"ps_lookup_ops_per_step": lookups, "ps_apply_ops_per_step": applies}


COMPARED = ("tasks_per_s_1proc", "tasks_per_s_2w2ps", "tasks_per_s_2w1ps", "ps_time_share", "step_ms",
            "ps_lookup_ms", "ps_apply_ms", "ps_rpcs_per_step")


def compare(variants: Sequence[str], rounds: int = 1) -> Dict[str, Dict[str, float]]:
    """The distributed row under each of ``variants`` (``KEY=VALUE[;KEY=VALUE]``), run one after
    another (``rounds`` times, alternating, median), on the bench's data."""
    import statistics

    from bench.data import WORK
    from bench.data import prepared_data as _prepared_data

    data, _ = _prepared_data()
    runs: Dict[str, List[Dict[str, float]]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            runs[v].append(measure(data, WORK / "compare", sets=[s for s in v.split(";") if s]))
    return {v: {k: statistics.median(r[k] for r in rs) for k in COMPARED} for v, rs in runs.items()}


def _sets(argv: Sequence[str], flag: str = "--set") -> List[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "worker":
        _worker(sys.argv[2], sys.argv[3], sys.argv[5], _sets(sys.argv[6:]),
                *[int(n) for n in _sets(sys.argv[6:], "--timed")[-1:]])
    elif len(sys.argv) >= 3 and sys.argv[1] == "compare":
        result = compare(sys.argv[2:])
        print(f"{'':22}" + "".join(f"{v[:24]:>26}" for v in result))
        for k in COMPARED:
            print(f"{k:22}" + "".join(f"{result[v][k]:>26,.3f}" for v in result))
        print(json.dumps(result))
    else:
        sys.exit("usage: python -m bench.distributed worker DATA OUT_JSON --ps HOST:PORT,... [--set K=V ...]\n"
                 "       python -m bench.distributed compare 'K=V[;K=V]' 'K=V' ...")
