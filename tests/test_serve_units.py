"""`gmeta serve`'s model in-process (no server): readiness comes from loading, and string inputs
(an export may take raw string ids and hash them in the graph) work in v1 and v2."""
from __future__ import annotations

import asyncio

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

    from gmeta_tf.serve.kserve_lib import ModelServer
    from gmeta_tf.serve.model import SavedModelServer

    model = SavedModelServer("m", str(string_model))
    model.start()  # KServe's default start() would mark any model ready
    assert model.ready is False
    with pytest.raises(NoModelReady):
        ModelServer(http_port=0, enable_grpc=False)._register_and_check_atleast_one_model_is_ready([model])
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
