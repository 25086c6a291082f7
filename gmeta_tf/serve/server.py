"""KServe's v1 and v2 REST endpoints for one ``SavedModelServer``, on uvicorn at ``host:port``.

Why not ``kserve.ModelServer.start``: it binds 0.0.0.0 with no way to choose, builds its app on
the FastAPI instance ``kserve.model_server`` creates at import (shared by every import), and adds
its own timing and access-log middleware. Changing that meant copying ``start`` and calling its
private methods, which a KServe upgrade could break silently. The app here is built from
KServe's public parts instead (all named, with their parameters, in ``kserve_lib.RELIED_ON``,
which a test checks): its data plane and model repository, its v1 and v2 route registration, its
error handlers. Uvicorn serves it directly; its own signal handling shuts it down gracefully.

The model loads before the port opens, so every health and readiness endpoint answers only
once the model can serve (``/``, ``/v2/health/live``, ``/v2/health/ready``, ``/v1/models/NAME``,
``/v2/models/NAME/ready``). Where KServe falls short for our clients, this changes it: ``--host``
picks the interface (loopback by default, ``0.0.0.0`` in a pod); a v2 body that fails its
schema is 400 (FastAPI's 422), a bad request like every other one, with the field named; a v2
body sent without ``content-type: application/json`` (curl's default form type, or none) is read
as JSON, not as the binary tensor extension, which needs an ``inference-header-content-length``
header the client never meant to send: the header, not the content type, says "binary". Around
the app, outermost first: one access-log line per request (``access_log``), then the body limit
and client hang-ups (``request_body``).
"""
from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from http import HTTPStatus

from gmeta_tf.serve import access_log
from gmeta_tf.serve.batcher import BatchingConfig
from gmeta_tf.serve.kserve_lib import (
    SERVER_ERROR_HANDLERS,
    DataPlane,
    InvalidInput,
    ModelNotFound,
    ModelRepository,
    ModelRepositoryExtension,
    NoModelReady,
    configure_logging,
    metrics_handler,
    register_v1_endpoints,
    register_v2_endpoints,
)
from gmeta_tf.serve.linger import Linger
from gmeta_tf.serve.model import SavedModelServer
from gmeta_tf.serve.request_body import DEFAULT_MAX_BODY_MB, BodyLimit

_V2_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
_BINARY_HEADER = b"inference-header-content-length"
GRACE_PERIOD_S = 5


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str
    port: int
    name: str = "model"
    host: str = "127.0.0.1"
    batching: BatchingConfig = BatchingConfig()
    access_log: bool = True
    max_body_mb: float = DEFAULT_MAX_BODY_MB
    linger: Linger = Linger()  # how long, and how much, of a refused body is read out before closing


async def _bad_body(_request, exc):
    from fastapi.responses import JSONResponse

    parts = []
    for err in exc.errors()[:5]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            parts.append(f"malformed JSON at char {loc[0] if loc else '?'}: {(err.get('ctx') or {}).get('error', '')}")
            continue
        parts.append(f"{'.'.join(str(p) for p in loc) or 'body'}: {err.get('msg', 'invalid')}")
    return JSONResponse(status_code=400, content={"error": "bad request body: " + "; ".join(parts)})


class _V2JsonBody:
    """ASGI middleware: a v2 infer body without the binary extension's header is JSON, whatever
    its content type says (see the module doc)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") == "POST" and _V2_INFER.match(scope.get("path", "")):
            headers = scope.get("headers") or []
            names = {k.lower() for k, _ in headers}
            if _BINARY_HEADER not in names:
                kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
                scope = {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def build_app(model: SavedModelServer, max_body_mb: float = DEFAULT_MAX_BODY_MB, linger: Linger = Linger()):
    """The ASGI app serving ``model``: KServe's routes and handlers, ours around them.
    ``NoModelReady`` (as KServe's ``ModelServer`` raises) unless the model is loaded."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse

    if not model.ready:
        raise NoModelReady([model])
    registry = ModelRepository()
    registry.update(model)
    dataplane = DataPlane(model_registry=registry)
    repository = ModelRepositoryExtension(model_registry=registry)
    app = FastAPI(title="gmeta serve (KServe ModelServer)", docs_url=None, redoc_url=None,
                  default_response_class=ORJSONResponse)
    app.add_api_route("/", dataplane.live)
    app.add_api_route("/metrics", metrics_handler, methods=["GET"])
    register_v1_endpoints(app, dataplane, repository)
    register_v2_endpoints(app, dataplane, repository)
    for exc, handler in SERVER_ERROR_HANDLERS.items():
        app.add_exception_handler(exc, handler)
    app.add_exception_handler(InvalidInput, access_log.client_error_handler(HTTPStatus.BAD_REQUEST))
    app.add_exception_handler(ModelNotFound, access_log.client_error_handler(HTTPStatus.NOT_FOUND))
    app.add_exception_handler(RequestValidationError, _bad_body)
    return access_log.AccessLog(BodyLimit(_V2JsonBody(app), max_body_mb, linger))


def serve(config: ServeConfig) -> None:
    """Load the model (``ModelDirError`` before any port is bound), then serve until signalled."""
    import uvicorn

    configure_logging()  # KServe's format for its loggers and uvicorn's
    access_log.configure(config.access_log)
    model = SavedModelServer(config.name, config.model_dir, config.batching)
    model.load()  # logs which signatures are micro-batched, and why any is not
    server = uvicorn.Server(uvicorn.Config(build_app(model, config.max_body_mb, config.linger), host=config.host, port=config.port,
                                           log_config=None, timeout_graceful_shutdown=GRACE_PERIOD_S,
                                           loop="asyncio", lifespan="off"))
    for sig in (signal.SIGINT, signal.SIGTERM):
        # uvicorn drains on the signal, then raises it again with the handler it found: this one
        # ends the process with exit 0 (as KServe's ModelServer did), not killed by the signal.
        signal.signal(sig, _stopped)
    server.run()


def _stopped(_signum, _frame) -> None:
    """The signal asked for the stop that uvicorn has just carried out: nothing is left to do."""
