"""`gmeta serve` over real HTTP: started server processes, v1 (rows and columns) and v2, health,
every class of bad request answered 400 naming the input (and the row, for a value), one log line
per client error, micro-batching of ``predict``, and the server still serving after each.

The models are real `gmeta export`s (``serve_fixture.RUNS``, trained once per session): the
quickstart model on click data (its features ``item_id``, ``item_category``, ``user_city``,
``user_segment``, ``device``, ``hour``, ``item_tags``, ``dense``) and the MovieLens inner loop on
rating data; plus one stock SavedModel that is not a gmeta export (``build_model``). Responses are
compared with the same SavedModel called in this process.
"""
from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from serve_fixture import (
    REPO,
    build_model,
    example_inputs,
    export_inputs,
    free_port,
    request,
    server_process,
)

pytestmark = pytest.mark.integration

NAME = "recs"
V1 = f"/v1/models/{NAME}:predict"
V2 = f"/v2/models/{NAME}/infer"
QUICKSTART_INPUTS = ["dense", "device", "hour", "item_category", "item_id", "item_tags", "user_city", "user_segment"]


@pytest.fixture(scope="module")
def click(exported_model):
    return exported_model("click_top_sgd")[1:]  # (export dir, export.json)


@pytest.fixture(scope="module")
def rating(exported_model):
    return exported_model("rating_newton")[1:]


@pytest.fixture(scope="module")
def reference():
    """``reference(model_dir, signature, inputs)``: the SavedModel called in-process, what every
    served score must equal (``score``; ``both`` also gives ``score_no_adapt``)."""
    import tensorflow as tf

    loaded = {}

    def call(model_dir, signature, inputs, both=False):
        if model_dir not in loaded:
            loaded[model_dir] = tf.saved_model.load(str(model_dir))
        out = loaded[model_dir].signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in out.items()} if both else out["score"].numpy()

    return call


class Server:
    def __init__(self, port, proc, log: Path, model_dir, manifest):
        self.port, self.proc, self.log, self.model_dir, self.manifest = port, proc, log, model_dir, manifest

    def post(self, body, path=V1, **kw):
        return request(self.port, "POST", path, body, **kw)

    def inputs(self, signature, **kw):
        return export_inputs(self.manifest, signature, **kw)


@pytest.fixture(scope="module")
def server(click, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    with server_process(click[0], log, name=NAME) as (port, proc):
        yield Server(port, proc, log, *click)


@pytest.fixture(scope="module")
def rating_server(rating, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    with server_process(rating[0], log, name=NAME) as (port, proc):
        yield Server(port, proc, log, *rating)


def _columns(inputs):
    return {k: v.tolist() for k, v in inputs.items()}


def _rows(inputs):
    n = len(next(iter(inputs.values())))
    return [{k: v[i].tolist() for k, v in inputs.items()} for i in range(n)]


def _v2(inputs, signature=None):
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32" if v.dtype == np.float32 else "INT64",
                        "data": v.ravel().tolist()} for k, v in inputs.items()]}
    if signature:
        body["parameters"] = {"signature_name": signature}
    return body


def _assert_scores(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _predict_ok(server, reference, seed=11):
    x = server.inputs("predict", batch=3, seed=seed)
    status, body = server.post({"signature_name": "predict", "inputs": _columns(x)})
    assert status == 200, body
    _assert_scores(body["outputs"], reference(server.model_dir, "predict", x))


def test_health_and_readiness(server):
    port = server.port
    assert request(port, "GET", "/") == (200, {"status": "alive"})
    assert request(port, "GET", "/v2/health/live") == (200, {"live": True})
    assert request(port, "GET", "/v2/health/ready") == (200, {"ready": True})
    assert request(port, "GET", f"/v1/models/{NAME}") == (200, {"name": NAME, "ready": True})
    assert request(port, "GET", f"/v2/models/{NAME}/ready") == (200, {"name": NAME, "ready": True})
    assert request(port, "GET", "/v1/models/other")[0] == 404
    status, meta = request(port, "GET", f"/v2/models/{NAME}")
    assert status == 200
    inputs = {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]}
    assert sorted(inputs) == QUICKSTART_INPUTS
    assert inputs["item_tags"] == ("INT64", [-1, -1]) and inputs["dense"] == ("FP32", [-1, 3])


