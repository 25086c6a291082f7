"""KServe's ``ModelServer`` running one ``SavedModelServer`` on ``host:port``.

The model loads before the port opens, so every health and readiness endpoint answers only
once the model can serve (``/``, ``/v2/health/live``, ``/v2/health/ready``, ``/v1/models/NAME``,
``/v2/models/NAME/ready``). Two things KServe does not do are added here: it binds its REST
server to 0.0.0.0 (``--host`` picks the interface: loopback by default, ``0.0.0.0`` in a pod),
and it answers a v2 body that fails its schema with 422; that is a bad request (400) like every
other one, with the field named.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gmeta_tf.serve.batcher import BatchingConfig
from gmeta_tf.serve.kserve_lib import FASTAPI_APP_IMPORT_STRING, ModelServer, RESTServer, app
from gmeta_tf.serve.model import SavedModelServer


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


class _HostModelServer(ModelServer):
    """``ModelServer.start`` for one REST worker, bound to ``host`` (KServe's binds 0.0.0.0)."""

    def __init__(self, host: str, **kwargs):
        super().__init__(**kwargs)
        self._host = host

    def start(self, models) -> None:
        self._register_and_check_atleast_one_model_is_ready(models)
        self._rest_server = RESTServer(FASTAPI_APP_IMPORT_STRING, self.dataplane, self.model_repository_extension,
                                       self.http_port, access_log_format=self.access_log_format, workers=1,
                                       grace_period=self.grace_period)
        self._rest_server.config.host = self._host
        self.servers.append(self._rest_server.start())
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())


def serve(config: ServeConfig) -> None:
    """Load the model (``ModelDirError`` before any port is bound), then serve until signalled."""
    import logging

    from fastapi.exceptions import RequestValidationError

    model = SavedModelServer(config.name, config.model_dir, config.batching)
    model.load()
    app.add_exception_handler(RequestValidationError, _bad_body)
    server = _HostModelServer(config.host, http_port=config.port, enable_grpc=False, workers=1,
                              enable_latency_logging=False, grace_period=5)
    if not config.access_log:  # uvicorn's access line and KServe's per-request timing lines
        for logger in ("uvicorn.access", "kserve.trace"):
            logging.getLogger(logger).disabled = True
    server.start([model])
