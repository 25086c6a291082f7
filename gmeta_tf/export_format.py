"""``assets.extra/export.json``: the contract between ``gmeta export`` and whoever serves its
SavedModel, written and read here only (as ``data/task_format.py`` is for the prepared data).

Why one owner: the file says what a TensorSpec cannot (which inputs share a batch dimension,
what pads a list, which labels the model takes), and the server acts on it. When the writer
built dicts and the reader picked them apart with string literals of its own, a renamed key
would have left the server silently serving without batch groups. So both sides go through
``ExportRecord``: typed where a reader acts on it (signatures, inputs, the label rule), plain
JSON where it only documents (ids, input transforms, adaptation, tables, source).

Reading is lenient on purpose: a SavedModel exported elsewhere may carry a partial file, and
what it does not declare is simply not relied on (``serve/signatures.py``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from gmeta_tf.errors import UserError

FORMAT = 1
EXTRA_DIR = "assets.extra"  # TensorFlow copies this directory with the SavedModel, untouched
FILE = "export.json"
PATH = Path(EXTRA_DIR) / FILE  # relative to the export directory


class ExportFileError(UserError):
    """``export.json`` exists but is not a JSON object."""


@dataclass(frozen=True)
class LabelRule:
    """The labels a model was trained on: a set of ``values`` (clicks) or a ``[low, high]`` range."""

    kind: str
    values: Optional[Tuple[float, ...]] = None
    low: Optional[float] = None
    high: Optional[float] = None
    name: Optional[str] = None  # the data's label column

    @property
    def constrains(self) -> bool:
        return self.values is not None or self.low is not None or self.high is not None

    def allows(self, labels: np.ndarray) -> np.ndarray:
        if self.values is not None:
            return np.isin(labels, self.values)
        ok = np.ones(labels.shape, bool)
        if self.low is not None:
            ok &= labels >= self.low
        if self.high is not None:
            ok &= labels <= self.high
        return ok

    def text(self) -> str:
        if self.values is not None:
            return f"a {self.kind} model takes {' or '.join(f'{v:g}' for v in self.values)}"
        return f"this {self.kind} model was trained on labels in [{self.low:g}, {self.high:g}]"

    def to_json(self) -> dict:
        d: Dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.values is not None:
            d["values"] = list(self.values)
        if self.low is not None or self.high is not None:
            d.update({"min": self.low, "max": self.high})
        return d

    @classmethod
    def from_json(cls, d: dict) -> "LabelRule":
        values = tuple(float(v) for v in d["values"]) if "values" in d else None
        return cls(str(d.get("kind")), values=values, low=d.get("min"), high=d.get("max"), name=d.get("name"))


@dataclass(frozen=True)
class InputDecl:
    """One signature input as declared: what the TensorSpec of the same name does not say."""

    name: Optional[str]
    feature: Optional[str] = None  # schema.json's feature name ("dense" / "label" for those)
    role: Optional[str] = None  # categorical | multi_hot | dense | label
    dtype: Optional[str] = None
    shape: Optional[Tuple[int, ...]] = None  # -1: any size
    batch_group: Optional[str] = None  # inputs of one group share their first dimension
    pad: Any = None  # what pads a row's list (multi-hot: -1); None: no list to pad
    hashed: Optional[bool] = None  # the feature's ids are hashed strings
    features: Optional[Tuple[str, ...]] = None  # a dense input's columns, in order

    def to_json(self) -> dict:
        d: Dict[str, Any] = {"name": self.name, "feature": self.feature, "role": self.role, "dtype": self.dtype,
                             "shape": list(self.shape or ()), "batch_group": self.batch_group}
        for key in ("pad", "hashed", "features"):
            value = getattr(self, key)
            if value is not None:
                d[key] = list(value) if key == "features" else value
        return d

    @classmethod
    def from_json(cls, d: dict) -> "InputDecl":
        shape, features = d.get("shape"), d.get("features")
        return cls(name=d.get("name"), feature=d.get("feature"), role=d.get("role"), dtype=d.get("dtype"),
                   shape=None if shape is None else tuple(shape), batch_group=d.get("batch_group"),
                   pad=d.get("pad"), hashed=d.get("hashed"),
                   features=None if features is None else tuple(features))


@dataclass(frozen=True)
class SignatureDecl:
    """A signature's declared inputs and outputs, or ``same_as`` another signature."""

    inputs: Tuple[InputDecl, ...] = ()
    outputs: Dict[str, str] = field(default_factory=dict)  # name → what it holds, in words
    output_batch_group: Optional[str] = None  # the batch group the outputs have one row per sample of
    same_as: Optional[str] = None

    def to_json(self) -> dict:
        if self.same_as is not None:
            return {"same_as": self.same_as}
        return {"inputs": [x.to_json() for x in self.inputs], "outputs": dict(self.outputs),
                "output_batch_group": self.output_batch_group}

    @classmethod
    def from_json(cls, d: dict) -> "SignatureDecl":
        return cls(inputs=tuple(InputDecl.from_json(x) for x in d.get("inputs") or []),
                   outputs=dict(d.get("outputs") or {}), output_batch_group=d.get("output_batch_group"),
                   same_as=d.get("same_as"))


