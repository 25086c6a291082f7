"""TF Serving's REST predict body (``/v1/models/NAME:predict``), in and out.

Request: ``{"signature_name": S, "instances": [...]}`` (row format: one object per sample, every
input in each; not for a signature whose export declares several batch groups) or ``{"signature_name": S, "inputs":
{name: value}}`` (columnar format). A signature with a single input also takes bare values.
Response: ``{"predictions": ...}`` for rows, ``{"outputs": ...}`` for columns, each a bare list
when the signature has one output and keyed by output name otherwise -- as TF Serving answers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

import numpy as np
import orjson

from gmeta_tf.serve.signatures import DEFAULT_SIGNATURE, Signature
from gmeta_tf.serve.tensors import BadRequest, as_array, check_names, check_request, fit

_FIELDS = ("signature_name", "instances", "inputs")


@dataclass
class V1Request:
    signature: Signature
    arrays: Dict[str, np.ndarray]
    rows: bool  # row ("instances") format: answer with "predictions"


def pick_signature(signatures: Dict[str, Signature], name: Any, field: str) -> Signature:
    if not isinstance(name, str):
        raise BadRequest(f"{field} must be a string, got {name!r}")
    if name not in signatures:
        raise BadRequest(f"{field}: unknown signature {name!r} (this model has: {', '.join(sorted(signatures))})")
    return signatures[name]


def _body(payload: Any) -> Dict[str, Any]:
    if isinstance(payload, (bytes, str)):  # a body sent without a JSON content type
        try:
            payload = orjson.loads(payload)
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"malformed JSON body: {e}") from None
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object with \"instances\" or \"inputs\"")
    unknown = sorted(set(payload) - set(_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r} (expected {', '.join(_FIELDS)})")
    if ("instances" in payload) == ("inputs" in payload):
        raise BadRequest("give exactly one of \"instances\" (row format) and \"inputs\" (columnar format)")
    return payload


def _columns_from_rows(sig: Signature, instances: Any) -> Dict[str, Any]:
    if not isinstance(instances, list) or not instances:
        raise BadRequest("instances must be a non-empty list (one entry per sample)")
    if len(sig.batch_groups) > 1:
        groups = ", ".join(sorted(sig.batch_groups))
        raise BadRequest(f"signature {sig.name!r} takes inputs with different batch sizes (its export declares "
                         f"the batch groups {groups}): the row format cannot carry them, send the columnar "
                         "\"inputs\" format")
    if len(sig.inputs) == 1 and not all(isinstance(row, dict) for row in instances):
        return {next(iter(sig.inputs)): instances}
    columns: Dict[str, list] = {name: [] for name in sig.inputs}
    for i, row in enumerate(instances):
        if not isinstance(row, dict):
            raise BadRequest(f"instances[{i}] must be an object mapping input names to values")
        check_names(sig, row, f"instances[{i}]")
        for name, value in row.items():
            columns[name].append(value)
    return columns


def parse(payload: Any, signatures: Dict[str, Signature]) -> V1Request:
    body = _body(payload)
    sig = pick_signature(signatures, body.get("signature_name", DEFAULT_SIGNATURE), "signature_name")
    rows = "instances" in body
    if rows:
        columns = _columns_from_rows(sig, body["instances"])
    else:
        columns = body["inputs"]
        if not isinstance(columns, dict):
            if len(sig.inputs) != 1:
                raise BadRequest("inputs must be an object mapping input names to values")
            columns = {next(iter(sig.inputs)): columns}
        check_names(sig, columns, "inputs")
    arrays = {name: fit(name, as_array(name, value), sig.inputs[name]) for name, value in columns.items()}
    check_request(sig, arrays)
    return V1Request(signature=sig, arrays=arrays, rows=rows)


def _plain(arr: np.ndarray) -> Any:
    if arr.dtype == np.object_:
        return np.vectorize(lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else v,
                            otypes=[object])(arr).tolist()
    return arr.tolist()


def encode(request: V1Request, outputs: Dict[str, np.ndarray]) -> Dict[str, Any]:
    if not request.rows:
        if len(outputs) == 1:
            return {"outputs": _plain(next(iter(outputs.values())))}
        return {"outputs": {k: _plain(v) for k, v in outputs.items()}}
    if len(outputs) == 1:
        return {"predictions": _plain(next(iter(outputs.values())))}
    columns = {k: _plain(v) for k, v in outputs.items()}
    n = len(next(iter(columns.values())))
    return {"predictions": [{k: col[i] for k, col in columns.items()} for i in range(n)]}
