"""Embedding tables at scale: resident bytes per row, local and on a PS, and ``model.max_rows``.

``python -m bench.table_scale [IDS ...] [--smoke]`` (default 1M and 10M ids) prints the JSON of
``measure_tables``. For each size N, one table as the trainer creates it (``create_tables`` +
its TFRA optimizer's slot tables, pre-sized for N rows as ``initial_capacity`` sizes it from the
data's cardinality), dim ``model.embedding_dim`` of the quickstart, the default embedding
optimizer (``train.embedding_optimizer``: Adam, 2 slot tables), N ids upserted in batches into
the table and each slot table; bytes per row = (RSS after - RSS before the tables existed) / N
of the process holding them:

* ``bytes_per_row``: a fresh process holding them itself (embedded mode);
* ``ps_bytes_per_row``: a real ``gmeta ps serve`` process (``LocalCluster.start_ps``, as
  ``gmeta launch local`` starts it) holding them, filled by a client connected as a worker is;

against ``floor_bytes_per_row`` = 8 B key + dim x 4 B x (1 + slots). What TFRA adds is its
cuckoo hash map (libcuckoo, ``lookup_table_op_cpu.h``): 2^hp buckets of 4 slots, hp the least
with 4 x 2^hp >= the pre-sized capacity, every bucket allocated (and touched) when the table is
created; a slot stores the key and the fixed-size value array inline plus a partial-hash byte
and an occupied flag, and every table carries min(2^hp, 65,536) 64-byte locks. ``cuckoo_model``
predicts the bytes from that; ``load_factor`` is rows / slots.

``eviction``: a counted table (``model.max_rows``: TFRA's frequency table beside the slots) of
``max_rows`` = N rows, created as ``DLRM`` creates it from data of 3N ids (``expected_rows``),
fed 3N distinct ids in rounds, ``Embeddings.evict`` after each (the trainer evicts after every
step): its size and the process's RSS after each round.

Every measurement runs in a process of its own, so TensorFlow's state and memory of one never
reaches another's figures.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Dict, List, Sequence

from bench.data import sizes_from_argv
from gmeta_tf import exit_codes

BATCH = 200_000  # ids per upsert: 12.8 MB of dim-16 rows, one request to the PS
SLOTS_PER_BUCKET = 4  # libcuckoo's LIBCUCKOO_DEFAULT_SLOT_PER_BUCKET
MAX_LOCKS = 1 << 16  # libcuckoo's kMaxNumLocks, each lock 64 bytes (LIBCUCKOO_ALIGNAS(64))
LOCK_BYTES = 64
EVICT_FACTOR = 3  # the eviction run feeds this many times max_rows distinct ids
EVICT_ROUNDS_PER_MAX = 4  # rounds per max_rows ids fed (each round's new ids: max_rows / 4)
SMOKE_IDS = 20_000
MB = 1 << 20


def quickstart() -> Dict:
    """The quickstart's embedding dim and the default embedding optimizer with its slot count."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.embedding.optimizers import slot_count

    cfg = load_config("configs/quickstart.yaml", [])
    kind = cfg.train.embedding_optimizer
    return {"dim": cfg.model.embedding_dim, "optimizer": kind, "slots": slot_count(kind),
            "lr": cfg.train.embedding_learning_rate}


def floor_bytes_per_row(dim: int, slots: int) -> int:
    """The bytes a row cannot do without: its int64 key and float32 value plus one slot each."""
    return 8 + dim * 4 * (1 + slots)


