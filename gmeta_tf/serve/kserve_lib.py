"""KServe, imported without it reading our command line.

``kserve.model_server`` parses ``sys.argv`` with argparse at import time (``parse_known_args``,
abbreviations allowed), so ``gmeta serve --model DIR`` would set KServe's ``--model_name`` to
DIR. Every KServe import in this package goes through here, with ``sys.argv`` cut to the program
name for the duration; everything KServe needs is passed to it explicitly instead.
"""
from __future__ import annotations

import sys

_argv, sys.argv = sys.argv, sys.argv[:1]
try:
    from kserve import Model, ModelServer  # noqa: E402
    from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING  # noqa: E402
    from kserve.errors import InvalidInput, ModelNotFound  # noqa: E402
    from kserve.model_server import app  # noqa: E402
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse  # noqa: E402
    from kserve.protocol.rest.server import RESTServer  # noqa: E402
    from kserve.utils.numpy_codec import from_np_dtype, to_np_dtype  # noqa: E402
finally:
    sys.argv = _argv

__all__ = ["FASTAPI_APP_IMPORT_STRING", "InferOutput", "InferRequest", "InferResponse", "InvalidInput", "Model",
           "ModelNotFound", "ModelServer", "RESTServer", "app", "from_np_dtype", "to_np_dtype"]
