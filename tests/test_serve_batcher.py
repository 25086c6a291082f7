"""The serve micro-batcher and the batch groups it relies on (no TensorFlow, no server)."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from gmeta_tf.serve.batcher import BatchingConfig, MicroBatcher, batchable
from gmeta_tf.serve.signatures import Signature, TensorInfo, batch_groups

pytestmark = pytest.mark.fast


def _t(name, shape, dtype=np.int64):
    return TensorInfo(name=name, dtype=np.dtype(dtype), shape=shape)


def _sig(name, inputs):
    inputs = {t.name: t for t in inputs}
    return Signature(name=name, inputs=inputs, outputs={"score": _t("score", (None,), np.float32)},
                     batch_groups=batch_groups(inputs))


PREDICT = _sig("predict", [_t("user", (None,)), _t("item", (None,)), _t("genres", (None, 3)),
                           _t("dense", (None, 4), np.float32)])
ADAPT = _sig("adapt_and_predict", [_t("support_user", (None,)), _t("support_label", (None,), np.float32),
                                   _t("query_user", (None,)), _t("query_dense", (None, 4), np.float32)])


def test_batch_groups_from_names():
    assert PREDICT.batch_groups == {"": ("dense", "genres", "item", "user")}
    assert ADAPT.batch_groups == {"query": ("query_dense", "query_user"),
                                  "support": ("support_label", "support_user")}
    assert batchable(PREDICT) and not batchable(ADAPT)


class _Recorder:
    """A model stand-in: score = 10 * user + item; user < 0 is an error, as a kernel would raise."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, arrays):
        with self.lock:
            self.calls.append(len(arrays["user"]))
        if (arrays["user"] < 0).any():
            raise ValueError("negative user id")
        return {"score": (10 * arrays["user"] + arrays["item"]).astype(np.float32)}


def _request(i):
    n = 1 + i % 3
    return {"user": np.arange(n, dtype=np.int64) + 100 * i, "item": np.full(n, i, dtype=np.int64)}


def _run(batcher, requests):
    async def main():
        return await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)

    return asyncio.run(main())


def test_concurrent_requests_are_merged_and_split_back():
    model = _Recorder()
    requests = [_request(i) for i in range(12)]
    answers = _run(MicroBatcher(model, BatchingConfig(max_batch_size=64, max_latency_ms=200)), requests)
    for r, a in zip(requests, answers):
        np.testing.assert_array_equal(a["score"], 10 * r["user"] + r["item"])
    assert sum(model.calls) == sum(len(r["user"]) for r in requests)
    assert len(model.calls) < len(requests)  # merged: fewer model calls than requests


def test_max_batch_size_bounds_each_call():
    model = _Recorder()
    requests = [_request(i) for i in range(12)]
    _run(MicroBatcher(model, BatchingConfig(max_batch_size=4, max_latency_ms=200)), requests)
    # a call closes once it holds >= 4 rows; requests have at most 3 rows, so no call exceeds 4 + 2
    assert max(model.calls) <= 6 and len(model.calls) >= 24 // 6


def test_an_error_reaches_only_the_request_that_caused_it():
    model = _Recorder()
    requests = [_request(i) for i in range(6)]
    requests[3] = {"user": np.array([-1], dtype=np.int64), "item": np.array([0], dtype=np.int64)}
    answers = _run(MicroBatcher(model, BatchingConfig(max_batch_size=64, max_latency_ms=200)), requests)
    assert isinstance(answers[3], ValueError)
    for i, (r, a) in enumerate(zip(requests, answers)):
        if i != 3:
            np.testing.assert_array_equal(a["score"], 10 * r["user"] + r["item"])