@pytest.mark.parametrize("signature", [None, "serving_default", "predict"])
def test_v1_row_format_with_the_quickstart_features(server, reference, signature):
    """Case 1: rows of the quickstart model's features (``item_*``, ``user_*`` and the rest are
    one sample's) are one batch, as the export declares."""
    x = server.inputs("predict", batch=5, seed=1)
    body = {"instances": _rows(x)}
    if signature:
        body["signature_name"] = signature
    status, out = server.post(body)
    assert status == 200, out
    _assert_scores(out["predictions"], reference(server.model_dir, "predict", x))
    assert sorted(body["instances"][0]) == QUICKSTART_INPUTS


def test_v1_columnar_predict_and_adapt(server, reference):
    x = server.inputs("predict", batch=7, seed=2)
    status, out = server.post({"signature_name": "predict", "inputs": _columns(x)})
    assert status == 200, out
    _assert_scores(out["outputs"], reference(server.model_dir, "predict", x))

    a = server.inputs("adapt_and_predict", batch=4, support=9, seed=3)  # S != Q
    status, out = server.post({"signature_name": "adapt_and_predict", "inputs": _columns(a)})
    assert status == 200, out
    want = reference(server.model_dir, "adapt_and_predict", a, both=True)
    _assert_scores(out["outputs"]["score"], want["score"])
    _assert_scores(out["outputs"]["score_no_adapt"], want["score_no_adapt"])
    assert np.abs(want["score"] - want["score_no_adapt"]).max() > 1e-3  # adaptation really happened


def test_v2_predict_and_adapt(server, reference):
    x = server.inputs("predict", batch=6, seed=4)
    status, out = server.post(_v2(x), path=V2)
    assert status == 200, out
    assert out["parameters"] == {"signature_name": "serving_default"}
    (score,) = out["outputs"]
    assert (score["name"], score["datatype"], score["shape"]) == ("score", "FP32", [6])
    _assert_scores(score["data"], reference(server.model_dir, "predict", x))

    a = server.inputs("adapt_and_predict", batch=3, support=5, seed=5)
    status, out = server.post(_v2(a, "adapt_and_predict"), path=V2)
    assert status == 200, out
    assert out["parameters"] == {"signature_name": "adapt_and_predict"}
    got = {o["name"]: o["data"] for o in out["outputs"]}
    _assert_scores(got["score"], reference(server.model_dir, "adapt_and_predict", a))


def test_rating_model_rows_columns_and_adapt(rating_server, reference):
    x = rating_server.inputs("predict", batch=4, seed=6)
    status, out = rating_server.post({"instances": _rows(x)})
    assert status == 200, out
    _assert_scores(out["predictions"], reference(rating_server.model_dir, "predict", x))
    a = rating_server.inputs("adapt_and_predict", batch=3, support=8, seed=7)
    status, out = rating_server.post({"signature_name": "adapt_and_predict", "inputs": _columns(a)})
    assert status == 200, out
    _assert_scores(out["outputs"]["score"], reference(rating_server.model_dir, "adapt_and_predict", a))


# ------------------------------------------------------------------------------- bad requests

def _without(d, key):
    return {k: v for k, v in d.items() if k != key}


