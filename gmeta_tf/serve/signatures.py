"""A SavedModel's signatures as plain specs: what a request must carry, read from the model.

Nothing about the gmeta export is hard-coded: input names, dtypes and shapes come from each
signature's ``TensorSpec``s, so any SavedModel with signatures can be served.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from gmeta_tf.errors import UserError

DEFAULT_SIGNATURE = "serving_default"


class ModelDirError(UserError):
    """``--model`` is not a loadable SavedModel with signatures."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype  # numpy dtype of the TensorSpec (object for tf.string)
    shape: Optional[Tuple[Optional[int], ...]]  # None: unknown rank; None entries: any size

    def shape_text(self) -> str:
        if self.shape is None:
            return "any shape"
        return "[" + ", ".join("N" if d is None else str(d) for d in self.shape) + "]"

    def dtype_text(self) -> str:
        return "string" if self.dtype == np.object_ else self.dtype.name


@dataclass(frozen=True)
class Signature:
    name: str
    inputs: Dict[str, TensorInfo]
    outputs: Dict[str, TensorInfo]
    # Inputs that must share one leading (batch) size, keyed by group ("" for the ungrouped).
    batch_groups: Dict[str, Tuple[str, ...]]


def batch_groups(inputs: Dict[str, TensorInfo]) -> Dict[str, Tuple[str, ...]]:
    """Which inputs share a batch size, from their names: ``<group>_<field>`` when two or more
    inputs share ``<group>`` (``support_*``, ``query_*``), all other batched inputs together.

    A signature's TensorSpecs say only that the leading dim is free, not which inputs must agree;
    TensorFlow would broadcast a batch of 1 against a batch of N without complaint, so the server
    checks this itself, naming the inputs, before calling the model.
    """
    batched = [n for n, t in sorted(inputs.items()) if t.shape is not None and t.shape and t.shape[0] is None]
    prefix = Counter(n.split("_", 1)[0] for n in batched if "_" in n)
    groups: Dict[str, list] = {}
    for n in batched:
        head = n.split("_", 1)[0] if "_" in n else ""
        groups.setdefault(head if prefix.get(head, 0) >= 2 else "", []).append(n)
    return {g: tuple(names) for g, names in groups.items()}


def _info(name: str, spec: Any) -> TensorInfo:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorInfo(name=name, dtype=np.dtype(spec.dtype.as_numpy_dtype), shape=shape)


def describe(name: str, fn: Any) -> Signature:
    """The specs of one concrete signature function of a loaded SavedModel."""
    _, kwargs = fn.structured_input_signature
    inputs = {k: _info(k, spec) for k, spec in kwargs.items()}
    outputs = {k: _info(k, spec) for k, spec in fn.structured_outputs.items()}
    return Signature(name=name, inputs=inputs, outputs=outputs, batch_groups=batch_groups(inputs))


def load_saved_model(model_dir: str) -> Tuple[Any, Dict[str, Signature]]:
    """``tf.saved_model.load`` plus the specs of every signature; ``ModelDirError`` names the path."""
    import tensorflow as tf

    path = Path(model_dir)
    if not path.is_dir():
        raise ModelDirError(f"--model {model_dir}: no such directory (expected a SavedModel, e.g. from gmeta export)")
    if not tf.saved_model.contains_saved_model(str(path)):
        raise ModelDirError(f"--model {model_dir} is not a SavedModel (no saved_model.pb or saved_model.pbtxt)")
    try:
        loaded = tf.saved_model.load(str(path))
    except (tf.errors.OpError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"--model {model_dir}: the SavedModel does not load: {first}") from None
    signatures = {name: describe(name, fn) for name, fn in loaded.signatures.items()}
    if not signatures:
        raise ModelDirError(f"--model {model_dir}: the SavedModel has no signatures to serve")
    return loaded, signatures
