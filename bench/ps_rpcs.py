"""PS round trips of one distributed training step, counted from the step's partitioned graph.

A worker's ``tf.function`` step with PS tables runs as one multi-device function: TensorFlow
cuts its graph into one partition per device, runs each PS partition on its PS as a *component
function* (one RPC per PS per step), and moves every tensor that crosses between the worker and a
PS partition through the rendezvous (one transfer per tensor: a ``_Send`` on one side, a
``_Recv`` on the other). The RPCs of a step are therefore

    component function calls (one per PS that holds a partition) + cross-task tensor transfers.

``count_rpcs`` reads them from ``RunMetadata``'s partition graphs (``run_step`` records them for
one step); each transfer is attributed to the lookup or to the optimizer's apply by the PS-side
op it feeds or comes from, and counted by its dtype (``ps_transfer_dtypes``: with
``cluster.wire_dtype: bfloat16`` a request's rows and gradients cross as bfloat16). ``python -m bench.ps_rpcs DATA [--ps 2] [--set KEY=VALUE ...]``
starts the PS processes, runs one worker (``horovodrun -np 1``) and prints the counts as JSON.

Several runs (``measure``'s ``runs``) share that one worker process: each builds its own model,
tables (a namespace of their own) and step on the same PS connection, so a run costs its trace
and steps, not a TensorFlow import, a Horovod ring and a PS connection of its own.
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

from gmeta_tf import exit_codes

# TFRA's wrapped optimizers name their ops under the first two; a PS request's apply under the last
# (``model.ps_requests: per_ps``, gmeta_tf/embedding/ps_requests.py's APPLY_SCOPE).
APPLY_SCOPES = ("Adam", "Adagrad", "ps_request_apply")
LOOKUP_SCOPE = "ps_request_lookup"  # ps_requests.py's LOOKUP_SCOPE
STEPS = 3  # trained after the counted step: later steps find and update rows earlier ones inserted
_TASK = re.compile(r"^(/job:[^/]+/replica:\d+/task:\d+)")


def _task(device: str) -> str:
    m = _TASK.match(device)
    return m.group(1) if m else device


def _is_ps(device: str) -> bool:
    return "/job:ps/" in device


def top_scope(name: str) -> str:
    """The top name scope of an op (``Adam`` of ``Adam_3/...``)."""
    return name.split("/")[0].rstrip("_0123456789")


def count_rpcs(partition_graphs: Sequence) -> Dict[str, int]:
    """RPCs of one execution of a multi-device function, from its partition graphs (``GraphDef``
    protos, ``RunMetadata.function_graphs[i].partition_graphs``): component function calls on
    the PS, and worker <-> PS tensor transfers, split into the lookup's, the optimizer apply's
    and the end-of-step control edges (one per PS, ``GroupCrossDeviceControlEdges``)."""
    ps_partitions = set()
    ps_nodes: Dict[str, object] = {}
    consumers: Dict[str, List[str]] = {}  # PS-side node -> the PS nodes reading it
    recvs, sends = [], []
    for g in partition_graphs:
        for node in g.node:
            if _is_ps(node.device):
                ps_partitions.add(_task(node.device))
                ps_nodes[node.name] = node
                for inp in node.input:
                    consumers.setdefault(inp.lstrip("^").split(":")[0], []).append(node.name)
            if node.op in ("_Recv", "_HostRecv"):
                recvs.append(node)
            elif node.op in ("_Send", "_HostSend"):
                sends.append(node)
    send_input = {(n.attr["tensor_name"].s, n.attr["send_device"].s): n.input[0].split(":")[0] for n in sends}

    def readers(name: str, depth: int = 3) -> List[str]:
        """The PS ops a received tensor feeds, through the Identity nodes that forward control
        edges."""
        out = []
        for c in consumers.get(name, []):
            out.append(c)
            if depth and ps_nodes[c].op == "Identity":
                out += readers(c, depth - 1)
        return out

    # Hash-table ops the PS runs (TFRA's kernels: finds, inserts, accums), by the scope that
    # issued them: the apply's (TFRA's optimizer, a PS request's apply) or the lookup's.
    hash_ops: Counter = Counter()
    for node in ps_nodes.values():
        if node.op.startswith("TFRA>"):
            hash_ops["apply" if top_scope(node.name) in APPLY_SCOPES else "lookup"] += 1
    by_kind: Counter = Counter()
    per_ps: Counter = Counter()
    dtypes: Dict[str, Counter] = {}  # kind -> transfers by dtype (cluster.wire_dtype's evidence)
    for r in recvs:
        src, dst = r.attr["send_device"].s.decode(), r.attr["recv_device"].s.decode()
        if _task(src) == _task(dst):
            continue
        if _is_ps(dst):  # worker -> PS: what the PS does with it
            ps_task, ps_ops = _task(dst), readers(r.name)
        else:  # PS -> worker: the PS op that produced it
            ps_task = _task(src)
            ps_ops = [send_input.get((r.attr["tensor_name"].s, r.attr["send_device"].s), "")]
        if any(top_scope(o) == LOOKUP_SCOPE for o in ps_ops):
            kind = "lookup"  # a PS request's sizes: sent once, read by the lookup and later the apply
        elif any(top_scope(o) in APPLY_SCOPES for o in ps_ops):
            kind = "apply"
        elif any(top_scope(o) == "GroupCrossDeviceControlEdges" for o in ps_ops):
            kind = "control"
        else:
            kind = "lookup"
        by_kind[kind] += 1
        per_ps[ps_task] += 1
        dtypes.setdefault(kind, Counter())[_dtype_name(r.attr["tensor_type"].type)] += 1
    calls = len(ps_partitions)
    return {"ps_rpcs_per_step": calls + sum(by_kind.values()), "ps_component_calls_per_step": calls,
            "ps_transfers_per_step": sum(by_kind.values()), "ps_lookup_transfers_per_step": by_kind["lookup"],
            "ps_apply_transfers_per_step": by_kind["apply"], "ps_control_transfers_per_step": by_kind["control"],
            "ps_transfers_by_ps": dict(sorted(per_ps.items())),
            "ps_hash_ops_per_step": sum(hash_ops.values()), "ps_lookup_hash_ops_per_step": hash_ops["lookup"],
            "ps_apply_hash_ops_per_step": hash_ops["apply"],
            "ps_transfer_dtypes": {k: dict(sorted(c.items())) for k, c in sorted(dtypes.items())}}


def _dtype_name(enum: int) -> str:
    """``DT_FLOAT`` for a ``DataType`` enum (a partition graph's ``tensor_type``)."""
    from tensorflow.core.framework import types_pb2

    return types_pb2.DataType.Name(enum)


def expected_rpcs(shards: Sequence[int], slots: int, init_rows: str, ps: int, requests: int = 0,
                  recorded: int = 0) -> int:
    """The count ``count_rpcs`` finds for a worker step with PS tables (bp_v2, as in distributed
    mode). ``shards`` is the shard count of each TFRA table on TFRA's per-table path, ``slots``
    the embedding optimizer's slot tables (Adam 2, Adagrad 1), ``requests`` the (PS, row width)
    requests of the tables that go per PS (``model.ps_requests: per_ps``). Per table and shard:

    * lookup: keys to the PS, found rows and their exists flags back (3); ``init_rows: all``
      adds the control edge of the shadow's ids write (TFRA orders the find after it) (4);
    * apply: a control edge (the gradient is ready), per slot table its find (keys in, rows out;
      a single-shard table skips TFRA's partitioning and sends the keys twice) and its insert
      (keys, values), and the accum of the rows (keys, deltas, exists): 1 + 4·slots + 3, or
      1 + 5·slots + 3 with one shard;

    per PS request, whatever its tables, shards and slots: ids and their sizes out, rows back (3),
    gradients and step counters out (2); plus, per PS that holds a shard (``ps``), the component
    function call and the end-of-step control edge (2). ``recorded``: shards of fused tables on
    TFRA's path, whose lookup also sends its new large ids' record (keys, ids: 2 each,
    ``FusedTable.record``; a request records on the PS)."""
    lookup = 3 if init_rows == "missing" else 4
    per_table = sum(n * (lookup + 1 + (4 if n > 1 else 5) * slots + 3) for n in shards)
    return per_table + 5 * requests + 2 * ps + 2 * recorded


def expected_hash_ops(shards: Sequence[int], slots: int, fused: Sequence[bool]) -> int:
    """Hash-table ops on the PS per step (``count_rpcs``' ``ps_hash_ops_per_step``), whichever path
    reaches them: per physical table and shard a find (and for a fused table its ids record),
    and on the apply a find per slot table and a write (insert or accum) of the rows and of each
    slot table. Per *physical* table: the logical tables fused into one add nothing."""
    return sum(n * ((2 if f else 1) + 2 * slots + 1) for n, f in zip(shards, fused))


def run_step(step, batch) -> Dict[str, int]:
    """Run ``step.step(batch)`` once, recording its partition graphs, and count its RPCs. Call it
    before the step function is first traced: partition graphs are recorded when a function is
    instantiated."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        out = step.step(batch)
        float(out["loss"])
        meta = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    graphs = [g for fg in meta.function_graphs for g in fg.partition_graphs]
    return count_rpcs(graphs)


def _worker(data: str, out_dir: str, ps: str, runs: Mapping[str, Sequence[str]]) -> None:
    """One Horovod rank for every run: connect to the PS once, count every run's first step,
    then train and fingerprint each. Counting comes first because training and exporting one
    run's tables instantiates functions whose partition graphs TensorFlow then records in the
    next counted step too (4 more transfers than the step has, measured), while building and
    stepping another model beside a counted one adds none."""
    import gmeta_tf  # noqa: F401
    from gmeta_tf.cluster.worker import worker_runtime
    from gmeta_tf.config.loader import load_config

    rt = worker_runtime(load_config("configs/quickstart.yaml", [f"data.path={data}", f"cluster.ps=[{ps}]"]),
                        log=lambda m: None)
    counted = [_count(data, str(Path(out_dir) / f"{name}.json"), ps, sets, rt) for name, sets in runs.items()]
    for finish in counted:
        finish()


def _count(data: str, out_file: str, ps: str, sets: Sequence[str], rt):
    """Build the model as ``gmeta train`` does and count one step's RPCs; returns the rest of
    the run (train ``STEPS`` more, fingerprint the tables: ``table_fingerprint``, write
    ``out_file``) to call later. Its tables get a namespace of their own (the run's file name),
    so runs on the same PS processes do not share tables; its placement is the run's own
    (``cluster.placement``), checked against the PS as ``worker_runtime`` does."""
    from dataclasses import replace

    from gmeta_tf.cluster.worker import load_placement
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.embedding.optimizers import slot_count
    from gmeta_tf.embedding.wire import Wire
    from gmeta_tf.metaio.reader import load_schema, make_dataset
    from gmeta_tf.plan.placement_file import check_tasks
    from gmeta_tf.train.dense_sync import HorovodSync
    from gmeta_tf.train.trainer import build_tables_once

    cfg = load_config("configs/quickstart.yaml", [f"data.path={data}", f"cluster.ps=[{ps}]", *sets])
    data = cfg.data.path  # a run may name other data (``--set data.path=...``)
    placement = load_placement(cfg.cluster.placement)
    if placement:
        check_tasks(placement, rt.ps_tasks)
    # the run's own wire precision (cluster.wire_dtype), which worker_runtime sets on the sync
    sync = HorovodSync(rt.sync.hvd, Wire(cfg.cluster.wire)) if isinstance(rt.sync, HorovodSync) else rt.sync
    rt = replace(rt, namespace=f"{rt.namespace}-{Path(out_file).stem}", placement=placement, sync=sync)
    run_dir = Path(out_file).parent / f"{Path(out_file).stem}-run"
    built = build_tables_once(cfg, load_schema(data), rt, str(run_dir))
    batches = list(make_dataset(data, "train", cfg.data, rank=rt.rank, size=rt.size).take(1 + STEPS))
    counts = run_step(built.step_fn, batches[0])
    from gmeta_tf.embedding.fused import fused_tables

    storage = built.model.storage_tables()
    requests = built.model.embeddings.requests
    served = requests.tables if requests is not None else []
    fused = [any(t is f for f in fused_tables(storage)) for t in storage]
    counts.update(tables=len(storage), ps=rt.ps_tasks, shards=[len(t.devices) for t in storage],
                  logical_tables=len(built.model.tables),
                  slots=slot_count(cfg.train.embedding_optimizer), init_rows=cfg.model.init_rows,
                  per_table_shards=[len(t.devices) for t in storage if not any(t is s for s in served)],
                  ps_requests=len({(d, t.dim) for t in served for d in t.devices}))
    counts["ps_holding_tables"] = len({d for t in storage for d in t.devices})
    recorded = sum(len(t.devices) for t, f in zip(storage, fused) if f and not any(t is s for s in served))
    counts["ps_rpcs_formula"] = expected_rpcs(counts["per_table_shards"], counts["slots"], cfg.model.init_rows,
                                              counts["ps_holding_tables"], counts["ps_requests"], recorded)
    counts["ps_hash_ops_formula"] = expected_hash_ops(counts["shards"], counts["slots"], fused)

    def finish() -> None:
        for batch in batches[1:]:
            built.step_fn.step(batch)
        if rt.rank == 0:
            built.model.embeddings.export(str(run_dir))
            counts["tables_after_steps"] = table_fingerprint(str(run_dir))
            Path(out_file).write_text(json.dumps(counts))
    return finish


def table_fingerprint(checkpoint_dir: str) -> Dict[str, List[float]]:
    """``{file key: [rows, sum of ids mod 2^31, sum of values, sum of values x row rank]}`` of
    every table and slot table ``Embeddings.export`` wrote (rows in id order): equal tables give
    equal fingerprints, to float rounding."""
    import numpy as np

    from gmeta_tf.embedding.table_files import read_table

    out = {}
    for f in sorted(Path(checkpoint_dir, "tables").glob("*.npz")):
        keys, values = read_table(checkpoint_dir, f.stem)
        order = np.argsort(keys)
        values = values[order].astype(np.float64).reshape(len(keys), -1)
        rank = np.arange(1, len(keys) + 1, dtype=np.float64)[:, None]
        out[f.stem] = [len(keys), float(np.sum(keys % (1 << 31))), float(values.sum()), float((values * rank).sum())]
    return out


def measure(data: str, ps: int = 2, runs: Mapping[str, Sequence[str]] = {"default": ()},  # noqa: B006
            timeout_s: float = 600) -> Dict[str, Dict]:
    """Start ``ps`` PS processes, then for each of ``runs`` (name -> ``--set`` overrides of the
    quickstart config) one worker; each run's RPC counts, by name."""
    from launch.local_cluster import LocalCluster

    cluster = LocalCluster(log=lambda m: None)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cluster.start_ps(ps)
            spec = Path(tmp) / "runs.json"
            spec.write_text(json.dumps({name: list(sets) for name, sets in runs.items()}))
            argv = [sys.executable, "-m", "bench.ps_rpcs", "worker", data, tmp, ",".join(cluster.ps_addresses),
                    str(spec)]
            code = cluster.run_workers(1, argv, timeout_s=timeout_s)
            if code != 0:
                lines = "\n".join(c for ch in cluster.children for c in ch.lines)
                raise RuntimeError(f"PS RPC worker failed ({code}):\n{lines[-3000:]}")
            return {name: json.loads((Path(tmp) / f"{name}.json").read_text()) for name in runs}
        finally:
            cluster.teardown()


def _sets(argv: List[str]) -> List[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]


def main(argv: List[str]) -> int:
    if len(argv) == 5 and argv[0] == "worker":  # measure's worker: DATA OUT_DIR PS RUNS_JSON
        _worker(argv[1], argv[2], argv[3], json.loads(Path(argv[4]).read_text()))
        return exit_codes.DONE.code
    if not argv or argv[0].startswith("-"):
        print("usage: python -m bench.ps_rpcs DATA [--ps N] [--set KEY=VALUE ...]", file=sys.stderr)
        return exit_codes.USER_ERROR.code
    ps = int(argv[argv.index("--ps") + 1]) if "--ps" in argv else 2
    print(json.dumps(measure(argv[0], ps, {"run": _sets(argv[1:])})["run"], indent=1))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