class _Valid:
    """The valid requests the bad ones are edited from (for the click export)."""

    def __init__(self, manifest):
        self.x = _columns(export_inputs(manifest, "predict", batch=3, seed=6))
        self.a = _columns(export_inputs(manifest, "adapt_and_predict", batch=3, support=4, seed=7))
        self.rows = _rows(export_inputs(manifest, "predict", batch=3, seed=6))
        self.v2x = export_inputs(manifest, "predict", batch=2, seed=8)

    def v2(self, name=None, **changes):
        body = _v2(self.v2x)
        for inp in body["inputs"]:
            if inp["name"] == name:
                inp.update(changes)
        return body

    def v2_literal(self, literal):
        """A v2 body with a literal JSON encoders refuse to write (Python's json reads NaN and Infinity)."""
        body = self.v2("dense", data=[1.0, 2.0, 3.0, 4.0, "HERE", 6.0])
        return json.dumps(body).replace('"HERE"', literal).encode()


ADAPT = {"signature_name": "adapt_and_predict"}

# case name: (path, request from _Valid, what the error must name). A ``bytes`` request is sent raw.
BAD = {
    "v1 missing input": (V1, lambda r: {"inputs": _without(r.x, "dense")}, ["'dense'"]),
    "v1 unknown input": (V1, lambda r: {"inputs": {**r.x, "age": [1, 2, 3]}}, ["'age'"]),
    "v1 float for int64": (V1, lambda r: {"inputs": {**r.x, "item_id": [1.5, 2.0, 3.0]}}, ["'item_id'", "got floats"]),
    "v1 string for int64": (V1, lambda r: {"inputs": {**r.x, "hour": ["a", "b", "c"]}}, ["'hour'"]),
    "v1 string for float": (V1, lambda r: {"inputs": {**r.x, "dense": [["x"] * 3] * 3}}, ["'dense'"]),
    "v1 wrong rank": (V1, lambda r: {"inputs": {**r.x, "dense": [0.1, 0.2, 0.3]}}, ["'dense'"]),
    "v1 wrong fixed dim": (V1, lambda r: {"inputs": {**r.x, "dense": [[1.0, 2.0]] * 3}}, ["'dense'"]),
    "v1 ragged": (V1, lambda r: {"inputs": {**r.x, "item_tags": [[1, 2, 3], [1, 2], [1, 2, 3]]}}, ["'item_tags'"]),
    "v1 mismatched batch": (V1, lambda r: {"inputs": {**r.x, "item_id": [1]}}, ["'item_id'", "'samples'"]),
    "v1 instance lacks an input": (V1, lambda r: {"instances": [r.rows[0], _without(r.rows[1], "device"), r.rows[2]]},
                                   ["'device'"]),
    "v1 ragged instances": (V1, lambda r: {"instances": [r.rows[0], {**r.rows[1], "dense": [1.0, 2.0]}]}, ["'dense'"]),
    "v1 empty instances": (V1, lambda r: {"instances": []}, ["instances"]),
    "v1 rows for adapt_and_predict": (V1, lambda r: {**ADAPT, "instances": [r.a]}, ['"inputs"', "support", "query"]),
    "v1 adapt: label batch": (V1, lambda r: {**ADAPT, "inputs": {**r.a, "support_label": [1.0]}}, ["'support_label'"]),
    "v1 adapt: missing query": (V1, lambda r: {**ADAPT, "inputs": _without(r.a, "query_item_id")}, ["'query_item_id'"]),
    "v1 adapt: empty query": (V1, lambda r: {**ADAPT, "inputs": {**r.a, **{k: [] for k in r.a if k.startswith("query_")}}},
                              ["empty batch", "'query_"]),
    "v1 unknown signature": (V1, lambda r: {"signature_name": "nope", "inputs": r.x}, ["'nope'"]),
    "v1 both formats": (V1, lambda r: {"instances": r.rows, "inputs": r.x}, ["instances"]),
    "v1 unknown field": (V1, lambda r: {"input": r.x}, ["'input'"]),
    "v1 not an object": (V1, lambda r: [1, 2, 3], ["instances"]),
    # case 3: labels a click model was not trained on
    "v1 click labels 5 4 1 3": (V1, lambda r: {**ADAPT, "inputs": {**r.a, "support_label": [5.0, 4.0, 1.0, 3.0]}},
                                ["'support_label'", "row 0", "0 or 1"]),
    "v1 click label 0.5": (V1, lambda r: {**ADAPT, "inputs": {**r.a, "support_label": [0.0, 1.0, 0.5, 1.0]}},
                           ["'support_label'", "row 2"]),
    # case 4: numbers that are not finite once cast to float32
    "v1 dense 1e39": (V1, lambda r: {"inputs": {**r.x, "dense": [[1.0, 2.0, 3.0], [1.0, 1e39, 3.0], [1.0, 2.0, 3.0]]}},
                      ["'dense'", "row 1", "finite"]),
    "v1 rows dense 1e308": (V1, lambda r: {"instances": [*r.rows[:2], {**r.rows[2], "dense": [1e308, 0.0, 0.0]}]},
                            ["'dense'", "row 2", "finite"]),
    "v1 support dense 1e39": (V1, lambda r: {**ADAPT, "inputs": {**r.a, "support_dense": [[1e39, 0, 0], *r.a["support_dense"][1:]]}},
                              ["'support_dense'", "row 0"]),
    "v2 dense 1e39": (V2, lambda r: r.v2("dense", data=[1.0, 2.0, 3.0, 1e39, 0.0, 0.0]), ["'dense'", "row 1", "finite"]),
    "v2 NaN literal": (V2, lambda r: r.v2_literal("NaN"), ["'dense'", "row 1", "finite"]),
    "v2 Infinity literal": (V2, lambda r: r.v2_literal("-Infinity"), ["'dense'", "row 1", "finite"]),
    # case 5: the real cause
    "v1 id 2^63": (V1, lambda r: {"inputs": {**r.x, "item_id": [1, 2**63, 3]}},
                   ["'item_id'", "row 1", "outside the int64 range"]),
    "v1 id 2^64 + 5": (V1, lambda r: {"inputs": {**r.x, "item_id": [2**64 + 5, 1, 2]}},
                       ["'item_id'", "row 0", "outside the int64 range"]),
    "v1 lone id 2^64 + 5": (V1, lambda r: {"inputs": {**r.x, "item_id": [2**64 + 5]}}, ["'item_id'", "outside the int64 range"]),
    "v1 user_* batch": (V1, lambda r: {"inputs": {**r.x, "user_city": [1, 2, 3, 4], "user_segment": [1, 2, 3, 4]}},
                        ["mismatched batch sizes", "user_city=4", "item_id=3"]),
    "v2 id 2^64 + 5": (V2, lambda r: r.v2("item_id", data=[1, 2**64 + 5]), ["'item_id'", "row 1", "outside the int64 range"]),
    "v2 id 2^63": (V2, lambda r: r.v2("item_id", data=[2**63, 1]), ["'item_id'", "row 0", "outside the int64 range"]),
    # the v2 cases of before
    "v2 missing input": (V2, lambda r: {"inputs": [i for i in r.v2()["inputs"] if i["name"] != "dense"]}, ["'dense'"]),
    "v2 unknown input": (V2, lambda r: {"inputs": r.v2()["inputs"] + [{"name": "age", "shape": [2], "datatype": "INT64",
                                                                        "data": [1, 2]}]}, ["'age'"]),
    "v2 wrong datatype": (V2, lambda r: r.v2("item_id", datatype="FP32"), ["'item_id'"]),
    "v2 data contradicts datatype": (V2, lambda r: r.v2("hour", data=[1.5, 2.5]), ["'hour'"]),
    "v2 data does not fit shape": (V2, lambda r: r.v2("item_id", shape=[3]), ["'item_id'"]),
    "v2 wrong fixed dim": (V2, lambda r: r.v2("dense", shape=[3, 2]), ["'dense'"]),
    "v2 mismatched batch": (V2, lambda r: r.v2("hour", shape=[1], data=[4]), ["'hour'"]),
    "v2 unknown datatype": (V2, lambda r: r.v2("item_id", datatype="INT128"), ["'item_id'"]),
    "v2 unknown signature": (V2, lambda r: {**r.v2(), "parameters": {"signature_name": "nope"}}, ["'nope'"]),
    "v2 schema: no shape": (V2, lambda r: {"inputs": [{"name": "item_id", "datatype": "INT64", "data": [1]}]}, ["shape"]),
}


