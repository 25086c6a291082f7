"""The serve micro-batcher and the batch groups it relies on (no TensorFlow, no server)."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from gmeta_tf.serve.batcher import BatchingConfig, MicroBatcher, batchable, merge, not_batchable
from gmeta_tf.serve.signatures import Signature, TensorInfo

pytestmark = pytest.mark.fast


def _t(name, shape, dtype=np.int64, group=None, pad=None):
    return TensorInfo(name=name, dtype=np.dtype(dtype), shape=shape, group=group, pad=pad)


def _sig(name, inputs, output_group=None):
    return Signature(name=name, inputs={t.name: t for t in inputs},
                     outputs={"score": _t("score", (None,), np.float32)}, output_group=output_group)


# The quickstart export's predict: item_* and user_* are one sample's features, declared one group.
PREDICT = _sig("predict", [_t(n, (None,), group="samples") for n in ("item_id", "user_city", "user_segment")]
               + [_t("item_tags", (None, None), group="samples", pad=-1),
                  _t("dense", (None, 3), np.float32, group="samples")], output_group="samples")
ADAPT = _sig("adapt_and_predict", [_t("support_item_id", (None,), group="support"),
                                   _t("support_label", (None,), np.float32, group="support"),
                                   _t("query_item_id", (None,), group="query"),
                                   _t("query_dense", (None, 4), np.float32, group="query")], output_group="query")
UNDECLARED = _sig("predict", [_t("user", (None,)), _t("item", (None,))])


def test_batch_groups_are_what_the_export_declares():
    assert PREDICT.batch_groups == {"samples": ("dense", "item_id", "item_tags", "user_city", "user_segment")}
    assert ADAPT.batch_groups == {"query": ("query_dense", "query_item_id"),
                                  "support": ("support_item_id", "support_label")}
    assert UNDECLARED.batch_groups == {} and not UNDECLARED.declared
    assert batchable(PREDICT) and not batchable(ADAPT) and not batchable(UNDECLARED)
    assert "2 batch groups (query, support)" in not_batchable(ADAPT)
    assert "does not declare which inputs share" in not_batchable(UNDECLARED)
    no_output_group = _sig("predict", list(PREDICT.inputs.values()))
    assert "outputs follow" in not_batchable(no_output_group)


def test_merge_pads_lists_with_the_declared_value():
    a = {"item_id": np.array([1]), "item_tags": np.array([[4, 5, 6]])}
    b = {"item_id": np.array([2, 3]), "item_tags": np.array([[7], [8]])}
    merged = merge([a, b], PREDICT)
    np.testing.assert_array_equal(merged["item_tags"], [[4, 5, 6], [7, -1, -1], [8, -1, -1]])
    np.testing.assert_array_equal(merged["item_id"], [1, 2, 3])
    with pytest.raises(ValueError):  # no declared pad: shapes must agree (the batcher then runs each alone)
        merge([{"dense": np.zeros((1, 3))}, {"dense": np.zeros((1, 4))}], PREDICT)


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
    answers = _run(MicroBatcher(model, BatchingConfig(max_batch_size=64, max_latency_ms=200), UNDECLARED), requests)
    for r, a in zip(requests, answers):
        np.testing.assert_array_equal(a["score"], 10 * r["user"] + r["item"])
    assert sum(model.calls) == sum(len(r["user"]) for r in requests)
    assert len(model.calls) < len(requests)  # merged: fewer model calls than requests


def test_max_batch_size_bounds_each_call():
    model = _Recorder()
    requests = [_request(i) for i in range(12)]
    _run(MicroBatcher(model, BatchingConfig(max_batch_size=4, max_latency_ms=200), UNDECLARED), requests)
    # a call closes once it holds >= 4 rows; requests have at most 3 rows, so no call exceeds 4 + 2
    assert max(model.calls) <= 6 and len(model.calls) >= 24 // 6


def test_an_error_reaches_only_the_request_that_caused_it():
    model = _Recorder()
    requests = [_request(i) for i in range(6)]
    requests[3] = {"user": np.array([-1], dtype=np.int64), "item": np.array([0], dtype=np.int64)}
    answers = _run(MicroBatcher(model, BatchingConfig(max_batch_size=64, max_latency_ms=200), UNDECLARED), requests)
    assert isinstance(answers[3], ValueError)
    for i, (r, a) in enumerate(zip(requests, answers)):
        if i != 3:
            np.testing.assert_array_equal(a["score"], 10 * r["user"] + r["item"])


def test_a_cancelled_request_leaves_the_queue_unscored():
    """A request whose client hung up (its task cancelled, see ``request_body``) while it waited
    for a merged call is dropped: its rows are never scored, its batch-mates are answered."""
    released = threading.Event()
    users = []

    def model(arrays):
        users.append(arrays["user"].tolist())
        released.wait(10)
        return {"score": (10 * arrays["user"] + arrays["item"]).astype(np.float32)}

    batcher = MicroBatcher(model, BatchingConfig(max_batch_size=64, max_latency_ms=50, max_inflight=1), UNDECLARED)
    requests = [_request(i) for i in range(4)]

    async def main():
        first = asyncio.ensure_future(batcher.submit(requests[0]))
        while not users:  # the model is busy with the first request: the others queue behind it
            await asyncio.sleep(0.005)
        queued = [asyncio.ensure_future(batcher.submit(r)) for r in requests[1:]]
        await asyncio.sleep(0.05)
        queued[0].cancel()
        queued[2].cancel()
        await asyncio.sleep(0.01)
        released.set()
        return await asyncio.gather(first, *queued, return_exceptions=True)

    answers = asyncio.run(main())
    assert isinstance(answers[1], asyncio.CancelledError) and isinstance(answers[3], asyncio.CancelledError)
    for i in (0, 2):
        np.testing.assert_array_equal(answers[i]["score"], 10 * requests[i]["user"] + requests[i]["item"])
    assert users == [requests[0]["user"].tolist(), requests[2]["user"].tolist()]  # 1 and 3 never reach the model
