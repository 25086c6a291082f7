"""`gmeta serve` over real HTTP: a started server process, v1 (rows and columns) and v2, health,
every class of bad request answered 400 naming the input, and the server still serving after.

The model comes from ``serve_fixture.build_model`` (the one place to switch to a real export);
responses are compared with the same SavedModel called in this process.
"""
from __future__ import annotations

import concurrent.futures
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_fixture import REPO, build_model, example_inputs, free_port, request, server_process

pytestmark = pytest.mark.integration

NAME = "recs"
V1 = f"/v1/models/{NAME}:predict"
V2 = f"/v2/models/{NAME}/infer"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("serve") / "model")


@pytest.fixture(scope="module")
def reference(model_dir):
    """The SavedModel called in-process: what every served score must equal."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(model_dir))

    def call(signature, inputs):
        out = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        return out["score"].numpy()

    return call


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    with server_process(model_dir, log, name=NAME) as (port, proc):
        yield port, proc


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


def _predict_ok(port, reference, seed=11):
    x = example_inputs("predict", batch=3, seed=seed)
    status, body = request(port, "POST", V1, {"signature_name": "predict", "inputs": _columns(x)})
    assert status == 200, body
    _assert_scores(body["outputs"], reference("predict", x))


def test_health_and_readiness(server):
    port, _ = server
    assert request(port, "GET", "/") == (200, {"status": "alive"})
    assert request(port, "GET", "/v2/health/live") == (200, {"live": True})
    assert request(port, "GET", "/v2/health/ready") == (200, {"ready": True})
    assert request(port, "GET", f"/v1/models/{NAME}") == (200, {"name": NAME, "ready": True})
    assert request(port, "GET", f"/v2/models/{NAME}/ready") == (200, {"name": NAME, "ready": True})
    assert request(port, "GET", "/v1/models/other")[0] == 404
    status, meta = request(port, "GET", f"/v2/models/{NAME}")
    assert status == 200
    assert {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]} == {
        "user": ("INT64", [-1]), "item": ("INT64", [-1]), "genres": ("INT64", [-1, 3]), "dense": ("FP32", [-1, 4])}


@pytest.mark.parametrize("signature", [None, "serving_default", "predict"])
def test_v1_row_format(server, reference, signature):
    port, _ = server
    x = example_inputs("predict", batch=5, seed=1)
    body = {"instances": _rows(x)}
    if signature:
        body["signature_name"] = signature
    status, out = request(port, "POST", V1, body)
    assert status == 200, out
    _assert_scores(out["predictions"], reference("predict", x))


def test_v1_columnar_predict_and_adapt(server, reference):
    port, _ = server
    x = example_inputs("predict", batch=7, seed=2)
    status, out = request(port, "POST", V1, {"signature_name": "predict", "inputs": _columns(x)})
    assert status == 200, out
    _assert_scores(out["outputs"], reference("predict", x))

    a = example_inputs("adapt_and_predict", batch=4, support=9, seed=3)  # S != Q
    status, out = request(port, "POST", V1, {"signature_name": "adapt_and_predict", "inputs": _columns(a)})
    assert status == 200, out
    want = reference("adapt_and_predict", a)
    _assert_scores(out["outputs"], want)
    # adaptation really happened: the same queries without it score differently
    plain = reference("predict", {k[len("query_"):]: v for k, v in a.items() if k.startswith("query_")})
    assert np.abs(want - plain).max() > 1e-3


def test_v2_predict_and_adapt(server, reference):
    port, _ = server
    x = example_inputs("predict", batch=6, seed=4)
    status, out = request(port, "POST", V2, _v2(x))
    assert status == 200, out
    assert out["parameters"] == {"signature_name": "serving_default"}
    (score,) = out["outputs"]
    assert (score["name"], score["datatype"], score["shape"]) == ("score", "FP32", [6])
    _assert_scores(score["data"], reference("predict", x))

    a = example_inputs("adapt_and_predict", batch=3, support=5, seed=5)
    status, out = request(port, "POST", V2, _v2(a, "adapt_and_predict"))
    assert status == 200, out
    assert out["parameters"] == {"signature_name": "adapt_and_predict"}
    _assert_scores(out["outputs"][0]["data"], reference("adapt_and_predict", a))


def _bad_v1_cases():
    x = _columns(example_inputs("predict", batch=3, seed=6))
    a = _columns(example_inputs("adapt_and_predict", batch=3, support=4, seed=7))
    rows = _rows(example_inputs("predict", batch=3, seed=6))

    def without(d, key):
        return {k: v for k, v in d.items() if k != key}

    return {
        "missing input": ({"inputs": without(x, "dense")}, "'dense'"),
        "unknown input": ({"inputs": {**x, "age": [1, 2, 3]}}, "'age'"),
        "float for int64": ({"inputs": {**x, "user": [1.5, 2.0, 3.0]}}, "'user'"),
        "string for int64": ({"inputs": {**x, "item": ["a", "b", "c"]}}, "'item'"),
        "string for float": ({"inputs": {**x, "dense": [["x"] * 4] * 3}}, "'dense'"),
        "wrong rank": ({"inputs": {**x, "dense": [0.1, 0.2, 0.3]}}, "'dense'"),
        "wrong fixed dim": ({"inputs": {**x, "genres": [[1, 2]] * 3}}, "'genres'"),
        "ragged": ({"inputs": {**x, "genres": [[1, 2, 3], [1, 2], [1, 2, 3]]}}, "'genres'"),
        "mismatched batch": ({"inputs": {**x, "item": [1]}}, "'item'"),
        "instance lacks an input": ({"instances": [rows[0], without(rows[1], "item"), rows[2]]}, "'item'"),
        "ragged instances": ({"instances": [rows[0], {**rows[1], "genres": [1, 2]}]}, "'genres'"),
        "empty instances": ({"instances": []}, "instances"),
        "rows for adapt_and_predict": ({"signature_name": "adapt_and_predict", "instances": [a]}, "\"inputs\""),
        "adapt: label batch": ({"signature_name": "adapt_and_predict",
                                "inputs": {**a, "support_label": [1.0]}}, "'support_label'"),
        "adapt: missing query": ({"signature_name": "adapt_and_predict", "inputs": without(a, "query_item")},
                                 "'query_item'"),
        "unknown signature": ({"signature_name": "nope", "inputs": x}, "'nope'"),
        "both formats": ({"instances": rows, "inputs": x}, "instances"),
        "unknown field": ({"input": x}, "'input'"),
        "not an object": ([1, 2, 3], "instances"),
    }


def _bad_v2_cases():
    x = example_inputs("predict", batch=2, seed=8)
    good = _v2(x)

    def edit(name, **changes):
        body = _v2(x)
        for inp in body["inputs"]:
            if inp["name"] == name:
                inp.update(changes)
        return body

    return {
        "missing input": ({"inputs": [i for i in good["inputs"] if i["name"] != "dense"]}, "'dense'"),
        "unknown input": ({"inputs": good["inputs"] + [{"name": "age", "shape": [2], "datatype": "INT64",
                                                         "data": [1, 2]}]}, "'age'"),
        "wrong datatype": (edit("user", datatype="FP32"), "'user'"),
        "data contradicts datatype": (edit("item", data=[1.5, 2.5]), "'item'"),
        "data does not fit shape": (edit("user", shape=[3]), "'user'"),
        "wrong fixed dim": (edit("genres", shape=[3, 2]), "'genres'"),
        "mismatched batch": (edit("item", shape=[1], data=[4]), "'item'"),
        "unknown datatype": (edit("user", datatype="INT128"), "'user'"),
        "unknown signature": ({**good, "parameters": {"signature_name": "nope"}}, "'nope'"),
        "schema: no shape": ({"inputs": [{"name": "user", "datatype": "INT64", "data": [1]}]}, "shape"),
    }


_BAD = {**{("v1", case): (V1, body, names) for case, (body, names) in _bad_v1_cases().items()},
        **{("v2", case): (V2, body, names) for case, (body, names) in _bad_v2_cases().items()}}


@pytest.mark.parametrize("protocol,case", list(_BAD), ids=[f"{p}-{c}" for p, c in _BAD])
def test_bad_request_is_400_naming_the_input(server, reference, protocol, case):
    port, proc = server
    path, body, names = _BAD[(protocol, case)]
    status, out = request(port, "POST", path, body)
    assert status == 400, out
    assert names in out["error"], out
    assert proc.poll() is None
    _predict_ok(port, reference)  # a valid request right after still works


@pytest.mark.parametrize("path", [V1, V2])
def test_malformed_json_is_400(server, reference, path):
    port, _ = server
    status, out = request(port, "POST", path, raw=b'{"inputs": {"user": [1, 2')
    assert status == 400, out
    assert "char 2" in out["error"], out  # where the JSON broke off (KServe's v1 wording or ours for v2)
    _predict_ok(port, reference)


def test_server_does_not_load_tfra(server):
    """The served model is stock TensorFlow: no TFRA kernel library is mapped into the server."""
    _, proc = server
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "libtensorflow_framework" in maps  # the check can see TensorFlow's own libraries
    assert "tensorflow_recommenders_addons" not in maps


def test_batched_server_answers_concurrent_requests_exactly(model_dir, reference, tmp_path):
    """With micro-batching on, 16 concurrent requests of different sizes each get their own rows."""
    inputs = [example_inputs("predict", batch=1 + i % 4, seed=100 + i) for i in range(16)]
    with server_process(model_dir, tmp_path / "serve.log", name=NAME,
                        extra=["--max-batch-size", "32", "--max-latency-ms", "20"]) as (port, _):
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda x: request(port, "POST", V1, {"inputs": _columns(x)}), inputs))
        for x, (status, out) in zip(inputs, answers):
            assert status == 200, out
            _assert_scores(out["outputs"], reference("predict", x))
        a = example_inputs("adapt_and_predict", batch=2, support=3, seed=9)  # not batched: still served
        status, out = request(port, "POST", V1, {"signature_name": "adapt_and_predict", "inputs": _columns(a)})
        assert status == 200, out
        _assert_scores(out["outputs"], reference("adapt_and_predict", a))


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