def _slot_bytes(value_bytes: int) -> int:
    """One libcuckoo slot of ``pair<int64, value>`` (8-byte aligned), its partial and occupied
    bytes (the bucket's ``partials_``, ``occupied_``) spread over the slot."""
    pair = 8 + -(-value_bytes // 8) * 8
    bucket = SLOTS_PER_BUCKET * pair + 2 * SLOTS_PER_BUCKET
    return -(-bucket // 8) * 8 // SLOTS_PER_BUCKET


def hashpower(capacity: int, rows: int = 0) -> int:
    """libcuckoo's ``reserve_calc`` for ``capacity``, doubled while ``rows`` would load it past
    ~95% (where its cuckoo insert gives up and the table doubles)."""
    buckets = -(-capacity // SLOTS_PER_BUCKET)
    hp = max(0, (buckets - 1).bit_length())
    while rows > 0.95 * SLOTS_PER_BUCKET * (1 << hp):
        hp += 1
    return hp


def cuckoo_model(rows: int, capacity: int, dim: int, slots: int, counted: bool = False) -> Dict[str, float]:
    """TFRA's bytes for ``rows`` rows in the table and its ``slots`` slot tables (and a counted
    table's int32 frequency table), each pre-sized for ``capacity``: bytes per row, the slots'
    load factor and the per-table hash power."""
    hp = hashpower(capacity, rows)
    n_slots = SLOTS_PER_BUCKET * (1 << hp)
    locks = min(1 << hp, MAX_LOCKS) * LOCK_BYTES
    tables = [dim * 4] * (1 + slots) + ([4] if counted else [])
    total = sum(n_slots * _slot_bytes(v) + locks for v in tables)
    return {"model_bytes_per_row": total / max(rows, 1), "load_factor": rows / n_slots, "hashpower": hp,
            "slot_bytes": _slot_bytes(dim * 4)}


# -- one process's measurement (run as ``python -m bench.table_scale fill ...``) -----------------

def _rss(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss


def _ids(start: int, stop: int):
    """Distinct int64 ids spread over the key space (a multiplicative hash of the positions: no
    two alike), as real item ids are, rather than 0..N."""
    import numpy as np

    return (np.arange(start, stop, dtype=np.int64) * np.int64(0x9E3779B97F4A7C15 & ((1 << 62) - 1))) & ((1 << 62) - 1)


def _create(ps_tasks: int, dim: int, kind: str, lr: float, expected: int, counted: bool, namespace: str):
    from gmeta_tf.embedding.collection import Embeddings, create_tables
    from gmeta_tf.embedding.optimizers import TableOptimizers

    (table,) = create_tables(["item"], dim, namespace=namespace, ps_tasks=ps_tasks, placement={}, init_stddev=0.01,
                             seed=0, bp_v2=ps_tasks > 0, expected_rows={"item": expected},
                             counted=["item"] if counted else [])
    emb = Embeddings([table], ["item"], [], ps_requests="per_table")
    opts = TableOptimizers(kind, lr)
    emb.build_slots(opts)
    emb.wait_until_created()
    return emb, table, table.variables(opts.for_shadow(table.shadow))


def _upsert(variables, table, start: int, stop: int, dim: int, counts: bool) -> None:
    import tensorflow as tf

    for lo in range(start, stop, BATCH):
        hi = min(stop, lo + BATCH)
        keys = tf.constant(_ids(lo, hi))
        rows = tf.fill([hi - lo, dim], 0.01)
        for var in variables:
            var.upsert(keys, rows)
        if counts:  # the optimizer's apply counts each id's updates (FrequencyRestrictPolicy)
            table.frequency.upsert(keys, tf.ones([hi - lo, 1], tf.int32))


def _settle(variables) -> None:
    """Wait until every enqueued op has run where the tables live (remote ops are asynchronous)."""
    from tensorflow.python.eager import context

    for var in variables:
        for shard in range(len(var.devices)):
            int(var.size(shard).numpy())
    context.async_wait()


def _warm_up(ps_tasks: int, q: Dict) -> None:
    """A small table set created and written first, so the figures hold the rows, not the
    kernels, optimizer objects and allocator pools a first table brings."""
    _, table, variables = _create(ps_tasks, q["dim"], q["optimizer"], q["lr"], 1, False, "tscale-warm")
    _upsert(variables, table, 0, 1000, q["dim"], counts=False)
    _settle(variables)


def fill(n: int, pid: int = 0, address: str = "") -> Dict:
    """N ids into the table and its slot tables, held here (``address`` empty) or on the PS at
    ``address`` (process ``pid``); RSS of the holder before the tables, after creating them (the
    pre-sized, touched buckets) and after the inserts."""
    import os

    q = quickstart()
    if address:
        from gmeta_tf.calibration.measure import _connect

        _connect(address)
    import gmeta_tf  # noqa: F401

    holder = pid or os.getpid()
    _warm_up(1 if address else 0, q)
    rss0 = _rss(holder)
    t0 = time.perf_counter()
    _, table, variables = _create(1 if address else 0, q["dim"], q["optimizer"], q["lr"], n, False, "tscale")
    _settle(variables)
    rss1 = _rss(holder)
    _upsert(variables, table, 0, n, q["dim"], counts=False)
    _settle(variables)
    rss2 = _rss(holder)
    return {"ids": n, "rows": table.size(), "slot_rows": [int(v.size().numpy()) for v in variables[1:]],
            "rss_before_mb": rss0 / MB, "rss_created_mb": rss1 / MB, "rss_after_mb": rss2 / MB,
            "bytes_per_row": (rss2 - rss0) / n, "created_bytes_per_row": (rss1 - rss0) / n,
            "insert_bytes_per_row": (rss2 - rss1) / n, "seconds": time.perf_counter() - t0,
            "init_size": int(table.variable.init_size)}


def evict(max_rows: int) -> Dict:
    """A counted table bounded to ``max_rows``, created as ``DLRM`` creates it for data of
    ``EVICT_FACTOR`` x max_rows ids, fed those ids in rounds with an eviction after each."""
    import os

    from gmeta_tf.embedding.table import expected_table_rows

    q = quickstart()
    total = EVICT_FACTOR * max_rows
    step = max(1, max_rows // EVICT_ROUNDS_PER_MAX)
    _warm_up(0, q)
    rss0 = _rss(os.getpid())
    emb, table, variables = _create(0, q["dim"], q["optimizer"], q["lr"], expected_table_rows(total, max_rows),
                                    True, "tscale-evict")
    rounds: List[Dict] = []
    t0 = time.perf_counter()
    for lo in range(0, total, step):
        hi = min(total, lo + step)
        _upsert(variables, table, lo, hi, q["dim"], counts=True)
        removed = emb.evict({"item": max_rows})["item"]
        rounds.append({"ids_fed": hi, "rows": table.size(), "removed": removed,
                       "rss_mb": (_rss(os.getpid()) - rss0) / MB})
    at_max = next(r for r in rounds if r["ids_fed"] >= max_rows)
    sizes = [table.size(), *[int(v.size().numpy()) for v in variables[1:]], int(table.frequency.size().numpy())]
    return {"max_rows": max_rows, "ids_fed": total, "rounds": len(rounds),
            "rows_max": max(r["rows"] for r in rounds), "rows_after": sizes,
            "rss_mb_at_max_rows": at_max["rss_mb"], "rss_mb_end": rounds[-1]["rss_mb"],
            "rss_growth_after_max_rows": rounds[-1]["rss_mb"] / max(at_max["rss_mb"], 1e-9),
            "bytes_per_kept_row": rounds[-1]["rss_mb"] * MB / max_rows,
            "init_size": int(table.variable.init_size), "seconds": time.perf_counter() - t0,
            "by_round": rounds}


# -- the driver ----------------------------------------------------------------------------------

def _run(args: Sequence[str], timeout_s: float) -> Dict:
    """``python -m bench.table_scale ARGS`` in a fresh process; its last stdout line is JSON."""
    proc = subprocess.run([sys.executable, "-m", "bench.table_scale", *args], capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.table_scale {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _on_ps(n: int, timeout_s: float) -> Dict:
    """``fill`` with the tables on one real PS process, filled by a client process."""
    from launch.local_cluster import LocalCluster

    cluster = LocalCluster(log=lambda m: None)
    try:
        cluster.start_ps(1)
        pid = cluster.children[0].proc.pid
        return _run(["fill", str(n), "--ps", cluster.ps_addresses[0], "--pid", str(pid)], timeout_s)
    finally:
        cluster.teardown()


def measure_tables(ids_list: Sequence[int] = (1_000_000, 10_000_000), smoke: bool = False,
                   log=print) -> Dict:
    """``{"table": {ids: {...}}, "eviction": {ids: {...}}, "config": {...}}``; ``smoke``: 20,000
    ids only (seconds)."""
    from gmeta_tf.embedding.table import initial_capacity

    ids_list = (SMOKE_IDS,) if smoke else tuple(ids_list)
    q = quickstart()
    floor = floor_bytes_per_row(q["dim"], q["slots"])
    out: Dict = {"config": {**q, "batch": BATCH}, "table": {}, "eviction": {}}
    for n in ids_list:
        timeout = 600 + n / 5_000  # generous: the lead's 10M run on a loaded box
        local = _run(["fill", str(n)], timeout)
        log(f"[table_scale] {n:,} ids, local: {local['bytes_per_row']:.0f} B/row (floor {floor})")
        ps = _on_ps(n, timeout)
        log(f"[table_scale] {n:,} ids, PS: {ps['bytes_per_row']:.0f} B/row")
        model = cuckoo_model(n, local["init_size"], q["dim"], q["slots"])
        out["table"][str(n)] = {
            "bytes_per_row": local["bytes_per_row"], "floor_bytes_per_row": floor,
            "ps_bytes_per_row": ps["bytes_per_row"],
            "over_floor": local["bytes_per_row"] / floor, "ps_over_floor": ps["bytes_per_row"] / floor,
            "tfra_model_bytes_per_row": model["model_bytes_per_row"], "load_factor": model["load_factor"],
            "hashpower": model["hashpower"], "slot_bytes": model["slot_bytes"],
            "created_bytes_per_row": local["created_bytes_per_row"],
            "ps_created_bytes_per_row": ps["created_bytes_per_row"],
            "rows": local["rows"], "ps_rows": ps["rows"], "init_size": local["init_size"],
            "seconds": local["seconds"], "ps_seconds": ps["seconds"]}
        ev = _run(["evict", str(n)], timeout * EVICT_FACTOR)
        log(f"[table_scale] max_rows {n:,}, {ev['ids_fed']:,} ids fed: at most {ev['rows_max']:,} rows, "
            f"RSS x{ev['rss_growth_after_max_rows']:.2f} after max_rows")
        ev["tfra_model_bytes_per_row"] = cuckoo_model(n, ev["init_size"], q["dim"], q["slots"],
                                                      counted=True)["model_bytes_per_row"]
        # what the same table held before DLRM pre-sized bounded tables for max_rows, not the data
        ev["tfra_model_bytes_per_row_sized_for_data"] = cuckoo_model(
            n, initial_capacity(EVICT_FACTOR * n), q["dim"], q["slots"], counted=True)["model_bytes_per_row"]
        out["eviction"][str(n)] = ev
    return out


def main(argv: List[str]) -> int:
    if argv and argv[0] == "fill":
        opt = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1, 2)}
        print(json.dumps(fill(int(argv[1]), int(opt.get("--pid", 0)), opt.get("--ps", ""))))
        return exit_codes.DONE.code
    if argv and argv[0] == "evict":
        print(json.dumps(evict(int(argv[1]))))
        return exit_codes.DONE.code
    smoke, ids = sizes_from_argv(argv, [1_000_000, 10_000_000])
    print(json.dumps(measure_tables(ids, smoke=smoke), indent=1))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