def _send_bad(server, case):
    path, make, names = BAD[case]
    body = make(_Valid(server.manifest))
    status, out = request(server.port, "POST", path, raw=body) if isinstance(body, bytes) else server.post(body, path=path)
    return status, out, names


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_is_400_naming_the_input(server, reference, case):
    status, out, names = _send_bad(server, case)
    assert status == 400, out
    for name in names:
        assert name in out["error"], out
    assert "Graph execution error" not in out["error"]
    assert server.proc.poll() is None
    _predict_ok(server, reference)  # a valid request right after still works


@pytest.mark.parametrize("path, labels, named", [(V1, [1.0, 3.0, 100.0], "row 2: 100"),
                                                 (V1, [-50.0, 3.0, 3.0], "row 0: -50"),
                                                 (V2, [1.0, float("nan"), 2.0], "row 1")])
def test_rating_labels_outside_the_training_range_are_400(rating_server, reference, path, labels, named):
    """Case 3: a 1-5 rating model refuses 100 and -50 (it scored 405.6 and -49.7 with them), and NaN."""
    assert (rating_server.manifest["label"]["min"], rating_server.manifest["label"]["max"]) == (1.0, 5.0)
    a = rating_server.inputs("adapt_and_predict", batch=2, support=3, seed=12)
    bad = {**a, "support_label": np.asarray(labels, np.float32)}
    body = {**ADAPT, "inputs": _columns(bad)} if path == V1 else _v2(bad, "adapt_and_predict")
    status, out = request(rating_server.port, "POST", path, raw=json.dumps(body).encode())  # NaN: a JSON literal
    assert status == 400, out
    assert "'support_label'" in out["error"] and named in out["error"], out
    if path == V1:
        assert "[1, 5]" in out["error"], out
    status, out = rating_server.post({**ADAPT, "inputs": _columns(a)})
    assert status == 200, out
    _assert_scores(out["outputs"]["score"], reference(rating_server.model_dir, "adapt_and_predict", a))


