"""``make profile``: where the one-process meta step spends its time, from a TensorFlow profiler trace.

    python -m bench.profile_step [--steps N] [--set meta.inner_steps=3 ...] [--jit both|true|false]
    python -m bench.profile_step --distributed   # rank 0 of 2 workers + 2 PS, T=16 per worker

Builds the quickstart model on the bench's synthetic data (``bench/out``, made on first use),
traces ``--steps`` steps with ``tf.profiler.experimental`` and reads the trace's XPlane
(``*.xplane.pb``) directly: every op kernel execution is an event named ``<node>:<OpType>``,
so each is put in one bucket by its op type and name scope. ``--jit both`` (the default)
profiles the step with the dense math uncompiled and compiled, one after the other in this
process, so their shares can be compared side by side (absolute times on this box are noise).

Buckets (op time is summed over the executor's threads, so it can exceed wall time):
* ``tfra_unique``: ``tf.unique`` of the batch's ids; ``tfra_find``: the shadow lookup's
  hash-table finds (and its bookkeeping); ``tfra_init_rows``: with ``model.init_rows: all`` the
  random initial rows TFRA's lookup draws for *every* looked-up id (used only for ids not in
  the table yet), with ``missing`` the hashed rows of the missing ids (``initial_rows`` scope);
* ``tfra_apply_find`` / ``tfra_apply_insert``: the optimizer's hash-table finds and inserts
  (each table and its slot tables);
* ``optimizer_math``: the rest of the optimizers (row and dense Adam arithmetic, counters);
  with ``model.ps_requests: per_ps`` the lookups and applies it serves are under its scopes
  (``ps_request_lookup``: ``tfra_find``, ``tfra_init_rows``; ``ps_request_apply``: the apply
  buckets), worker-side cutting and stitching included;
* ``inner_loop``: the inner loop's forward and its (inner) gradient, ``dense_outer``: the query
  loss forward and the outer backward (through the inner loop); ``xla_dense``: both, when
  compiled (one XLA program, not split further);
* ``host_copies``: sends / receives / copies between devices and to the host; in a distributed
  worker the receives are the waits for the PS partitions (lookups, applies) to answer;
* ``allreduce``: Horovod's all-reduce of the dense gradients;
* ``other``: everything else (gathers around the lookups, reshapes, constants).
``dispatch`` is the step call's wall time (``STEP_CALL``) not spent running the function's graph
(``TrainStep.step``'s Python, the flat call's argument handling, eager dispatch); ``executor_overhead`` is the executor's
own time around the kernels (``ExecutorState::Process`` minus the kernels it ran).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from bench.ps_rpcs import APPLY_SCOPES, LOOKUP_SCOPE
from gmeta_tf import exit_codes

BUCKETS = ["tfra_unique", "tfra_find", "tfra_init_rows", "tfra_apply_find", "tfra_apply_insert", "optimizer_math", "inner_loop", "dense_outer", "xla_dense",
           "host_copies", "allreduce", "other"]
_COPY_OPS = {"_Send", "_Recv", "_HostSend", "_HostRecv", "Identity", "IdentityN", "_Retval", "_Arg",
             "MemcpyH2D", "MemcpyD2H", "_CopyFromGpuToHost", "_CopyFromHostToGpu"}
_XLA_OPS = {"XlaLaunch", "_XlaRun", "_XlaCompile", "XlaLaunchV2"}
_LOOKUP_OPS = {"Unique", "UniqueV2"}
_OPTIMIZER_SCOPES = ("Adam", "Adagrad", "SGD")


def bucket(node: str, op_type: str) -> str:
    """One bucket for one kernel event, from its op type and its node's name scopes."""
    scopes = node.split("/")
    top = scopes[0].rstrip("_0123456789")
    if op_type in _XLA_OPS or "_xla" in node or "cluster_" in node:
        return "xla_dense"
    if op_type in _COPY_OPS:
        return "host_copies"
    if op_type.startswith("Horovod"):
        return "allreduce"
    if top in _OPTIMIZER_SCOPES or top in APPLY_SCOPES:
        if op_type.startswith("TFRA>"):
            return "tfra_apply_find" if "Find" in op_type else "tfra_apply_insert"
        return "optimizer_math"
    if op_type in _LOOKUP_OPS:
        return "tfra_unique"
    if (top == "shadow_embedding_lookup" and "Random" in op_type) or "initial_rows" in scopes:
        return "tfra_init_rows"
    if top in ("shadow_embedding_lookup", LOOKUP_SCOPE) or op_type.startswith("TFRA>"):
        return "tfra_find"
    if "inner_loop" in scopes and scopes[0] != "gradient_tape":
        return "inner_loop"
    if any(s.startswith("gradient_tape") for s in scopes) or op_type in _DENSE_MATH:
        return "dense_outer"
    return "other"


