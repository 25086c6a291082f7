"""Request values → numpy arrays a signature accepts, or ``BadRequest`` naming the input.

The rules follow what a careful client expects: JSON integers feed integer and float inputs,
JSON floats feed only float inputs (an id of 1.5 is a bug, not something to truncate), strings
feed only string inputs, and the rank and every fixed dimension must match the TensorSpec.
Float values must be finite once cast (1e39 is infinity in float32): one NaN would make a score,
or with a support set every score, NaN. Labels must be ones the model was trained on. Every
message about a value names its input and row.
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


def _row(arr: np.ndarray, flat_index: int) -> int:
    return int(np.unravel_index(flat_index, arr.shape)[0]) if arr.ndim else 0


def int_range_problem(name: str, src: np.ndarray, info: TensorInfo) -> None:
    """Integers beyond the id dtype's range, named with their row. They may also arrive as floats
    (orjson reads an integer over 2^64 as a float; numpy turns a list mixing ints over 2^63 with
    others into floats) or as Python ints (object arrays): name the value, not a dtype the
    client never sent. Anything else (a real float such as 1.5) is left to the kind check."""
    lo, hi = np.iinfo(info.dtype).min, np.iinfo(info.dtype).max
    flat = src.ravel()
    if src.dtype.kind in "iu":
        if not flat.size or lo <= int(flat.min()) and int(flat.max()) <= hi:
            return
    elif src.dtype.kind == "f":
        if not (np.isfinite(flat) & (flat == np.floor(flat))).all():
            return
    elif src.dtype != np.object_ or not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        return
    # Python compares ints and floats exactly (numpy would round 2^63 - 1 to the float 2^63). A
    # float at a range's end stands for an integer rounded onto it (-2^63 - 1 reads as -2^63).
    if src.dtype.kind == "f":
        out = [i for i, v in enumerate(flat.tolist()) if not lo < v < hi]
    else:
        out = [i for i, v in enumerate(flat.tolist()) if not lo <= v <= hi]
    if out:
        i = out[0]
        raise BadRequest(f"input {name!r} row {_row(src, i)}: {flat[i]!r} is outside the {info.dtype_text()} "
                         f"range [{lo}, {hi}]")


def fit(name: str, src: np.ndarray, info: TensorInfo, sent: str = "") -> np.ndarray:
    """``src`` cast to the input's dtype after checking kind, range, finiteness, rank and fixed dims."""
    want = info.dtype_text()
    if src.size == 0 and src.ndim == 1 and info.shape is not None and len(info.shape) > 1:
        src = src.reshape((0, *(d or 0 for d in info.shape[1:])))  # `[]`: no rows of a matrix input
    if info.dtype.kind in "iu":
        int_range_problem(name, src, info)
    if not kind_fits(src, info.dtype):
        raise BadRequest(f"input {name!r} must be {want}, got {sent or kind_text(src)}")
    if info.shape is not None:
        if src.ndim != len(info.shape):
            raise BadRequest(f"input {name!r} must have rank {len(info.shape)} (shape {info.shape_text()}), "
                             f"got shape {list(src.shape)}")
        for axis, (want_dim, got) in enumerate(zip(info.shape, src.shape)):
            if want_dim is not None and want_dim != got:
                raise BadRequest(f"input {name!r} dimension {axis} must be {want_dim} (shape {info.shape_text()}), "
                                 f"got shape {list(src.shape)}")
    if info.dtype == np.object_:
        return np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(src)
    if info.dtype.kind != "f":
        return src.astype(info.dtype, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        out = src.astype(info.dtype, copy=False)
    bad = np.flatnonzero(~np.isfinite(out.ravel()))
    if len(bad):  # NaN, inf, or beyond the dtype (1e39 is inf in float32): a score would be NaN
        i = int(bad[0])
        raise BadRequest(f"input {name!r} row {_row(out, i)}: {src.ravel()[i]!r} is not a finite {want} "
                         f"(NaN, infinity, or beyond ±{np.finfo(info.dtype).max:.3g})")
    return out


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
    """Inputs of one declared batch group must have one leading size (``Signature.batch_groups``),
    and the inputs the outputs follow at least one row: there would be nothing to score. (A
    declared group the outputs do not follow may be empty: ``adapt_and_predict`` with no support
    samples scores as ``predict``.)"""
    groups = sig.batch_groups
    for group, names in sorted(groups.items()):
        sizes = {n: int(arrays[n].shape[0]) for n in names}
        if len(set(sizes.values())) > 1:
            shown = ", ".join(f"{n}={s}" for n, s in sizes.items())
            first = min(sizes, key=lambda n: (list(sizes.values()).count(sizes[n]), n))
            raise BadRequest(f"input {first!r}: mismatched batch sizes, the {group!r} inputs must share one ({shown})")
    if sig.declared:
        scored = groups.get(sig.output_group, ())
    else:
        scored = tuple(n for n, t in sorted(sig.inputs.items()) if t.batched)
    for n in scored:
        if arrays[n].shape[0] == 0:
            raise BadRequest(f"input {n!r} has an empty batch (0 rows): nothing to score")


def check_labels(sig: Signature, arrays: Dict[str, np.ndarray]) -> None:
    """Label inputs hold only labels the model was trained on (``LabelRule``)."""
    for name, rule in sorted(sig.labels.items()):
        flat = arrays[name].ravel()
        bad = np.flatnonzero(~rule.allows(flat))
        if len(bad):
            i = int(bad[0])
            raise BadRequest(f"input {name!r} row {_row(arrays[name], i)}: {float(flat[i]):g} is not a label the "
                             f"model was trained on ({rule.text()})")


def check_request(sig: Signature, arrays: Dict[str, np.ndarray]) -> None:
    """Everything checked across inputs, once each input fits its spec."""
    check_batches(sig, arrays)
    check_labels(sig, arrays)