def test_client_errors_are_one_log_line_each(server, reference):
    """Case 6: every 4xx is one access line at WARNING naming the error, no traceback; a
    success is one INFO line."""
    time.sleep(0.5)
    before = server.log.read_text()
    cases = ["v1 missing input", "v1 click labels 5 4 1 3", "v2 NaN literal", "v1 user_* batch"]
    for case in cases:
        assert _send_bad(server, case)[0] == 400
    assert request(server.port, "GET", "/v1/models/other")[0] == 404
    _predict_ok(server, reference)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = server.log.read_text()[len(before):].splitlines()
        if len(new) >= len(cases) + 2:
            break
        time.sleep(0.2)
    assert len(new) == len(cases) + 2, new
    assert "Traceback" not in "\n".join(new)
    warnings = [ln for ln in new if " WARNING " in ln]
    assert len(warnings) == len(cases) + 1 and all('" 40' in ln for ln in warnings), new
    assert "'support_label'" in warnings[1] and "/v1/models/recs:predict" in warnings[1]
    assert " INFO " in new[-1] and '" 200 ' in new[-1]


# ------------------------------------------------------------------------------- case 7

def test_empty_support_set_scores_as_predict(server, rating_server, reference):
    """Case 7 (docs/export.md): adapt_and_predict with no support samples gives predict's scores."""
    for srv in (server, rating_server):
        a = srv.inputs("adapt_and_predict", batch=3, support=0, seed=13)
        query = {k[len("query_"):]: v for k, v in a.items() if k.startswith("query_")}
        status, out = srv.post({**ADAPT, "inputs": _columns(a)})
        assert status == 200, out
        want = reference(srv.model_dir, "predict", query)
        _assert_scores(out["outputs"]["score"], want)
        _assert_scores(out["outputs"]["score_no_adapt"], want)
        empty = {k: [] for k in a if k.startswith("support_")}  # plain [] for every support input
        status, out = srv.post({**ADAPT, "inputs": {**_columns(a), **empty}})
        assert status == 200, out
        _assert_scores(out["outputs"]["score"], want)
        status, out = srv.post(_v2(a, "adapt_and_predict"), path=V2)
        assert status == 200, out
        _assert_scores(next(o["data"] for o in out["outputs"] if o["name"] == "score"), want)


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_v2_json_body_without_json_content_type(server, reference, content_type):
    """Case 7 (docs/serving.md): a v2 JSON body is read as JSON whatever its content type (none,
    or curl's default); only the binary extension's header makes it binary."""
    x = server.inputs("predict", batch=2, seed=14)
    status, out = request(server.port, "POST", V2, _v2(x), content_type=content_type)
    assert status == 200, out
    _assert_scores(out["outputs"][0]["data"], reference(server.model_dir, "predict", x))
    status, out = request(server.port, "POST", V1, {"inputs": _columns(x)}, content_type=content_type)
    assert status == 200, out


