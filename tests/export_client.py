"""A client of an exported model that knows nothing of gmeta-tf: stock TensorFlow and numpy only.

``python export_client.py SAVED_MODEL INPUTS.npz OUT.json`` loads the SavedModel, scores every
task of ``INPUTS.npz`` (arrays ``<task>/<signature input>``, ``tasks``: the count) with
``predict`` (its query samples) and ``adapt_and_predict`` (support with labels + query), and
lists every op of the SavedModel's graph and function library with whether *this* process's
stock TensorFlow registers it. It then reports which modules it imported, so the test can
assert that it never imported gmeta_tf or TensorFlow Recommenders-Addons.
"""
import json
import sys

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry


def graph_ops(saved_model_dir: str) -> set:
    sm = saved_model_pb2.SavedModel()
    with open(f"{saved_model_dir}/saved_model.pb", "rb") as f:
        sm.ParseFromString(f.read())
    ops = set()
    for mg in sm.meta_graphs:
        ops |= {n.op for n in mg.graph_def.node}
        for fn in mg.graph_def.library.function:
            ops |= {n.op for n in fn.node_def}
    return ops


def main(model_dir: str, inputs: str, out: str) -> None:
    data = np.load(inputs)
    model = tf.saved_model.load(model_dir)
    predict, adapt = model.signatures["predict"], model.signatures["adapt_and_predict"]
    names = {sig: list(model.signatures[sig].structured_input_signature[1]) for sig in ("predict", "adapt_and_predict")}
    result = {"predict": [], "adapt": [], "adapt_no_adapt": [], "inputs": names}
    for t in range(int(data["tasks"])):
        def feed(sig, rename=lambda n: n):
            return {n: tf.constant(data[f"{t}/{rename(n)}"]) for n in names[sig]}
        # predict scores the query samples: its inputs are the query_* arrays without the prefix.
        result["predict"].append(predict(**feed("predict", lambda n: "query_" + n))["score"].numpy().tolist())
        got = adapt(**feed("adapt_and_predict"))
        result["adapt"].append(got["score"].numpy().tolist())
        result["adapt_no_adapt"].append(got["score_no_adapt"].numpy().tolist())
    # The same users adapted concurrently: each call's adapted weights are its own, so the
    # scores cannot change, and predict after all of them still scores as before.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda t: adapt(**{n: tf.constant(data[f"{t}/{n}"]) for n in names["adapt_and_predict"]})
                                 ["score"].numpy().tolist(), range(int(data["tasks"]))))
    result["adapt_concurrent"] = together
    result["predict_after"] = predict(**{n: tf.constant(data[f"0/query_{n}"]) for n in names["predict"]})["score"].numpy().tolist()
    ops = graph_ops(model_dir)
    result["ops"] = sorted(ops)
    result["unregistered"] = sorted(op for op in ops if op_def_registry.get(op) is None)
    result["modules"] = sorted(m for m in sys.modules
                               if m.split(".")[0] in ("gmeta_tf", "tensorflow_recommenders_addons"))
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
