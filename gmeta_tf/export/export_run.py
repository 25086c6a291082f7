"""``gmeta export``: a run's checkpoint → a SavedModel that stock TensorFlow serves.

Layout of the output directory::

    saved_model.pb, fingerprint.pb, variables/   the SavedModel (stock ops only; tag "serve")
    assets.extra/export.json                      signatures, inputs, unknown-id policy, source
    assets.extra/schema.json                      the prepared data's schema.json (fingerprint)
    assets.extra/config.yaml                      the run's config, which built the model

The model is built from the run's ``config.yaml`` and the prepared data's ``schema.json``,
like ``gmeta eval`` builds it, and refused when that data's fingerprint differs from the one
the checkpoint was trained on. The directory is written next to its final place and renamed
into it only when complete (``data.atomic``): a failed export leaves no half-written output.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import tensorflow as tf

from gmeta_tf import export_format
from gmeta_tf.config.loader import config_text
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.atomic import atomic_dir
from gmeta_tf.errors import CheckpointError
from gmeta_tf.export.frozen_run import pick_run
from gmeta_tf.export.manifest import export_manifest
from gmeta_tf.export.signatures import make_signatures, signature_inputs
from gmeta_tf.train.model_build import CONFIG_FILE


def export_run(run_dir: str, out: str, which: str = "best", overwrite: bool = False,
               log: Callable[[str], None] = print) -> dict:
    """Export checkpoint ``which`` (best | latest | a step) of ``run_dir`` to ``out``; returns
    the JSON written to ``out/assets.extra/export.json`` (``export_format``)."""
    run_dir, out_p = str(run_dir), Path(out)
    if out_p.is_dir() and not any(out_p.iterdir()):
        overwrite = True  # an empty directory holds nothing to lose
    if out_p.exists() and not overwrite:  # refused before any work
        raise CheckpointError(f"output {out} already exists and is not empty; pass --overwrite to replace it")
    run = pick_run(run_dir, which, action="export", strict=True)
    cfg, schema, ckpt = run.cfg, run.schema, run.checkpoint
    log(f"exporting {ckpt} (step {run.step})")
    model = run.model()
    signatures = make_signatures(model, cfg)
    manifest = export_manifest(model, cfg, schema, signature_inputs(model), run_dir, ckpt, run.step)
    with atomic_dir(out_p, overwrite) as tmp:
        tf.saved_model.save(model, str(tmp), signatures=signatures)
        written = export_format.write(tmp, manifest)
        extra = tmp / export_format.EXTRA_DIR
        (extra / fmt.SCHEMA_FILE).write_text(json.dumps(schema, indent=1))
        (extra / CONFIG_FILE).write_text(config_text(cfg))
    return written
