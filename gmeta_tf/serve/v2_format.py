"""Open Inference Protocol v2 (``/v2/models/NAME/infer``), in and out.

The protocol has no signature field, so the request parameter ``signature_name`` picks one
(default ``serving_default``); the response echoes it in its parameters. A declared
``datatype`` must fit the input the way JSON values must (``tensors.fit``); JSON data that
contradicts its own declared datatype (``INT64`` holding 1.5) is refused rather than truncated.
"""
from __future__ import annotations

import uuid
from typing import Dict, Tuple

import numpy as np

from gmeta_tf.serve.kserve_lib import InferOutput, InferRequest, InferResponse, InvalidInput, from_np_dtype, to_np_dtype
from gmeta_tf.serve.signatures import DEFAULT_SIGNATURE, Signature, TensorInfo
from gmeta_tf.serve.tensors import (
    BadRequest,
    as_array,
    check_names,
    check_request,
    fit,
    int_range_problem,
    kind_fits,
    kind_text,
)
from gmeta_tf.serve.v1_format import pick_signature

SIGNATURE_PARAMETER = "signature_name"


def _array(inp, sig: Signature) -> np.ndarray:
    name = inp.name
    dtype = to_np_dtype(inp.datatype)
    if dtype is None:
        raise BadRequest(f"input {name!r}: unknown datatype {inp.datatype!r}")
    if isinstance(inp.data, list):  # JSON data: its own kind must agree with the declared datatype
        raw = as_array(name, inp.data)
        if np.dtype(dtype).kind in "iu":  # before numpy casts it, or fails to (OverflowError)
            int_range_problem(name, raw.reshape(inp.shape) if raw.size == np.prod(inp.shape) else raw,
                              TensorInfo(name, np.dtype(dtype), None))
        if not kind_fits(raw, np.dtype(dtype)):
            raise BadRequest(f"input {name!r} declares {inp.datatype} but its data holds {kind_text(raw)}")
    try:
        arr = inp.as_numpy()
    except (ValueError, TypeError, InvalidInput) as e:
        raise BadRequest(f"input {name!r}: data does not fit shape {list(inp.shape)} and datatype "
                         f"{inp.datatype} ({e})") from None
    return fit(name, arr, sig.inputs[name], sent=inp.datatype)


def parse(request: InferRequest, signatures: Dict[str, Signature]) -> Tuple[Signature, Dict[str, np.ndarray]]:
    params = request.parameters or {}
    sig = pick_signature(signatures, params.get(SIGNATURE_PARAMETER, DEFAULT_SIGNATURE),
                         f"parameters.{SIGNATURE_PARAMETER}")
    names = [inp.name for inp in request.inputs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise BadRequest(f"inputs: input {duplicated[0]!r} is given more than once")
    check_names(sig, names, "inputs")
    arrays = {inp.name: _array(inp, sig) for inp in request.inputs}
    check_request(sig, arrays)
    return sig, arrays


def encode(model_name: str, request: InferRequest, sig: Signature, outputs: Dict[str, np.ndarray]) -> InferResponse:
    infer_outputs = []
    for name, arr in outputs.items():
        out = InferOutput(name=name, shape=list(arr.shape), datatype=from_np_dtype(arr.dtype))
        out.set_data_from_numpy(arr, binary_data=False)
        infer_outputs.append(out)
    return InferResponse(response_id=request.id or str(uuid.uuid4()), model_name=model_name,
                         infer_outputs=infer_outputs, parameters={SIGNATURE_PARAMETER: sig.name})
