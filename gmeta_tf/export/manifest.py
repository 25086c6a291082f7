"""What goes into ``assets.extra/export.json`` (its format: ``gmeta_tf/export_format.py``):
what a client of the SavedModel needs to know, in one file.

The signatures' inputs and outputs (names, dtypes, shapes, the feature each input carries,
whether its ids are hashed strings, its batch group and pad value), the labels the model takes,
the policy for unknown and rare ids, the dense features
the graph computes itself (target encoding), the adaptation the
``adapt_and_predict`` signature runs, and where the model came from (run, checkpoint, data
fingerprint). A server can read it instead of parsing the SavedModel's protobuf.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List

from gmeta_tf.config.schema import Config
from gmeta_tf.data import task_format as fmt
from gmeta_tf.evaluation.evaluate import adaptation
from gmeta_tf.export.frozen_model import FrozenModel
from gmeta_tf.export.signatures import OUTPUT_GROUPS, Input, label_rule
from gmeta_tf.export_format import ExportRecord, SignatureDecl
from gmeta_tf.meta import neighbourhood
from gmeta_tf.meta.inner_loop import RIDGE_PRIOR, SUPPORT_HALF_LIFE

OUTPUTS = {
    "predict": {"score": "float32 [N]: probability of a click (click data) or the rating (rating data)"},
    "adapt_and_predict": {"score": "float32 [Q]: the query samples' scores after adaptation",
                          "score_no_adapt": "float32 [Q]: the same without adaptation (= predict)"},
}


def export_manifest(model: FrozenModel, cfg: Config, schema: dict, inputs: Dict[str, List[Input]],
                    run_dir: str, checkpoint: str, step: int) -> ExportRecord:
    steps, lr = adaptation(cfg, cfg.meta.algo)
    hashed = {c["name"]: bool(c.get("hashed")) for c in schema["categorical"] + schema["multi_hot"]}
    signatures = {}
    for sig, ins in inputs.items():
        described = []
        for x in ins:
            d = x.describe()
            if x.feature in hashed:
                d = dataclasses.replace(d, hashed=hashed[x.feature])
            if x.role == "dense":  # the input's own columns; the graph computes the rest
                d = dataclasses.replace(d, features=tuple(model.inputs.input_dense))
            described.append(d)
        signatures[sig] = SignatureDecl(inputs=tuple(described), outputs=OUTPUTS[sig],
                                        output_batch_group=OUTPUT_GROUPS[sig])
    signatures["serving_default"] = SignatureDecl(same_as="predict")
    return ExportRecord(
        # The support labels adapt_and_predict takes: {"values": [0, 1]} for clicks, the train
        # split's {"min", "max"} for ratings (gmeta serve and the graph refuse others).
        label=dataclasses.replace(label_rule(model), name=schema["label"]["name"]),
        signatures=signatures,
        ids={
            "dtype": "int64",
            "hashed_strings": "blake2b(utf-8, digest_size=8) as little-endian int & 0x7FFFFFFFFFFFFFFF "
                              "(gmeta_tf.data.task_format.hash_strings)",
            "multi_hot_padding": fmt.PAD_ID,
            "unknown": "an id the table does not hold scores with a zero embedding, as in gmeta eval; "
                       "multi-hot features mean-pool their ids >= 0",
            "rare": "features in input_transforms.rare_ids read every id outside the train split's frequent "
                    "set (count >= min_id_count), except -1, as rare_id before the lookup, as Meta-IO does",
        },
        # What the graph does to the inputs before the model (Meta-IO's rules): send real ids and
        # only the dense_inputs columns; computed_dense are appended from the real ids.
        input_transforms=model.inputs.describe(),
        adaptation={"algo": cfg.meta.algo, "adapt": cfg.meta.adapt, "solver": cfg.meta.inner_solver,
                    "steps": steps, "lr": lr, "embedding_lr": cfg.meta.embedding_inner_lr,
                    "support_loss": cfg.meta.support_loss,
                    "irls_steps": cfg.meta.irls_steps if cfg.meta.support_loss == "absolute" else 0,
                    "ridge_lambda": "learned per feature" if RIDGE_PRIOR in model.dense_variables
                    else cfg.meta.ridge_lambda,
                    # the support must come oldest first: the newest samples weigh most
                    "support_half_life": (math.exp(float(model.dense_variables[SUPPORT_HALF_LIFE].numpy()[0]))
                                          if SUPPORT_HALF_LIFE in model.dense_variables else None),
                    # model.neighbourhood: the query also gains the support residuals of similar items
                    "neighbourhood": neighbourhood.KEY in model.dense_variables},
        tables={t.name: {"rows": int(t.ids.shape[0]), "dim": t.dim} for t in model.tables},
        source={"run": run_dir, "checkpoint": checkpoint, "step": step,
                "data": {"path": cfg.data.path, "fingerprint": fmt.schema_fingerprint(schema)}},
    )