# Forward math of the tower and the losses (the outer forward outside the inner loop's scope).
_DENSE_MATH = {"BatchMatMulV2", "MatMul", "Einsum", "Relu", "Sigmoid", "AddN", "Tile", "Pack", "Unpack",
               "Mul", "Sub", "AddV2", "RealDiv", "Neg", "Square", "Sum", "Select", "SelectV2", "Exp", "Log1p",
               "MatrixSolve", "Softplus", "Maximum", "StridedSlice", "StridedSliceGrad", "ConcatV2"}


def breakdown(xplane_file: str, steps: int, step_name: str) -> Dict[str, float]:
    """ms per step for each bucket, plus wall, dispatch and executor overhead, from one trace."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(xplane_file).read_bytes())
    ms = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            for ev in line.events:
                name = meta[ev.metadata_id].name
                dur = ev.duration_ps / 1e9
                if name.startswith(step_name):
                    ms["wall"] += dur
                elif name == "KernelAndDeviceFunc::Run":
                    ms["graph_run"] += dur
                elif name == "ExecutorState::Process":
                    ms["executor"] += dur
                elif name == "ExecutorState::ProcessAsync::Start" and _stat(plane, ev, "name") == "PartitionedCall":
                    ms["xla_dense"] += dur  # the compiled function: an async call, not a named kernel event
                    ms["kernels"] += dur
                elif ":" in name and "::" not in name and " " not in name:
                    node, op_type = name.rsplit(":", 1)
                    ms[bucket(node, op_type)] += dur
                    ms["kernels"] += dur
    out = {k: ms[k] / steps for k in BUCKETS}
    out["wall"] = ms["wall"] / steps
    out["dispatch"] = max(0.0, ms["wall"] - ms["graph_run"]) / steps
    out["executor_overhead"] = max(0.0, ms["executor"] - ms["kernels"]) / steps
    out["kernels"] = ms["kernels"] / steps
    return out


def _stat(plane, event, key: str):
    for st in event.stats:
        if plane.stat_metadata[st.metadata_id].name == key:
            return st.str_value or plane.stat_metadata.get(st.ref_value, None) and plane.stat_metadata[st.ref_value].name
    return None


def build(cfg):
    """The model and step for ``cfg``, warmed up (traced, compiled) on its 8 batches."""
    from gmeta_tf.meta.meta_step import TrainStep
    from gmeta_tf.meta.optimizers import make_optimizers
    from gmeta_tf.metaio.reader import load_schema, make_dataset
    from gmeta_tf.model.dlrm import DLRM
    from gmeta_tf.train.dense_sync import LocalSync

    model = DLRM(cfg.model, load_schema(cfg.data.path))
    d, e = make_optimizers(cfg.train)
    step = TrainStep(model, cfg.meta, d, e, LocalSync())
    batches = list(make_dataset(cfg.data.path, "train", cfg.data, training=True).take(8))
    for b in batches:
        step.step(b)
    return step, batches


# Each profiled step call runs inside this trace event (its wall time): TF's own event for a
# ``tf.function`` call is gone since the step is called flat (gmeta_tf/meta/flat_call.py).
STEP_CALL = "gmeta_profiled_step_call"


def _steps(step, batches, steps: int):
    import tensorflow as tf

    for i in range(steps):
        with tf.profiler.experimental.Trace(STEP_CALL):
            out = step.step(batches[i % len(batches)])
    return out


def trace(step, batches, steps: int) -> Dict[str, float]:
    """Trace ``steps`` steps and break the trace down."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as log_dir:
        tf.profiler.experimental.start(log_dir)
        _steps(step, batches, steps)["loss"].numpy()
        tf.profiler.experimental.stop()
        return breakdown(sorted(glob.glob(f"{log_dir}/plugins/profile/*/*.xplane.pb"))[-1], steps, STEP_CALL)


def profile(cfgs: Dict[str, object], steps: int, rounds: int) -> Dict[str, Dict[str, float]]:
    """Each config's breakdown, traced in interleaved rounds (median per bucket): the load on a
    shared box drifts, and interleaving puts every variant under the same drift."""
    built = {name: build(cfg) for name, cfg in cfgs.items()}
    runs: Dict[str, List[Dict[str, float]]] = {name: [] for name in cfgs}
    for _ in range(rounds):
        for name, (step, batches) in built.items():
            runs[name].append(trace(step, batches, steps))
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}


