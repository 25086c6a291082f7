"""KServe, imported without it reading our command line, and exactly what of it we rely on.

``kserve.model_server`` parses ``sys.argv`` with argparse at import time (``parse_known_args``,
abbreviations allowed), so ``gmeta serve --model DIR`` would set KServe's ``--model_name`` to
DIR. Every KServe import in this package goes through here, with ``sys.argv`` cut to the program
name for the duration; everything KServe needs is passed to it explicitly instead.

``RELIED_ON`` names every KServe function and class used, with the parameters it is called
with: all public names, none of ``ModelServer``'s private methods or its module-global app (see
``server``). ``tests/test_serve_units.py`` checks them against the installed KServe, so an
upgrade that changes one fails there, naming it, instead of breaking the server silently.
"""
from __future__ import annotations

import sys

_argv, sys.argv = sys.argv, sys.argv[:1]
try:
    from kserve import Model, ModelRepository  # noqa: E402
    from kserve.errors import (  # noqa: E402
        InferenceError,
        InvalidInput,
        ModelNotFound,
        ModelNotReady,
        NoModelReady,
        ServerNotLive,
        ServerNotReady,
        UnsupportedProtocol,
        generic_exception_handler,
        inference_error_handler,
        model_not_ready_handler,
        not_implemented_error_handler,
        server_not_live_handler,
        server_not_ready_handler,
        unsupported_protocol_error_handler,
    )
    from kserve.logging import configure_logging  # noqa: E402
    from kserve.protocol.dataplane import DataPlane  # noqa: E402
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse  # noqa: E402
    from kserve.protocol.model_repository_extension import ModelRepositoryExtension  # noqa: E402
    from kserve.protocol.rest.server import metrics_handler  # noqa: E402
    from kserve.protocol.rest.v1_endpoints import register_v1_endpoints  # noqa: E402
    from kserve.protocol.rest.v2_endpoints import register_v2_endpoints  # noqa: E402
    from kserve.utils.numpy_codec import from_np_dtype, to_np_dtype  # noqa: E402
finally:
    sys.argv = _argv

# What KServe's own REST server registers for its errors (``RESTServer._add_exception_handlers``
# in 0.15.2), less the two client errors ``access_log`` answers without a traceback.
SERVER_ERROR_HANDLERS = {
    InferenceError: inference_error_handler,
    ModelNotReady: model_not_ready_handler,
    NotImplementedError: not_implemented_error_handler,
    UnsupportedProtocol: unsupported_protocol_error_handler,
    ServerNotLive: server_not_live_handler,
    ServerNotReady: server_not_ready_handler,
    Exception: generic_exception_handler,
}

_HANDLER = ("_", "exc")
# "module:attribute" -> the leading parameters we pass (positionally or by these names); None:
# used as a class or value only (subclassed, raised, caught, isinstance-checked).
RELIED_ON = {
    "kserve:Model": ("name",),  # subclassed by model.SavedModelServer, which overrides these five:
    "kserve:Model.load": ("self",),
    "kserve:Model.start": ("self",),
    "kserve:Model.predict": ("self", "payload", "headers"),
    "kserve:Model.get_input_types": ("self",),
    "kserve:Model.get_output_types": ("self",),
    "kserve:ModelRepository": ("models_dir",),
    "kserve:ModelRepository.update": ("self", "model", "name"),
    "kserve.protocol.dataplane:DataPlane": ("model_registry", "predictor_config"),
    "kserve.protocol.dataplane:DataPlane.live": (),
    "kserve.protocol.model_repository_extension:ModelRepositoryExtension": ("model_registry",),
    "kserve.protocol.rest.v1_endpoints:register_v1_endpoints": ("app", "dataplane", "model_repository_extension"),
    "kserve.protocol.rest.v2_endpoints:register_v2_endpoints": ("app", "dataplane", "model_repository_extension"),
    "kserve.protocol.rest.server:metrics_handler": ("request",),
    "kserve.logging:configure_logging": ("log_config",),
    "kserve.errors:NoModelReady": ("models",),
    "kserve.utils.numpy_codec:from_np_dtype": ("np_dtype",),
    "kserve.utils.numpy_codec:to_np_dtype": ("dtype",),
    **{f"kserve.errors:{f.__name__}": _HANDLER for f in SERVER_ERROR_HANDLERS.values()},
    **{f"kserve.errors:{c}": None for c in ("InvalidInput", "ModelNotFound", "InferenceError", "ModelNotReady",
                                            "UnsupportedProtocol", "ServerNotLive", "ServerNotReady")},
    **{f"kserve.protocol.infer_type:{c}": None for c in ("InferRequest", "InferResponse", "InferOutput")},
}

__all__ = ["DataPlane", "InferOutput", "InferRequest", "InferResponse", "InvalidInput", "Model", "ModelNotFound",
           "ModelRepository", "NoModelReady", "ModelRepositoryExtension", "RELIED_ON", "SERVER_ERROR_HANDLERS", "configure_logging",
           "from_np_dtype", "metrics_handler", "register_v1_endpoints", "register_v2_endpoints", "to_np_dtype"]
