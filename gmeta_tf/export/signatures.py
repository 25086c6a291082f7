"""The SavedModel's signatures: their inputs, and the functions that score with them.

Both signatures run evaluation's own ``query_predictions`` on the frozen model, one user at a
time (a task axis of 1), so a served score is ``gmeta eval``'s score:

* ``predict``: samples → score, without adaptation (``gmeta eval``'s ``*_no_adapt`` scores; a
  user with an empty support set).
* ``adapt_and_predict``: one new user's support samples with labels, and query samples → the
  query's scores after the inner loop, with the settings ``gmeta eval`` adapts with
  (``evaluation.evaluate.adaptation``: steps, learning rate, ``meta.adapt``, the SGD or Newton
  solver, the learned ridge λ). The adapted weights are tensors of that one call, never
  written to a variable: concurrent requests cannot see each other's adaptation.

Inputs are per feature, named after it (``sanitize``): int64 ids as ``gmeta data prepare``
wrote them (hashed string ids included; multi-hot lists padded with -1), float32 dense
features ``[N, n_input_dense]`` in ``schema.json`` order, as the input data has them. The graph
then does what Meta-IO does (``input_transforms``): rare ids → ``RARE_ID``
(``data.min_id_count``), target-encoding features computed from the real ids and appended, and
every dense feature standardised with the train split's statistics.

Which inputs share a first dimension is declared, not guessed: each ``Input`` names its batch
group (``samples`` for ``predict``; ``support`` and ``query`` for ``adapt_and_predict``), which
``export.json`` records (``export_format.InputDecl``) and ``gmeta serve`` reads to parse rows and to merge requests. A
TensorSpec only says the first dimension is free, and input names are the data's feature names
(``user_city`` and ``item_id`` are one sample's features, not two groups).

``adapt_and_predict`` refuses a support set it cannot have been trained on, in the graph: labels
other than 0/1 for clicks or outside the train split's range for ratings (``label_rule``), and
NaN or infinite support values, which would otherwise turn every query score into NaN (query
and ``predict`` rows score alone: a NaN there gives that row a NaN score).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from gmeta_tf.config.schema import Config
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.evaluation.evaluate import adaptation, query_predictions
from gmeta_tf.export.frozen_model import FrozenModel
from gmeta_tf.export_format import InputDecl, LabelRule

DENSE = "dense"
LABEL = "label"
SAMPLES, SUPPORT, QUERY = "samples", "support", "query"  # batch groups


@dataclass(frozen=True)
class Input:
    name: str  # the signature's input name
    feature: str  # schema.json's feature name ("dense" / "label" for those)
    role: str  # categorical | multi_hot | dense | label
    dtype: tf.DType
    shape: Tuple[Optional[int], ...]
    group: str  # the batch group: inputs of one group share their first dimension

    def spec(self) -> tf.TensorSpec:
        return tf.TensorSpec(self.shape, self.dtype, name=self.name)

    def describe(self) -> InputDecl:
        # a multi-hot list's pad: requests merged in a batch are padded with it
        return InputDecl(name=self.name, feature=self.feature, role=self.role, dtype=self.dtype.name,
                         shape=tuple(-1 if d is None else d for d in self.shape), batch_group=self.group,
                         pad=fmt.PAD_ID if self.role == "multi_hot" else None)


def label_rule(model: FrozenModel) -> LabelRule:
    """The support labels the model was trained on: 0 and 1 for clicks; the train split's range
    for ratings (``schema.json``'s ``label_stats``; data prepared before it recorded min and max
    gives no range)."""
    if model.kind == "click":
        return LabelRule(model.kind, values=(0.0, 1.0))
    stats = model.label_stats
    if "min" in stats and "max" in stats:
        return LabelRule(model.kind, low=float(stats["min"]), high=float(stats["max"]))
    return LabelRule(model.kind)


def sanitize(feature: str) -> str:
    """A signature input name for a feature: letters, digits and ``_`` (TF's rule for names)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", feature)
    return name if re.match(r"[A-Za-z]", name) else f"f_{name}"


def sample_inputs(model: FrozenModel, prefix: str = "") -> List[Input]:
    """One set of samples' inputs: ids per categorical ``[N]`` and multi-hot ``[N, L]`` feature,
    then ``dense`` ``[N, n_input_dense]`` when the input data has dense features (the ones the
    graph computes, ``model.inputs.computed_dense``, are not sent)."""
    group = prefix.rstrip("_") or SAMPLES
    out = [Input(prefix + sanitize(n), n, "categorical", tf.int64, (None,), group) for n in model.cat_names]
    out += [Input(prefix + sanitize(n), n, "multi_hot", tf.int64, (None, None), group) for n in model.multi_names]
    if model.n_input_dense:
        out.append(Input(prefix + DENSE, DENSE, "dense", tf.float32, (None, model.n_input_dense), group))
    seen: Dict[str, str] = {}
    for x in out:
        if x.name in seen:
            raise DataError(f"schema.json: features {seen[x.name]!r} and {x.feature!r} both become the "
                            f"signature input {x.name!r}; rename one of them in the data")
        seen[x.name] = x.feature
    return out


def signature_inputs(model: FrozenModel) -> Dict[str, List[Input]]:
    return {
        "predict": sample_inputs(model),
        "adapt_and_predict": [*sample_inputs(model, SUPPORT + "_"),
                              Input(SUPPORT + "_label", LABEL, "label", tf.float32, (None,), SUPPORT),
                              *sample_inputs(model, QUERY + "_")],
    }


# The batch group each signature's outputs follow (one score per sample of it).
OUTPUT_GROUPS = {"predict": SAMPLES, "adapt_and_predict": QUERY}


def _support_checks(model: FrozenModel, dense: Optional[tf.Tensor], labels: tf.Tensor) -> list:
    """The support set's labels within ``label_rule`` and its values finite (see the module doc)."""
    rule = label_rule(model)
    checks = [tf.debugging.assert_all_finite(labels, "input 'support_label' holds NaN or Inf")]
    if dense is not None:
        checks.append(tf.debugging.assert_all_finite(
            dense, f"input '{SUPPORT}_{DENSE}' holds NaN or Inf: it would make every query score NaN"))
    if rule.values is not None:
        ok = tf.reduce_all(tf.reduce_any(labels[:, None] == tf.constant(list(rule.values)), axis=1))
        checks.append(tf.debugging.Assert(ok, [f"support_label: {rule.text()} (the labels it was trained on), got",
                                               labels]))
    elif rule.constrains:
        ok = tf.reduce_all((labels >= rule.low) & (labels <= rule.high))
        checks.append(tf.debugging.Assert(ok, [f"support_label: {rule.text()}, got", labels]))
    return checks


def _samples(model: FrozenModel, inputs: List[Input], feed: Dict[str, tf.Tensor],
             labels: Optional[tf.Tensor] = None) -> dict:
    """One user's samples as the ``[1, N, ...]`` batch part the evaluation functions take,
    after checking that every input has the same number of samples N."""
    first = inputs[0]
    n = tf.shape(feed[first.name])[0]
    checks = [tf.debugging.assert_equal(tf.shape(feed[x.name])[0], n, message=(
        f"inputs {first.name!r} and {x.name!r} must have the same number of samples (first dimension)"))
        for x in inputs[1:]]
    if labels is not None:
        checks.append(tf.debugging.assert_equal(tf.shape(labels)[0], n, message=(
            f"'support_label' must have one label per support sample (as many as {first.name!r})")))
        dense = next((feed[x.name] for x in inputs if x.role == DENSE), None)
        checks += _support_checks(model, dense, labels)
    with tf.control_dependencies(checks):
        n = tf.identity(n)
    by_feature = {x.feature: feed[x.name] for x in inputs}
    raw_dense = by_feature[DENSE] if model.n_input_dense else tf.zeros([n, 0], tf.float32)
    # Target encoding reads the real ids; the tables then see rare ids as RARE_ID (Meta-IO's order).
    dense = model.inputs.dense(raw_dense, {c: by_feature[c] for c in model.cat_names})
    dense = model.standardize(dense)[None] if model.n_dense else tf.zeros([1, n, 0], tf.float32)
    return {
        "cat": {c: model.inputs.ids(c, by_feature[c])[None] for c in model.cat_names},
        "multi": {m: model.inputs.ids(m, by_feature[m])[None] for m in model.multi_names},
        "dense": dense,
        "label": labels[None] if labels is not None else tf.zeros([1, n], tf.float32),
        "mask": tf.ones([1, n], tf.float32),
    }


def _no_samples(model: FrozenModel) -> dict:
    return {
        "cat": {c: tf.zeros([1, 0], tf.int64) for c in model.cat_names},
        "multi": {m: tf.zeros([1, 0, 1], tf.int64) for m in model.multi_names},
        "dense": tf.zeros([1, 0, model.n_dense], tf.float32),
        "label": tf.zeros([1, 0], tf.float32),
        "mask": tf.zeros([1, 0], tf.float32),
    }


def make_signatures(model: FrozenModel, cfg: Config) -> Dict[str, tf.types.experimental.ConcreteFunction]:
    """``predict``, ``adapt_and_predict`` and ``serving_default`` (= ``predict``)."""
    inputs = signature_inputs(model)
    steps, lr = adaptation(cfg, cfg.meta.algo)
    predict_in, adapt_in = inputs["predict"], inputs["adapt_and_predict"]
    support_in, query_in = sample_inputs(model, "support_"), sample_inputs(model, "query_")

    def scores(batch: dict, k: int):
        return query_predictions(model, cfg, batch, steps=k, lr=lr, adapt_set=cfg.meta.adapt)

    @tf.function(input_signature=[{x.name: x.spec() for x in predict_in}], autograph=False)
    def predict(features):
        batch = {"task_mask": tf.ones([1]), "support": _no_samples(model),
                 "query": _samples(model, predict_in, features)}
        before, _ = scores(batch, 0)
        return {"score": before[0]}

    @tf.function(input_signature=[{x.name: x.spec() for x in adapt_in}], autograph=False)
    def adapt_and_predict(features):
        batch = {"task_mask": tf.ones([1]),
                 "support": _samples(model, support_in, features, labels=features["support_label"]),
                 "query": _samples(model, query_in, features)}
        before, after = scores(batch, steps)
        return {"score": after[0], "score_no_adapt": before[0]}

    predict_fn = predict.get_concrete_function()
    return {"predict": predict_fn, "serving_default": predict_fn,
            "adapt_and_predict": adapt_and_predict.get_concrete_function()}
