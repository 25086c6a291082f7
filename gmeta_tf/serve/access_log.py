"""One log line per request; a stack trace only for a server fault.

KServe logs every ``InvalidInput`` (HTTP 400) and ``ModelNotFound`` (404) at ERROR with its
whole traceback (``kserve.errors.invalid_input_handler``), and writes two ``kserve.trace``
timing lines besides uvicorn's access line for every request: a client sending bad rows buries
the one real fault in hundreds of lines. Here a request is one line: ``AccessLog`` writes the
client, request line, status and time, at INFO for a success, at WARNING with the error the
client was sent for a 4xx (the client's fault: nothing to trace), and at ERROR for a 5xx, whose
traceback KServe's own handler still logs. The 4xx handlers answer as KServe's do, without the
trace. KServe's per-request timing lines and uvicorn's access line are turned off in its favour.
Starlette re-raises an exception after KServe's catch-all handler has logged it and answered 500,
and uvicorn would log the same traceback again ("Exception in ASGI application"): that second
copy is dropped, so a server fault is one traceback. A client that hangs up before its
response (``request_body.ClientGone``) is one line at WARNING too, status 499 with the bytes
read: the client's doing, never a 500.
"""
from __future__ import annotations

import collections
import logging
import time
from http import HTTPStatus

import orjson

from gmeta_tf.serve.request_body import CLIENT_CLOSED, ClientGone

SERVE_LOGGER = "gmeta.serve"
ACCESS_LOGGER = SERVE_LOGGER + ".access"
_MAX_ERROR_CHARS = 500


def configure(access: bool) -> None:
    """The server's own lines (``gmeta.serve``: start-up, batching) in KServe's style; the access
    line replaces uvicorn's and KServe's timing lines, and ``access`` False drops it too."""
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).disabled = True
    kserve, uvicorn_errors = logging.getLogger("kserve"), logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _TracebackOnce) for f in uvicorn_errors.filters):
        seen: collections.deque = collections.deque(maxlen=8)  # uvicorn logs its copy right after
        kserve.addFilter(_TracebackOnce(seen))
        uvicorn_errors.addFilter(_TracebackOnce(seen))
    logger = logging.getLogger(SERVE_LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(process)s %(name)s %(levelname)s %(message)s",
                                               "%Y-%m-%d %H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    logging.getLogger(ACCESS_LOGGER).disabled = not access


class _TracebackOnce(logging.Filter):
    """On KServe's logger it notes each exception logged with its traceback; on uvicorn's it drops
    a record whose exception KServe already logged (only that copy: one raised after the response
    started never reached KServe's handler, and uvicorn's is then the only trace)."""

    def __init__(self, seen: collections.deque):
        super().__init__()
        self.seen = seen

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return True
        if record.name.startswith("kserve"):
            self.seen.append(exc)
            return True
        return not any(exc is e for e in self.seen)


def client_error_handler(status: HTTPStatus):
    """KServe's handler for a client error, less its ERROR-level traceback."""
    async def handler(_request, exc):
        from fastapi.responses import JSONResponse

        return JSONResponse(status_code=status, content={"error": str(exc)})

    return handler


def _error_text(body: bytes) -> str:
    try:
        text = str(orjson.loads(body).get("error", ""))
    except (orjson.JSONDecodeError, AttributeError):
        text = body.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "…"


class AccessLog:
    """ASGI middleware: the one line per HTTP request (see the module doc)."""

    def __init__(self, app):
        self.app = app
        self.log = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.log.disabled:
            try:
                await self.app(scope, receive, send)
            except ClientGone:
                pass
            return
        t0 = time.perf_counter()
        status, error, reason = [HTTPStatus.INTERNAL_SERVER_ERROR.value], [], None

        async def record(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and status[0] >= 400:
                error.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, record)
        except ClientGone as gone:
            status[0], reason = CLIENT_CLOSED, gone.describe()
        finally:
            code = status[0]
            client = scope.get("client") or ("-", 0)
            path = scope.get("path", "")
            query = scope.get("query_string", b"").decode("latin-1")
            line = (f'{client[0]}:{client[1]} "{scope.get("method", "")} {path}{"?" + query if query else ""} '
                    f'HTTP/{scope.get("http_version", "1.1")}" {code} {(time.perf_counter() - t0) * 1000:.1f} ms')
            if code < 400:
                self.log.info(line)
            elif code < 500:
                self.log.warning("%s: %s", line, reason or _error_text(b"".join(error)))
            else:
                self.log.error(line)