@pytest.mark.parametrize("path", [V1, V2])
def test_malformed_json_is_400(server, reference, path):
    status, out = request(server.port, "POST", path, raw=b'{"inputs": {"user": [1, 2')
    assert status == 400, out
    assert "char 2" in out["error"], out  # where the JSON broke off (KServe's v1 wording or ours for v2)
    _predict_ok(server, reference)


def test_server_does_not_load_tfra(server):
    """The served model is stock TensorFlow: no TFRA kernel library is mapped into the server."""
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "libtensorflow_framework" in maps  # the check can see TensorFlow's own libraries
    assert "tensorflow_recommenders_addons" not in maps


# ------------------------------------------------------------------------------- batching (case 2)

def _model_calls(port, signature):
    """(calls, rows) of ``signature`` from KServe's /metrics."""
    status, text = request(port, "GET", "/metrics")
    assert status == 200
    got = {}
    for what in ("calls", "rows"):
        m = re.search(rf'^gmeta_serve_model_{what}_total{{[^}}]*signature="{signature}"[^}}]*}} (\S+)$', text, re.M)
        got[what] = float(m.group(1)) if m else 0.0
    return got["calls"], got["rows"]


def test_batched_server_merges_one_row_requests(click, reference, tmp_path):
    """Case 2: with --max-batch-size, predict of an export is micro-batched (16 concurrent one-row
    requests, rows and columns, lists of different lengths, take fewer model calls than requests,
    each answer its own); adapt_and_predict is named at start-up as not batched, and still served."""
    model_dir, manifest = click
    inputs = [export_inputs(manifest, "predict", batch=1, seed=100 + i, width=1 + i % 3) for i in range(48)]
    log = tmp_path / "serve.log"
    # A window wide enough that 16 concurrent clients meet in it on a loaded box too (run 8, load
    # 5.3: 36 calls for 48 requests with 20 ms); what is asserted is the merge, not its latency.
    with server_process(model_dir, log, name=NAME, extra=["--max-batch-size", "32", "--max-latency-ms", "200"]) as (port, _):
        startup = log.read_text()
        assert re.search(r"micro-batching predict, serving_default: up to 32 rows", startup), startup
        assert re.search(r"WARNING signature 'adapt_and_predict' is not micro-batched .*2 batch groups "
                         r"\(query, support\)", startup), startup

        def send(i):
            x = inputs[i]
            body = {"instances": _rows(x)} if i % 2 else {"signature_name": "predict", "inputs": _columns(x)}
            return request(port, "POST", V1, body)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(send, range(len(inputs))))
        for i, (x, (status, out)) in enumerate(zip(inputs, answers)):
            assert status == 200, out
            _assert_scores(out["predictions"] if i % 2 else out["outputs"], reference(model_dir, "predict", x))
        calls, rows = _model_calls(port, "serving_default")
        more_calls, more_rows = _model_calls(port, "predict")
        assert rows + more_rows == len(inputs)
        assert calls + more_calls < len(inputs) / 2, (calls, more_calls)  # merged: two or more rows per call

        a = export_inputs(manifest, "adapt_and_predict", batch=2, support=3, seed=9)  # not batched: still served
        status, out = request(port, "POST", V1, {**ADAPT, "inputs": _columns(a)})
        assert status == 200, out
        _assert_scores(out["outputs"]["score"], reference(model_dir, "adapt_and_predict", a))


