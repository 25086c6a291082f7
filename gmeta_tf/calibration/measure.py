"""The PS microbenchmark client: time one training step's lookup + update of a set of shards.

Runs as its own process (``python -m gmeta_tf.calibration.measure JOB.json OUT.jsonl``) because
connecting to a cluster rewires the whole TensorFlow eager context of a process; the driver
(``calibrate.py``) starts the PS and this client, and kills both when done.

It does what a worker does to its tables, with the trainer's own pieces and layout
(``embedding.collection``): the tables of one dim fused into one TFRA table
(``model.fuse_tables: auto``; named cuckoo tables on ``/job:ps/task:0``, ``bp_v2`` updates), one
request per PS for the lookups and one for the Adam updates (``model.ps_requests: auto`` with PS
tables), all tables in one ``tf.function``. Tables are created, then waited for. Ids come from
``access.IdSampler``: fresh draws every step, so cold ids are inserted as in training.

Tracing that step costs a good part of a second on 2 cores, far more than the step itself, so a job is a list of *configs* (the tables' dims: created and traced
once) each with *variants* (rows, pooling, skew, samples per step: only the ids change; the
tables are cleared between variants). Per variant (``measure_config``): the PS process's CPU
milliseconds per step and the client's median wall milliseconds per step, appended to OUT as
one JSON line at once.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Dict, List, Optional

import numpy as np

from gmeta_tf.embedding.devices import ps_device

PS_DEVICE = ps_device(0)
DEFAULT_CAPACITY = 1 << 14  # rows a table is pre-sized for when the job gives no ``capacity``


def _connect(address: str) -> None:
    import tensorflow as tf

    from gmeta_tf.cluster.worker import own_job

    # GMETA_WORKER_ADDRESS (``calibrate --network``: the client on its own emulated host): the
    # address the PS reaches this client at, instead of TF's ``localhost``
    own = own_job(0)
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [address], **own}),
                                              job_name=next(iter(own), "calib"), make_master_device_default=False)
    with tf.device(PS_DEVICE):
        value = tf.constant(1) + 1
    int(value.numpy())


def _all_vars(emb, opts):
    return [v for t in emb.storage() for v in t.variables(opts.for_shadow(t.shadow))]


def _create(dims: List[int], capacity: List[int], namespace: str, fuse: bool = True):
    """The tables as a worker lays them out on one PS: the tables of one dim are the members of
    one fused table (``model.fuse_tables: auto``; ``embedding.collection.create_tables``; ``fuse``
    false: one TFRA table each), and the step reaches the PS with one request
    (``model.ps_requests: auto`` with PS tables)."""
    from gmeta_tf.embedding.collection import Embeddings, create_tables
    from gmeta_tf.embedding.optimizers import TableOptimizers

    names, tables = [f"t{k}" for k in range(len(dims))], [None] * len(dims)
    for dim in sorted(set(dims)):
        ks = [k for k, d in enumerate(dims) if d == dim]
        made = create_tables([names[k] for k in ks], int(dim), namespace=namespace, ps_tasks=1, placement={},
                             init_stddev=0.01, seed=ks[0], bp_v2=True,
                             expected_rows={names[k]: int(capacity[k]) for k in ks}, fuse=fuse)
        for k, t in zip(ks, made):
            tables[k] = t
    emb = Embeddings(tables, names, [], ps_requests="per_ps")
    opts = TableOptimizers("adam", 1e-3)
    emb.build_slots(opts)
    emb.wait_until_created()  # answered only after the PS has created them
    return emb, opts


def _batches(shards: List[Dict], samples_per_step: int, n: int, seed: int):
    import tensorflow as tf

    from gmeta_tf.plan.access import IdSampler, lookups_per_step

    per_table = []
    for k, sh in enumerate(shards):
        sampler = IdSampler(int(sh["rows"]), sh["skew"], seed=seed * 1000 + k)
        size = lookups_per_step(float(sh["pooling"]), samples_per_step)
        per_table.append([sampler.draw(size) for _ in range(n)])
    return [[tf.constant(per_table[k][i], tf.int64) for k in range(len(shards))] for i in range(n)]


def _step_fn(emb):
    import tensorflow as tf

    from gmeta_tf.embedding.lookup import together

    spec = [tf.TensorSpec([None], tf.int64) for _ in emb.tables]
    rows = emb.trainable()

    @tf.function(input_signature=[spec], autograph=False)
    def step(ids_list):
        with tf.GradientTape() as tape:
            looked = together(emb.tables, [[ids] for ids in ids_list], True, emb.requests)
            loss = tf.add_n([tf.reduce_sum(tf.square(tf.gather(x.rows, x.index))) for x in looked.values()])
        emb.apply(rows, tape.gradient(loss, rows.shadows))
        return loss

    return step


def ps_cpu_ns(pid: int) -> int:
    """CPU time (ns) the PS process has run so far: the sum over its threads' schedstat."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just exited
            continue
    return total


