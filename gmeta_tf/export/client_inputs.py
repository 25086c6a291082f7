"""What a client of an export sends for one user, taken from a Meta-IO batch.

Meta-IO's batches are what the *model* sees: padded, dense features standardised, and (with
``data.min_id_count``) rare ids pooled. A client of the SavedModel has none of that: it sends
the real ids and the input's own dense columns, raw, and the graph does the rest
(``signatures.py``, ``input_transforms.py``). The parity test and the serve bench both turn
test users into requests with this one function, so they cannot drift from the contract in
``docs/export.md``. Read the batches without ``data.min_id_count`` (the real ids).
"""
from __future__ import annotations

from typing import Dict, List, Union

import numpy as np

from gmeta_tf.export_format import InputDecl
from gmeta_tf.metaio.decode import layout_from_schema

_BY_ROLE = {"categorical": "cat", "multi_hot": "multi"}


def task_inputs(batch: dict, t: int, inputs: List[Union[InputDecl, dict]], schema: dict) -> Dict[str, np.ndarray]:
    """Task ``t`` of ``batch`` as the inputs ``inputs`` (a signature's list in ``export.json``, as
    records or as its JSON) name them: padding removed, dense columns un-standardised and cut to
    the ones clients send."""
    layout = layout_from_schema(schema, 1, 1, 1)
    dense_names = [d["name"] for d in schema.get("dense") or []]
    out = {}
    for x in inputs:
        x = x if isinstance(x, InputDecl) else InputDecl.from_json(x)
        part = batch["support" if x.name.startswith("support_") else "query"]
        keep = part["mask"].numpy()[t] > 0
        value = part[_BY_ROLE[x.role]][x.feature] if x.role in _BY_ROLE else part[x.role]
        value = value.numpy()[t][keep]
        if x.role == "dense":
            value = value / layout.dense_inv_std + layout.dense_mean
            value = value[:, [dense_names.index(f) for f in x.features]]
        out[x.name] = value
    return out
