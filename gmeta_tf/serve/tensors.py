"""Request values → numpy arrays a signature accepts, or ``BadRequest`` naming the input.

The rules follow what a careful client expects: JSON integers feed integer and float inputs,
JSON floats feed only float inputs (an id of 1.5 is a bug, not something to truncate), strings
feed only string inputs, and the rank and every fixed dimension must match the TensorSpec.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable

import numpy as np

from gmeta_tf.serve.signatures import Signature, TensorInfo


class BadRequest(ValueError):
    """The request cannot be served as sent; the message names the field or input (HTTP 400)."""


_KIND_TEXT = {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings", "S": "strings",
              "O": "mixed or nested values"}


def kind_text(arr: np.ndarray) -> str:
    return _KIND_TEXT.get(arr.dtype.kind, arr.dtype.name)


def kind_fits(src: np.ndarray, target: np.dtype) -> bool:
    if src.size == 0:
        return True
    if target.kind in "iu":
        return src.dtype.kind in "iu"
    if target.kind == "f":
        return src.dtype.kind in "iuf"
    if target.kind == "b":
        return src.dtype.kind == "b"
    if target == np.object_:  # tf.string
        return src.dtype.kind in "USO" and all(isinstance(v, (str, bytes)) for v in src.ravel())
    return False


def as_array(name: str, value: Any) -> np.ndarray:
    """A JSON value as an array; ragged nesting is a 400 naming the input."""
    try:
        return np.asarray(value)
    except ValueError:
        raise BadRequest(f"input {name!r}: the nested lists are ragged (every row must have the same length)") from None


def fit(name: str, src: np.ndarray, info: TensorInfo, sent: str = "") -> np.ndarray:
    """``src`` cast to the input's dtype after checking kind, range, rank and fixed dims."""
    want = info.dtype_text()
    if not kind_fits(src, info.dtype):
        raise BadRequest(f"input {name!r} must be {want}, got {sent or kind_text(src)}")
    if info.dtype.kind in "iu" and src.size:
        lo, hi = np.iinfo(info.dtype).min, np.iinfo(info.dtype).max
        if int(src.min()) < lo or int(src.max()) > hi:
            raise BadRequest(f"input {name!r}: a value is outside the {want} range")
    if info.shape is not None:
        if src.ndim != len(info.shape):
            raise BadRequest(f"input {name!r} must have rank {len(info.shape)} (shape {info.shape_text()}), "
                             f"got shape {list(src.shape)}")
        for axis, (want_dim, got) in enumerate(zip(info.shape, src.shape)):
            if want_dim is not None and want_dim != got:
                raise BadRequest(f"input {name!r} dimension {axis} must be {want_dim} (shape {info.shape_text()}), "
                                 f"got shape {list(src.shape)}")
        if info.shape and info.shape[0] is None and src.shape[0] == 0:
            raise BadRequest(f"input {name!r} has an empty batch (0 rows)")
    if info.dtype == np.object_:
        return np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(src)
    return src.astype(info.dtype, copy=False)


def check_names(sig: Signature, names: Iterable[str], where: str) -> None:
    """Every input present, none unknown."""
    names = set(names)
    unknown = sorted(names - set(sig.inputs))
    if unknown:
        raise BadRequest(f"{where}: unknown input {unknown[0]!r} for signature {sig.name!r} "
                         f"(its inputs: {', '.join(sorted(sig.inputs))})")
    missing = sorted(set(sig.inputs) - names)
    if missing:
        info = sig.inputs[missing[0]]
        raise BadRequest(f"{where}: missing input {missing[0]!r} ({info.dtype_text()} {info.shape_text()}) "
                         f"for signature {sig.name!r}")


def check_batches(sig: Signature, arrays: Dict[str, np.ndarray]) -> None:
    """Inputs of one batch group must have one leading size (see ``signatures.batch_groups``)."""
    for group, names in sig.batch_groups.items():
        sizes = {n: int(arrays[n].shape[0]) for n in names if arrays[n].ndim}
        if len(set(sizes.values())) > 1:
            shown = ", ".join(f"{n}={s}" for n, s in sizes.items())
            label = f"the {group}_* inputs" if group else "these inputs"
            first = min(sizes, key=lambda n: (list(sizes.values()).count(sizes[n]), n))
            raise BadRequest(f"input {first!r}: mismatched batch sizes, {label} must share one ({shown})")
