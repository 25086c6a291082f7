"""``data.min_id_count``: ids seen fewer than k times in the train split are read as ``RARE_ID``.

Why here and not in ``prepare``: the prepared files must keep the real ids, because everything
else keyed by them (``gmeta eval``'s item-mean baselines, id profiles, the hot-id planner) must
not change when a model chooses to pool rare ids; and ``k`` is a modelling choice that can be
tuned without preparing the data again. So the remap is one vectorized lookup per id column in
``decode``, applied to train, validation and eval batches alike, against the train-split counts
``prepare`` writes (``id_counts/<col>.npz``, see ``task_format.py``).

Rule (the one an export must reproduce): an id ``x`` of feature ``f`` with ``k = min_id_count[f]``
stays ``x`` if it occurs in ``id_counts/f.npz`` with a count >= k; a padding id (``PAD_ID``)
stays padding; every other id -- rare in training or never seen there -- becomes ``RARE_ID``.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping

import numpy as np

from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError


def frequent_ids(path: str, schema: dict, min_id_count: Mapping[str, int]) -> Dict[str, np.ndarray]:
    """``{feature: sorted ids whose train count >= k}`` for every feature in ``min_id_count``."""
    features = [c["name"] for c in schema.get("categorical") or []] + [c["name"] for c in schema.get("multi_hot") or []]
    files = schema.get("id_counts") or {}
    out: Dict[str, np.ndarray] = {}
    for name, k in min_id_count.items():
        if name not in features:
            raise DataError(f"data.min_id_count: '{name}' is not a categorical or multi-hot feature of {path} "
                            f"(features: {', '.join(features) or 'none'})")
        if name not in files:
            raise DataError(f"data.min_id_count.{name}: {path} has no train id counts for it; "
                            "re-run 'gmeta data prepare' (it writes id_counts/ since this feature)")
        file = os.path.join(path, files[name])
        try:
            with np.load(file) as z:
                ids, counts = np.asarray(z["ids"], np.int64), np.asarray(z["counts"], np.int64)
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{file}: cannot read the id counts for data.min_id_count.{name}: {e}") from None
        keep = np.sort(ids[counts >= int(k)])
        if keep.size and keep[-1] == fmt.RARE_ID:
            raise DataError(f"{file}: feature '{name}' has a real id equal to RARE_ID ({fmt.RARE_ID}), "
                            f"so rare ids cannot be pooled; drop data.min_id_count.{name}")
        out[name] = keep
    return out


def remap(ids: np.ndarray, frequent: np.ndarray) -> np.ndarray:
    """``ids`` with every id not in ``frequent`` (sorted) replaced by ``RARE_ID``; padding kept."""
    if frequent.size == 0:
        return np.where(ids == fmt.PAD_ID, ids, np.int64(fmt.RARE_ID))
    pos = np.minimum(np.searchsorted(frequent, ids), frequent.size - 1)
    keep = (frequent[pos] == ids) | (ids == fmt.PAD_ID)
    return np.where(keep, ids, np.int64(fmt.RARE_ID))