@dataclass(frozen=True)
class ExportRecord:
    """The whole file. ``signature(name)`` is what a server reads; the rest documents the export."""

    label: Optional[LabelRule]
    signatures: Dict[str, SignatureDecl]
    ids: Dict[str, Any] = field(default_factory=dict)
    input_transforms: Dict[str, Any] = field(default_factory=dict)
    adaptation: Dict[str, Any] = field(default_factory=dict)
    tables: Dict[str, Dict[str, int]] = field(default_factory=dict)
    source: Dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT

    def signature(self, name: str) -> SignatureDecl:
        """Signature ``name``'s declaration, following ``same_as``; an empty one when undeclared."""
        entry = self.signatures.get(name) or SignatureDecl()
        seen = {name}
        while entry.same_as is not None and entry.same_as not in seen:
            seen.add(entry.same_as)
            entry = self.signatures.get(entry.same_as) or SignatureDecl()
        return entry

    def to_json(self) -> dict:
        return {"format": self.format, "label": self.label.to_json() if self.label else None,
                "signatures": {k: s.to_json() for k, s in self.signatures.items()},
                "ids": self.ids, "input_transforms": self.input_transforms, "adaptation": self.adaptation,
                "tables": self.tables, "source": self.source}

    @classmethod
    def from_json(cls, d: dict) -> "ExportRecord":
        label = d.get("label")
        return cls(label=LabelRule.from_json(label) if isinstance(label, dict) and label else None,
                   signatures={k: SignatureDecl.from_json(v or {}) for k, v in (d.get("signatures") or {}).items()},
                   ids=d.get("ids") or {}, input_transforms=d.get("input_transforms") or {},
                   adaptation=d.get("adaptation") or {}, tables=d.get("tables") or {},
                   source=d.get("source") or {}, format=d.get("format", FORMAT))


def write(export_dir: Path, record: ExportRecord) -> dict:
    """``record`` to ``export_dir/assets.extra/export.json`` (the directory is made); returns
    the JSON written."""
    extra = Path(export_dir) / EXTRA_DIR
    extra.mkdir(parents=True, exist_ok=True)
    data = record.to_json()
    (extra / FILE).write_text(json.dumps(data, indent=1))
    return data


def read(export_dir: Path) -> Optional[ExportRecord]:
    """The export's record, or None for a SavedModel without the file; ``ExportFileError``
    (naming the file) when it is not a JSON object."""
    path = Path(export_dir) / PATH
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExportFileError(f"{path} cannot be read as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ExportFileError(f"{path} must hold a JSON object")
    return ExportRecord.from_json(data)