def profile_distributed(data: str, steps: int, sets: List[str], jits: List[str]) -> Dict[str, Dict[str, float]]:
    """Rank 0's profile in a 2-worker, 2-PS job (both ranks step; only rank 0 traces), one job per
    ``meta.jit_compile`` value."""
    from launch.local_cluster import LocalCluster

    rows = {}
    for jit in jits:
        cluster = LocalCluster(log=lambda m: None)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "profile.json"
            try:
                cluster.start_ps(2)
                code = cluster.run_workers(2, [sys.executable, "-m", "bench.profile_step", "worker", data, str(out),
                                               ",".join(cluster.ps_addresses), str(steps), *sets,
                                               f"meta.jit_compile={jit}"], timeout_s=900)
            finally:
                cluster.teardown()
            if code != 0:
                raise RuntimeError(f"profile workers failed ({code})")
            rows[f"jit={jit}"] = json.loads(out.read_text())
    return rows


def _worker(data: str, out_file: str, ps: str, steps: int, sets: List[str]) -> None:
    """One Horovod rank of ``profile_distributed``: the training step as ``gmeta train`` builds it."""
    import tensorflow as tf

    from gmeta_tf.cluster.worker import worker_runtime
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.metaio.reader import load_schema, make_dataset
    from gmeta_tf.train.trainer import build_tables_once

    cfg = load_config("configs/quickstart.yaml", [f"data.path={data}", "data.tasks_per_batch=16",
                                                  f"cluster.ps=[{ps}]", *sets])
    rt = worker_runtime(cfg, log=lambda m: None)
    _, _, _, step, _ = build_tables_once(cfg, load_schema(data), rt, Path(out_file).parent / "run")
    batches = list(make_dataset(data, "train", cfg.data, rank=rt.rank, size=rt.size).take(8))
    for b in batches:
        step.step(b)
    rt.sync.barrier()
    with tempfile.TemporaryDirectory() as log_dir:
        if rt.rank == 0:
            tf.profiler.experimental.start(log_dir)
        _steps(step, batches, steps)["loss"].numpy()
        if rt.rank == 0:
            tf.profiler.experimental.stop()
            trace = sorted(glob.glob(f"{log_dir}/plugins/profile/*/*.xplane.pb"))[-1]
            Path(out_file).write_text(json.dumps(breakdown(trace, steps, STEP_CALL)))
    rt.sync.barrier()


def table(rows: Dict[str, Dict[str, float]]) -> str:
    """Markdown: per bucket, ms/step and share of kernel time, one column pair per profiled variant."""
    names = list(rows)
    head = "| bucket | " + " | ".join(f"{n} ms/step | {n} share" for n in names) + " |"
    lines = [head, "|---|" + "---:|---:|" * len(names)]
    for key in BUCKETS + ["kernels", "executor_overhead", "dispatch", "wall"]:
        cells = []
        for n in names:
            r = rows[n]
            share = f"{r[key] / r['kernels']:.0%}" if key in BUCKETS else ""
            cells += [f"{r[key]:.2f}", share]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:  # a rank of --distributed: worker DATA OUT PS STEPS [SET ...]
        _worker(argv[1], argv[2], argv[3], int(argv[4]), argv[5:])
        return exit_codes.DONE.code
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--distributed", action="store_true", help="rank 0 of 2 workers + 2 PS instead of one process")
    ap.add_argument("--steps", type=int, default=10, help="steps per trace")
    ap.add_argument("--rounds", type=int, default=5, help="traces per variant, interleaved (one process)")
    ap.add_argument("--jit", choices=["both", "true", "false"], default="both")
    ap.add_argument("--set", action="append", default=[], help="config override, e.g. meta.inner_steps=3")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)

    import gmeta_tf  # noqa: F401
    from bench.data import prepared_data as _prepared_data
    from gmeta_tf.config.loader import load_config

    data, _ = _prepared_data()
    rows = {}
    jits = ["false", "true"] if args.jit == "both" else [args.jit]
    if args.distributed:
        rows = profile_distributed(data, args.steps, args.set, jits)
    else:
        rows = profile({f"jit={jit}": load_config("configs/quickstart.yaml",
                                                  [f"data.path={data}", *args.set, f"meta.jit_compile={jit}"])
                        for jit in jits}, args.steps, args.rounds)
    where = "rank 0 of 2 workers + 2 PS (T=16 each)" if args.distributed else "one-process"
    traced = f"{args.steps} traced steps" + ("" if args.distributed else f" x {args.rounds} interleaved rounds (median)")
    print(f"{where} meta step, quickstart shapes {' '.join(args.set)}; {traced}\n")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
