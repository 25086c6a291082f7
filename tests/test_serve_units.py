"""`gmeta serve`'s model in-process (no server): readiness comes from loading, and string inputs
(an export may take raw string ids and hash them in the graph) work in v1 and v2."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def string_model(tmp_path_factory):
    """A SavedModel whose one signature takes strings and returns their int64 hash buckets."""
    import tensorflow as tf

    class Hasher(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="key")])
        def bucket(self, key):
            return {"bucket": tf.strings.to_hash_bucket_fast(key, 1000)}

    m = Hasher()
    out = tmp_path_factory.mktemp("strings") / "model"
    tf.saved_model.save(m, str(out), signatures={"serving_default": m.bucket.get_concrete_function()})
    return out


def _want(keys):
    import tensorflow as tf

    return tf.strings.to_hash_bucket_fast(tf.constant(keys), 1000).numpy()


def test_ready_only_after_load(string_model):
    from kserve.errors import NoModelReady

    from gmeta_tf.serve.model import SavedModelServer
    from gmeta_tf.serve.server import build_app

    model = SavedModelServer("m", str(string_model))
    model.start()  # KServe's default start() would mark any model ready
    assert model.ready is False
    with pytest.raises(NoModelReady):
        build_app(model)
    assert model.load() is True and model.ready is True


def test_string_inputs_v1_and_v2(string_model):
    from kserve.protocol.infer_type import InferInput

    from gmeta_tf.serve.kserve_lib import InferRequest, InvalidInput
    from gmeta_tf.serve.model import SavedModelServer

    model = SavedModelServer("m", str(string_model))
    model.load()
    keys = ["user-1", "user-2", "ünïcode"]

    out = asyncio.run(model.predict({"instances": keys}))  # one input: bare values
    assert out == {"predictions": _want(keys).tolist()}
    out = asyncio.run(model.predict({"inputs": {"key": keys}}))
    assert out == {"outputs": _want(keys).tolist()}

    request = InferRequest(model_name="m", infer_inputs=[InferInput("key", [3], "BYTES", keys)])
    response = asyncio.run(model.predict(request))
    (score,) = response.outputs
    assert (score.name, score.datatype, score.shape) == ("bucket", "INT64", [3])
    np.testing.assert_array_equal(score.as_numpy(), _want(keys))

    with pytest.raises(InvalidInput, match="input 'key' must be string, got integers"):
        asyncio.run(model.predict({"inputs": {"key": [1, 2]}}))


# ------------------------------------------------------------------------ value checks (no TensorFlow)

def _info(name, shape, dtype=np.int64, group=None):
    from gmeta_tf.serve.signatures import TensorInfo

    return TensorInfo(name=name, dtype=np.dtype(dtype), shape=shape, group=group)


@pytest.mark.fast
@pytest.mark.parametrize("value, named", [
    ([1, 2**63, 3], "row 1: 9.223372036854776e+18 is outside the int64 range"),  # numpy made floats of the list
    ([2**64 + 5], "row 0: 1.8446744073709552e+19 is outside"),  # what orjson makes of it
    ([[1, 2], [3, -2**63 - 1]], "row 1: "),
])
def test_ids_out_of_range_are_named_with_their_row(value, named):
    import orjson

    from gmeta_tf.serve.tensors import BadRequest, as_array, fit

    parsed = orjson.loads(json.dumps(value))  # as KServe's v1 endpoint reads the body
    info = _info("item_id", (None,) if np.ndim(value) == 1 else (None, None))
    with pytest.raises(BadRequest, match="outside the int64 range") as e:
        fit("item_id", as_array("item_id", parsed), info)
    assert named in str(e.value) and "'item_id'" in str(e.value)
    with pytest.raises(BadRequest, match="must be int64, got floats"):  # a real float is still a float
        fit("item_id", as_array("item_id", [1.5, 2.0]), _info("item_id", (None,)))


@pytest.mark.fast
@pytest.mark.parametrize("value, row", [([[1.0, 2.0], [1e39, 0.0]], 1), ([[float("nan"), 0.0]], 0),
                                        ([[0.0, 0.0], [0.0, 0.0], [0.0, -float("inf")]], 2)])
def test_non_finite_floats_are_named_with_their_row(value, row):
    from gmeta_tf.serve.tensors import BadRequest, fit

    with pytest.raises(BadRequest, match=rf"input 'dense' row {row}: .* is not a finite float32"):
        fit("dense", np.asarray(value), _info("dense", (None, 2), np.float32))


@pytest.mark.fast
def test_labels_and_empty_groups():
    from gmeta_tf.serve.signatures import LabelRule, Signature
    from gmeta_tf.serve.tensors import BadRequest, check_request, fit

    inputs = {"support_x": _info("support_x", (None,), group="support"),
              "support_label": _info("support_label", (None,), np.float32, group="support"),
              "query_x": _info("query_x", (None,), group="query")}
    sig = Signature("adapt", inputs, {"score": _info("score", (None,), np.float32)}, output_group="query",
                    labels={"support_label": LabelRule("rating", low=1.0, high=5.0)})
    ok = {"support_x": np.array([1, 2]), "support_label": np.array([1.0, 5.0], np.float32), "query_x": np.array([3])}
    check_request(sig, ok)
    with pytest.raises(BadRequest, match=r"'support_label' row 1: 6 .*trained on labels in \[1, 5\]"):
        check_request(sig, {**ok, "support_label": np.array([1.0, 6.0], np.float32)})
    empty_support = {"support_x": fit("support_x", np.asarray([]), inputs["support_x"]),
                     "support_label": np.zeros(0, np.float32), "query_x": np.array([3])}
    check_request(sig, empty_support)  # no support samples: scores as predict
    with pytest.raises(BadRequest, match="'query_x' has an empty batch"):
        check_request(sig, {**ok, "query_x": np.zeros(0, np.int64)})
    with pytest.raises(BadRequest, match=r"mismatched batch sizes, the 'support' inputs"):
        check_request(sig, {**ok, "support_x": np.array([1])})
    assert fit("m", np.asarray([]), _info("m", (None, None))).shape == (0, 0)  # `[]` for a matrix: no rows


@pytest.mark.fast
def test_tf_error_cause_drops_where_and_keeps_why():
    from gmeta_tf.errors import tf_error_cause

    message = ("Graph execution error:\n\nDetected at node inner_loop/MatrixSolve defined at (most recent call last):\n"
               "<stack traces unavailable>\nInput matrix is not invertible.\n"
               "\t [[{{node inner_loop/MatrixSolve}}]] [Op:__inference_signature_wrapper_5063]")
    assert tf_error_cause(message) == "Input matrix is not invertible."


def test_the_kserve_surface_gmeta_serve_builds_on():
    """Issue 36.5: every KServe name the server uses exists, public, with the parameters it is
    called with (``kserve_lib.RELIED_ON``); a KServe upgrade that changes one fails here, naming
    it. And nothing in gmeta_tf/serve reaches KServe but through kserve_lib, by a listed name."""
    import ast
    import importlib
    import inspect
    from pathlib import Path

    from gmeta_tf.serve.kserve_lib import RELIED_ON

    for where, params in RELIED_ON.items():
        module, _, attr = where.partition(":")
        assert not any(p.startswith("_") for p in attr.split(".")), f"{where}: a private KServe name"
        obj = importlib.import_module(module)
        for part in attr.split("."):
            assert hasattr(obj, part), f"KServe changed: {where} is gone (gmeta_tf/serve relies on it)"
            obj = getattr(obj, part)
        if params is not None:
            got = tuple(inspect.signature(obj).parameters)[:len(params)]
            assert got == params, f"KServe changed: {where} takes {got}, gmeta_tf/serve calls it with {params}"

    serve = Path(__file__).resolve().parents[1] / "gmeta_tf" / "serve"
    listed = {(m, a.split(".")[0]) for m, _, a in (w.partition(":") for w in RELIED_ON)}
    for path in serve.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "kserve" for a in node.names), f"{path.name} imports kserve"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kserve":
                assert path.name == "kserve_lib.py", f"{path.name} imports KServe directly: go through kserve_lib"
                for alias in node.names:
                    assert (node.module, alias.name) in listed, f"kserve_lib imports {node.module}.{alias.name}, " \
                                                                "which RELIED_ON does not list"
