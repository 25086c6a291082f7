"""The PS microbenchmark client: time one training step's lookup + update of a set of shards.

Runs as its own process (``python -m gmeta_tf.calibration.measure JOB.json OUT.jsonl``) because
connecting to a cluster rewires the whole TensorFlow eager context of a process; the driver
(``calibrate.py``) starts the PS and this client, and kills both when done.

It does what a worker does to its tables, with the trainer's own pieces:
``embedding.table.EmbeddingTable`` (named cuckoo tables on ``/job:ps/task:0``, ``bp_v2`` updates),
one ``DynamicEmbeddingOptimizer(Adam)`` per table (``embedding.optimizers.TableOptimizers``), one
unique lookup per table per step, all tables in one ``tf.function``. Tables are created one at a
time and waited for (concurrent creation has crashed PS processes). Ids come from
``access.IdSampler``: fresh draws every step, so cold ids are inserted as in training.

Tracing that step costs ~0.3-0.5 s per table on 2 cores (TFRA's optimizer graph), far more
than the step itself, so a job is a list of *configs* (the tables' dims: created and traced
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

    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [address]}), job_name="calib",
                                              make_master_device_default=False)
    with tf.device(PS_DEVICE):
        value = tf.constant(1) + 1
    int(value.numpy())


def _all_vars(tables, opts):
    return [v for t in tables for v in [t.variable, *t.slot_variables(opts.for_shadow(t.shadow))]]


def _create(dims: List[int], capacity: List[int], namespace: str):
    from tensorflow.python.eager import context

    from gmeta_tf.embedding.optimizers import TableOptimizers
    from gmeta_tf.embedding.table import EmbeddingTable

    tables, opts = [], TableOptimizers("adam", 1e-3)
    for k, (dim, rows) in enumerate(zip(dims, capacity)):
        t = EmbeddingTable(f"t{k}", int(dim), [PS_DEVICE], namespace, init_stddev=0.01, seed=k,
                           bp_v2=True, expected_rows=int(rows))
        opts.build({t.name: t.shadow})
        for var in _all_vars([t], opts):
            int(var.size(0).numpy())  # answered only after the PS has created it
        context.async_wait()
        tables.append(t)
    return tables, opts


def _batches(shards: List[Dict], samples_per_step: int, n: int, seed: int):
    import tensorflow as tf

    from gmeta_tf.plan.access import IdSampler, lookups_per_step

    per_table = []
    for k, sh in enumerate(shards):
        sampler = IdSampler(int(sh["rows"]), sh["skew"], seed=seed * 1000 + k)
        size = lookups_per_step(float(sh["pooling"]), samples_per_step)
        per_table.append([sampler.draw(size) for _ in range(n)])
    return [[tf.constant(per_table[k][i], tf.int64) for k in range(len(shards))] for i in range(n)]


def _step_fn(tables, opts):
    import tensorflow as tf

    shadows = [t.shadow for t in tables]
    spec = [tf.TensorSpec([None], tf.int64) for _ in tables]

    @tf.function(input_signature=[spec])
    def step(ids_list):
        with tf.GradientTape() as tape:
            loss = tf.constant(0.0)
            for t, ids in zip(tables, ids_list):
                looked = t.lookup_unique([ids])
                loss += tf.reduce_sum(tf.square(tf.gather(looked.rows, looked.index)))
        grads = tape.gradient(loss, shadows)
        opts.apply_gradients(zip(grads, shadows))
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

    def __init__(self, dims: List[int], namespace: str, capacity: Optional[List[int]] = None):
        """``capacity``: rows to pre-size each table for, as the trainer pre-sizes from the
        data's cardinality (``tables.initial_capacity``): a cuckoo table that grows mid-step
        rehashes, a cost training does not pay."""
        self.tables, self.opts = _create(dims, capacity or [DEFAULT_CAPACITY] * len(dims), namespace)
        self.step = _step_fn(self.tables, self.opts)

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
        for var in _all_vars(self.tables, self.opts):  # the next variant starts from empty tables
            var.clear()
        return {"index": v["index"], "ps_cpu_ms": cpu_ms, "wall_ms": float(np.median(wall)), "steps": n}


def main(job_path: str, out_path: str) -> None:
    """Pass 1 measures the configs in order; each further pass (``passes``) measures them all
    again in reverse order with fresh ids, reusing the traced steps. The driver keeps the
    lowest cost per variant: a burst of load from other processes can only add time, and two
    passes a minute apart are unlikely to both hit one."""
    import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)

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
        built.append(Config(c["dims"], f"calib{os.getpid()}c{i}", c.get("capacity")))
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
