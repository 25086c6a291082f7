"""A SavedModel's signatures as plain specs: what a request must carry, read from the model.

Input names, dtypes and shapes come from each signature's ``TensorSpec``s, so any SavedModel
with signatures can be served. What a TensorSpec cannot say comes from what the export declares
in ``assets.extra/export.json`` (``gmeta export`` writes it; its record: ``export_format.py``):

* which inputs share a first (batch) dimension: each input's ``batch_group``, and the group the
  outputs follow (``output_batch_group``). A spec's leading ``None`` says only that the size is
  free; TensorFlow would broadcast a batch of 1 against N without complaint, and input names
  are the data's feature names (``user_city`` and ``item_id`` belong to one sample), so the
  server takes the groups from the declaration, never from names;
* the value that pads a row's list (``pad``; multi-hot ids pad with -1), so requests with
  lists of different lengths can be merged into one call;
* the labels a label input may take (``label``: 0/1 for a click model, the training range for
  a rating model).

A SavedModel without that file (any stock one) is served with no batch groups: the row format
still works (each row carries every input, as in TF Serving), the model itself judges batch
sizes, and no signature is micro-batched (``batcher.not_batchable`` says why at start-up).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from gmeta_tf import export_format
from gmeta_tf.errors import UserError
from gmeta_tf.export_format import ExportRecord, InputDecl, LabelRule

DEFAULT_SIGNATURE = "serving_default"
EXPORT_MANIFEST = export_format.PATH


class ModelDirError(UserError):
    """``--model`` is not a loadable SavedModel with signatures."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype  # numpy dtype of the TensorSpec (object for tf.string)
    shape: Optional[Tuple[Optional[int], ...]]  # None: unknown rank; None entries: any size
    group: Optional[str] = None  # declared batch group; None: not declared
    pad: Any = None  # declared value that pads the free dims after the first; None: not declared

    def shape_text(self) -> str:
        if self.shape is None:
            return "any shape"
        return "[" + ", ".join("N" if d is None else str(d) for d in self.shape) + "]"

    def dtype_text(self) -> str:
        return "string" if self.dtype == np.object_ else self.dtype.name

    @property
    def batched(self) -> bool:
        return self.shape is not None and len(self.shape) > 0 and self.shape[0] is None


@dataclass(frozen=True)
class Signature:
    name: str
    inputs: Dict[str, TensorInfo]
    outputs: Dict[str, TensorInfo]
    output_group: Optional[str] = None  # the batch group the outputs follow, when declared
    labels: Dict[str, LabelRule] = field(default_factory=dict)  # label inputs and what they may hold

    @property
    def declared(self) -> bool:
        """The export declares this signature's batch groups."""
        return any(t.group is not None for t in self.inputs.values())

    @property
    def batch_groups(self) -> Dict[str, Tuple[str, ...]]:
        """Inputs that must share one leading (batch) size, by declared group; {} when undeclared."""
        groups: Dict[str, list] = {}
        for name, t in sorted(self.inputs.items()):
            if t.group is not None and t.batched:
                groups.setdefault(t.group, []).append(name)
        return {g: tuple(names) for g, names in groups.items()}


def _info(name: str, spec: Any, declared: Optional[InputDecl] = None) -> TensorInfo:
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    declared = declared or InputDecl(name)
    return TensorInfo(name=name, dtype=np.dtype(spec.dtype.as_numpy_dtype), shape=shape,
                      group=declared.batch_group, pad=declared.pad)


def describe(name: str, fn: Any, manifest: Optional[ExportRecord] = None) -> Signature:
    """The specs of one concrete signature function of a loaded SavedModel, with what
    ``manifest`` (the export's ``export.json``, if any) declares about it."""
    _, kwargs = fn.structured_input_signature
    declared = manifest.signature(name) if manifest is not None else None
    by_name = {x.name: x for x in declared.inputs} if declared is not None else {}
    inputs = {k: _info(k, spec, by_name.get(k)) for k, spec in kwargs.items()}
    outputs = {k: _info(k, spec) for k, spec in fn.structured_outputs.items()}
    rule = manifest.label if manifest is not None else None
    labels = {k: rule for k in inputs
              if rule is not None and rule.constrains and k in by_name and by_name[k].role == "label"}
    return Signature(name=name, inputs=inputs, outputs=outputs,
                     output_group=declared.output_batch_group if declared is not None else None, labels=labels)


def read_manifest(model_dir: Path) -> Optional[ExportRecord]:
    """The export's ``assets.extra/export.json``, or None for a SavedModel without one."""
    try:
        return export_format.read(model_dir)
    except export_format.ExportFileError as e:
        raise ModelDirError(f"--model {model_dir}: {e}") from None


def _check_declared(model_dir: Path, sig: Signature, manifest: ExportRecord) -> None:
    """An export.json that names inputs the signature lacks belongs to another model."""
    names = {x.name for x in manifest.signature(sig.name).inputs}
    if names and names != set(sig.inputs):
        extra = sorted(n for n in names ^ set(sig.inputs) if n is not None)
        raise ModelDirError(f"--model {model_dir}: {EXPORT_MANIFEST} does not describe signature {sig.name!r} "
                            f"of this SavedModel (inputs differ: {', '.join(extra)}); was it copied from another export?")


def load_saved_model(model_dir: str) -> Tuple[Any, Dict[str, Signature]]:
    """``tf.saved_model.load`` plus the specs of every signature; ``ModelDirError`` names the path."""
    import tensorflow as tf

    path = Path(model_dir)
    if not path.is_dir():
        raise ModelDirError(f"--model {model_dir}: no such directory (expected a SavedModel, e.g. from gmeta export)")
    if not tf.saved_model.contains_saved_model(str(path)):
        raise ModelDirError(f"--model {model_dir} is not a SavedModel (no saved_model.pb or saved_model.pbtxt)")
    manifest = read_manifest(path)
    try:
        loaded = tf.saved_model.load(str(path))
    except (tf.errors.OpError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(f"--model {model_dir}: the SavedModel does not load: {first}") from None
    signatures = {name: describe(name, fn, manifest) for name, fn in loaded.signatures.items()}
    if not signatures:
        raise ModelDirError(f"--model {model_dir}: the SavedModel has no signatures to serve")
    for sig in signatures.values():
        if manifest is not None:
            _check_declared(path, sig, manifest)
    return loaded, signatures
