"""Tiny in-memory schema + task batches for unit tests of the model and meta step (no files)."""
import numpy as np
import tensorflow as tf


def tiny_schema(kind="click", n_dense=2):
    return {
        "format_version": 1,
        "label": {"name": "y", "kind": kind},
        "categorical": [{"name": "item", "cardinality": 50}, {"name": "city", "cardinality": 5}],
        "multi_hot": [{"name": "tags", "cardinality": 20, "max_len": 3}],
        "dense": [{"name": f"d{i}", "mean": 0.0, "std": 1.0} for i in range(n_dense)],
        "label_stats": {"mean": 3.0, "std": 1.0},
    }


def random_batch(schema, T=4, S=5, Q=3, L=3, seed=0, pad_tasks=0):
    rng = np.random.default_rng(seed)

    def part(n):
        mask = np.ones((T, n), np.float32)
        for t in range(T):
            mask[t, rng.integers(1, n + 1):] = 0.0  # tasks of different sizes
        cat = {}
        for c in schema["categorical"]:
            ids = rng.integers(0, c["cardinality"], size=(T, n)).astype(np.int64)
            cat[c["name"]] = np.where(mask > 0, ids, -1)
        multi = {}
        for c in schema["multi_hot"]:
            ids = rng.integers(0, c["cardinality"], size=(T, n, L)).astype(np.int64)
            ids[rng.random((T, n, L)) < 0.3] = -1
            multi[c["name"]] = np.where(mask[..., None] > 0, ids, -1)
        if schema["label"]["kind"] == "click":
            label = (rng.random((T, n)) < 0.4).astype(np.float32)
        else:
            label = rng.integers(1, 6, size=(T, n)).astype(np.float32)
        return {
            "label": tf.constant(label * mask), "mask": tf.constant(mask),
            "dense": tf.constant(rng.normal(size=(T, n, len(schema["dense"]))).astype(np.float32)),
            "cat": {k: tf.constant(v) for k, v in cat.items()},
            "multi": {k: tf.constant(v) for k, v in multi.items()},
        }

    task_mask = np.ones(T, np.float32)
    if pad_tasks:
        task_mask[-pad_tasks:] = 0.0
    return {"task_id": tf.constant([f"t{i}" for i in range(T)]), "task_mask": tf.constant(task_mask),
            "support": part(S), "query": part(Q)}
