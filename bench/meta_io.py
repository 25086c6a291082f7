"""How fast Meta-IO can feed the trainer, measured without a model in the way.

The reader has to stay well ahead of the meta step (target: >= 3x what a step consumes), so
this iterates the training pipeline as fast as possible and reports tasks and real (unpadded)
samples per second. The first batch is excluded: it pays for file opening, pipeline start-up
and filling the shuffle buffer, which a long training run pays once.
"""
from __future__ import annotations

import time

import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from gmeta_tf.config.schema import DataConfig
from gmeta_tf.metaio.reader import make_dataset


def measure_read_rate(path: str, cfg: DataConfig, split: str = "train", seconds: float = 5.0) -> dict:
    ds = make_dataset(path, split, cfg, training=True)
    it = iter(ds)
    next(it)  # warm-up
    batches = 0
    samples = 0.0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        b = next(it)
        batches += 1
        # masks are tiny; summing them costs far less than producing the batch
        samples += float(b["support"]["mask"].numpy().sum() + b["query"]["mask"].numpy().sum())
        now = time.perf_counter()
        if now >= deadline:
            break
    elapsed = now - start
    return {
        "tasks_per_s": batches * cfg.tasks_per_batch / elapsed,
        "samples_per_s": samples / elapsed,
        "batches": batches,
    }


def write_synthetic(path: str, tasks: int = 4096, shards: int = 4, seed: int = 0, dense: int = 4,
                    categorical: int = 4, multi_hot: int = 2, support=(8, 48), query=(4, 24),
                    rows_per_group: int = 512) -> str:
    """A task-major dataset written straight from the format contract (``gmeta_tf.data.format``).

    Lets the reader be benchmarked on its own, without ``prepare``; values are random but the
    shapes (variable support/query sizes, variable multi-hot lengths) are realistic.
    """
    import json
    import os

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gmeta_tf.data import format as fmt

    rng = np.random.default_rng(seed)

    def lists(lengths, values):
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), values)

    cats = [f"c{i}" for i in range(categorical)]
    multis = [f"m{i}" for i in range(multi_hot)]
    splits = {}
    os.makedirs(os.path.join(path, "train"), exist_ok=True)
    per = np.array_split(np.arange(tasks), shards)
    names = []
    for s, ids in enumerate(per):
        n = len(ids)
        cols = {fmt.TASK_ID: pa.array([str(i) for i in ids])}
        for which, (lo, hi) in (("support", support), ("query", query)):
            ln = rng.integers(lo, hi + 1, size=n)
            tot = int(ln.sum())
            cols[fmt.label_col(which)] = lists(ln, pa.array(rng.integers(0, 2, tot).astype(np.float32)))
            if dense:
                rows = lists(np.full(tot, dense), pa.array(rng.normal(size=tot * dense).astype(np.float32)))
                cols[fmt.dense_col(which)] = lists(ln, rows)
            for c in cats:
                cols[fmt.cat_col(which, c)] = lists(ln, pa.array(rng.integers(0, 10_000, tot)))
            for m in multis:
                k = rng.integers(0, 12, size=tot)
                inner = lists(k, pa.array(rng.integers(0, 5_000, int(k.sum()))))
                cols[fmt.multi_col(which, m)] = lists(ln, inner)
        name = fmt.part_name(s, shards)
        pq.write_table(pa.table(cols), os.path.join(path, "train", name), row_group_size=rows_per_group)
        names.append(f"train/{name}")
    splits["train"] = {"tasks": tasks, "samples": 0, "files": names}
    schema = {
        "format_version": fmt.FORMAT_VERSION,
        "task_col": "user", "label": {"name": "click", "kind": "click"}, "time_col": None,
        "categorical": [{"name": c, "cardinality": 10_000, "hashed": False, "pooling": 1.0} for c in cats],
        "multi_hot": [{"name": m, "cardinality": 5_000, "hashed": False, "pooling": 5.5, "max_len": 11}
                      for m in multis],
        "dense": [{"name": f"d{i}", "mean": 0.0, "std": 1.0} for i in range(dense)],
        "label_stats": {"mean": 0.5, "std": 0.5},
        "support_query": {"query": query[1], "max_support": support[1], "split_by": "random"},
        "splits": splits,
    }
    with open(os.path.join(path, fmt.SCHEMA_FILE), "w") as f:
        json.dump(schema, f)
    return path


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic(tmp, tasks=int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
        print(measure_read_rate(tmp, DataConfig(tasks_per_batch=32, support=16, query=16)))
