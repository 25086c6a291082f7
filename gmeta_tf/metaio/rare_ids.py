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

Whatever counts ids for the tables must count the ids this rule emits, not the prepared ones:
``pooled_profiles`` maps the id profile (``data/id_profile.py``, raw ids by design, see above)
through ``remap``, so the hot tier (``embedding/hot``: the hot set, ``hot.select: bytes``,
``model.hot_split: auto``, the coverage it prints) sees ``RARE_ID`` with the summed count of the
ids it stands for, and never a rare id the reader cannot emit.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Mapping, Tuple

import numpy as np

from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.id_profile import TableProfile
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


def pooled_counts(ids: np.ndarray, counts: np.ndarray, frequent: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The ids the reader emits for ``ids`` (``remap``) with their ``counts`` summed per emitted id,
    in decreasing count (ties: increasing id, the profile's order). ``RARE_ID`` is always listed,
    with count 0 when no id of ``ids`` is rare: the reader still emits it for an id the train split
    never saw (validation, eval), so a table cannot be served without it (``select.HotSet.local_only``)."""
    out = remap(np.asarray(ids, np.int64), frequent)
    u, inv = np.unique(np.append(out, np.int64(fmt.RARE_ID)), return_inverse=True)
    c = np.bincount(inv, weights=np.append(np.asarray(counts, np.int64), 0), minlength=u.size).astype(np.int64)
    order = np.lexsort((u, -c))
    return u[order], c[order]


def pooled_profiles(profiles: Mapping[str, TableProfile], path: str, schema: dict,
                    min_id_count: Mapping[str, int]) -> Dict[str, TableProfile]:
    """``profiles`` (raw ids, ``data/id_profile.py``) as the reader sees them under ``min_id_count``:
    each listed feature's profile with its ids mapped by ``remap`` against ``path``'s train counts
    and the counts of the ids pooled into ``RARE_ID`` summed into its count (``pooled_counts``).
    Lookups and completeness are unchanged: the same train lookups, now counted on emitted ids.
    With a sketch or a cut profile only the recorded rare ids add to ``RARE_ID``'s count, a lower
    bound; the unrecorded tail stays the profile's tail, as before. Other tables are passed as is."""
    if not min_id_count:
        return dict(profiles)
    frequent = frequent_ids(path, schema, min_id_count)
    out = dict(profiles)
    for name, keep in frequent.items():
        if name in out:
            ids, counts = pooled_counts(out[name].ids, out[name].counts, keep)
            distinct = int(np.count_nonzero(counts)) if out[name].distinct >= 0 and out[name].complete else -1
            out[name] = dataclasses.replace(out[name], ids=ids, counts=counts, distinct=distinct)
    return out