# ------------------------------------------------------------------------------- a stock SavedModel

def test_a_savedmodel_that_is_not_an_export(tmp_path, reference):
    """Any SavedModel is served from its TensorSpecs: rows and columns work, nothing is batched
    (start-up says why), the model's own shape errors are 400s naming the cause, and a fault
    inside the model is a 500 whose traceback is logged."""
    model_dir = build_model(tmp_path / "model")
    log = tmp_path / "serve.log"
    with server_process(model_dir, log, name=NAME, extra=["--max-batch-size", "8"]) as (port, proc):
        startup = log.read_text()
        assert re.search(r"signature 'predict' is not micro-batched .*does not declare which inputs share", startup)
        x = example_inputs("predict", batch=3, seed=1)
        status, out = request(port, "POST", V1, {"instances": _rows(x)})
        assert status == 200, out
        _assert_scores(out["predictions"], reference(model_dir, "predict", x))
        status, out = request(port, "POST", V1, {"inputs": {**_columns(x), "item": [1, 2]}})
        assert status == 400 and "'serving_default' rejected the inputs" in out["error"], out
        assert "Graph execution error" not in out["error"] and "Dimension 0" in out["error"], out
        status, out = request(port, "POST", V1, {"signature_name": "read", "inputs": {"path": ["/nonexistent/x"]}})
        assert status == 500, out
        assert proc.poll() is None
        time.sleep(0.5)
        text = log.read_text()
        assert text.count("Traceback") == 1 and "NotFoundError" in text, text[-3000:]
        assert re.search(r' ERROR .*"POST /v1/models/recs:predict HTTP/1.1" 500', text), text[-2000:]


@pytest.mark.parametrize("kind", ["missing", "not a SavedModel", "damaged", "no signatures"])
def test_bad_model_dir_is_one_line_exit_2(tmp_path, kind):
    model = tmp_path / "nothing-here"
    if kind == "not a SavedModel":
        model.mkdir()
        (model / "variables").mkdir()
    elif kind == "damaged":
        model.mkdir()
        (model / "saved_model.pb").write_bytes(b"\x00 not a protobuf")
    elif kind == "no signatures":
        import tensorflow as tf

        tf.saved_model.save(tf.Module(), str(model))
    proc = subprocess.run([sys.executable, "-m", "gmeta_tf.cli.main", "serve", "--model", str(model),
                           "--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and str(model) in lines[0], proc.stderr
    expected = {"missing": "no such directory", "not a SavedModel": "is not a SavedModel",
                "damaged": "does not load", "no signatures": "no signatures to serve"}[kind]
    assert expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_gracefully_with_exit_0(tmp_path, sig):
    """What a pod's stop sends: uvicorn drains and the process exits 0 (as under KServe's own
    ModelServer), not killed by the signal."""
    model_dir = build_model(tmp_path / "model")
    log = tmp_path / "serve.log"
    with server_process(model_dir, log, name=NAME) as (port, proc):
        assert request(port, "GET", "/v2/health/ready")[0] == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert "Finished server process" in text and "Traceback" not in text, text[-2000:]
