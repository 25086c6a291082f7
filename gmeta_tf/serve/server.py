"""KServe's ``ModelServer`` running one ``SavedModelServer`` on ``host:port``.

The model loads before the port opens, so every health and readiness endpoint answers only
once the model can serve (``/``, ``/v2/health/live``, ``/v2/health/ready``, ``/v1/models/NAME``,
``/v2/models/NAME/ready``). Where KServe falls short for our clients, this changes it: it binds
its REST server to 0.0.0.0 (``--host`` picks the interface: loopback by default, ``0.0.0.0`` in
a pod); it answers a v2 body that fails its schema with 422, which is a bad request (400) like
every other one, with the field named; and it reads a v2 body sent without ``content-type:
application/json`` (curl's default form type, or none) as the binary tensor extension, which
needs an ``inference-header-content-length`` header the client never meant to send. Both
endpoints read such a body as JSON: the header, not the content type, says "binary". Each request
is one access-log line (``access_log``).
"""
from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from http import HTTPStatus

from gmeta_tf.serve import access_log
from gmeta_tf.serve.batcher import BatchingConfig
from gmeta_tf.serve.kserve_lib import (
    FASTAPI_APP_IMPORT_STRING,
    InvalidInput,
    ModelNotFound,
    ModelServer,
    RESTServer,
    app,
)
from gmeta_tf.serve.model import SavedModelServer

_V2_INFER = re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/infer$")
_BINARY_HEADER = b"inference-header-content-length"


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str
    port: int
    name: str = "model"
    host: str = "127.0.0.1"
    batching: BatchingConfig = BatchingConfig()
    access_log: bool = True


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


class _RESTServer(RESTServer):
    """KServe's REST server with client errors answered without an ERROR traceback (``access_log``)."""

    def _add_exception_handlers(self, fastapi_app) -> None:
        super()._add_exception_handlers(fastapi_app)
        fastapi_app.add_exception_handler(InvalidInput, access_log.client_error_handler(HTTPStatus.BAD_REQUEST))
        fastapi_app.add_exception_handler(ModelNotFound, access_log.client_error_handler(HTTPStatus.NOT_FOUND))


class _HostModelServer(ModelServer):
    """``ModelServer.start`` for one REST worker, bound to ``host`` (KServe's binds 0.0.0.0)."""

    def __init__(self, host: str, **kwargs):
        super().__init__(**kwargs)
        self._host = host

    def start(self, models) -> None:
        self._register_and_check_atleast_one_model_is_ready(models)
        self._rest_server = _RESTServer(FASTAPI_APP_IMPORT_STRING, self.dataplane, self.model_repository_extension,
                                       self.http_port, access_log_format=self.access_log_format, workers=1,
                                       grace_period=self.grace_period)
        self._rest_server.config.host = self._host
        self.servers.append(self._rest_server.start())
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())


def serve(config: ServeConfig) -> None:
    """Load the model (``ModelDirError`` before any port is bound), then serve until signalled."""
    from fastapi.exceptions import RequestValidationError

    server = _HostModelServer(config.host, http_port=config.port, enable_grpc=False, workers=1,
                              enable_latency_logging=False, grace_period=5)  # configures KServe's logging
    access_log.configure(config.access_log)
    model = SavedModelServer(config.name, config.model_dir, config.batching)
    model.load()  # logs which signatures are micro-batched, and why any is not
    app.add_exception_handler(RequestValidationError, _bad_body)
    app.add_middleware(_V2JsonBody)
    app.add_middleware(access_log.AccessLog)  # outermost of ours: sees every status, _bad_body's too
    server.start([model])