class Config:
    """One table set on the PS: its tables, created and traced once, measured per variant."""

    def __init__(self, dims: List[int], namespace: str, capacity: Optional[List[int]] = None, fuse: bool = True):
        """``capacity``: rows to pre-size each table for, as the trainer pre-sizes from the
        data's cardinality (``tables.initial_capacity``): a cuckoo table that grows mid-step
        rehashes, a cost training does not pay."""
        self.emb, self.opts = _create(dims, capacity or [DEFAULT_CAPACITY] * len(dims), namespace, fuse)
        self.step = _step_fn(self.emb)

    def measure(self, v: Dict, job: Dict, seed: int) -> Dict:
        """One variant: after ``warmup`` untimed steps, the CPU time the PS process spent per
        step (``ps_cpu_ms``: the PS's own lookup + update work, what the PS contributes to a
        step, and what other processes' load disturbs least) and the client's median wall time
        per step (``wall_ms``). At least ``steps`` steps and ``min_seconds`` of wall time (CPU
        time needs enough of it to resolve), at most ``max_steps``. Tables are emptied after."""
        pid, warmup, min_steps = int(job["ps_pid"]), int(job["warmup"]), int(job["steps"])
        sps = int(v["samples_per_step"])
        warm_ms = []
        for ids in _batches(v["shards"], sps, warmup, seed):
            t0 = time.perf_counter()
            float(self.step(ids).numpy())
            warm_ms.append((time.perf_counter() - t0) * 1000)
        guess = max(min(warm_ms[1:]), 0.5) if len(warm_ms) > 1 else 50.0
        n = int(np.clip(np.ceil(float(job["min_seconds"]) * 1000 / guess), min_steps, int(job["max_steps"])))
        batches = _batches(v["shards"], sps, n, seed + 7919)
        wall = []
        cpu0 = ps_cpu_ns(pid)
        for ids in batches:
            t0 = time.perf_counter()
            float(self.step(ids).numpy())
            wall.append((time.perf_counter() - t0) * 1000)
        cpu_ms = (ps_cpu_ns(pid) - cpu0) / 1e6 / n
        for var in _all_vars(self.emb, self.opts):  # the next variant starts from empty tables
            var.clear()
        return {"index": v["index"], "ps_cpu_ms": cpu_ms, "wall_ms": float(np.median(wall)), "steps": n}


def main(job_path: str, out_path: str) -> None:
    """Pass 1 measures the configs in order; each further pass (``passes``) measures them all
    again in reverse order with fresh ids, reusing the traced steps. The driver keeps the
    lowest cost per variant: a burst of load from other processes can only add time, and two
    passes a minute apart are unlikely to both hit one."""

    with open(job_path) as f:
        job = json.load(f)
    _connect(job["ps"])

    def emit(record):
        with open(out_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    # The first config pays one-off costs (remote function registration): warm up on a tiny one.
    tiny = {"index": -1, "samples_per_step": 64, "shards": [{"rows": 100, "pooling": 1.0, "skew": [1.0] + [0.0] * 16}]}
    Config([8], f"calib{os.getpid()}w").measure(tiny, {**job, "warmup": 2, "steps": 1, "min_seconds": 0}, 0)
    built = []
    for i, c in enumerate(job["configs"]):
        built.append(Config(c["dims"], f"calib{os.getpid()}c{i}", c.get("capacity"), c.get("fuse", True)))
        for v in c["variants"]:
            emit({**built[-1].measure(v, job, int(v.get("seed", 0))), "pass": 0})
    for p in range(1, int(job.get("passes", 1))):
        for c, cfg in reversed(list(zip(job["configs"], built))):
            for v in c["variants"]:
                emit({**cfg.measure(v, job, int(v.get("seed", 0)) + 1_000_003 * p), "pass": p})


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m gmeta_tf.calibration.measure JOB.json OUT.jsonl")
    main(sys.argv[1], sys.argv[2])
