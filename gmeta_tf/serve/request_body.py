"""The request body, read whole before the app sees it: a size limit, and a client that hangs up.

Why: KServe's REST server reads any body whole and parses it. A 300 MB body was 2.2 million rows
scored in 15 s, and the server grew from 627 MiB to 5 GiB and stayed there: a few such bodies
take a pod down. And a client that hung up while its body was being read raised starlette's
``ClientDisconnect`` into KServe's catch-all handler: an ERROR 500 line with a 30-line
traceback for what is the client's doing (a phone on a bad network).

``BodyLimit`` (pure ASGI, between the access log and the app) counts the body as it arrives:
a declared ``Content-Length`` over the limit is refused before one byte of it is read, a
chunked body at the first chunk that passes it. The refusal is a 413 naming the limit and
``--max-body-mb``, with ``connection: close``; the rest of the body is never kept: it is read
and dropped within ``--linger-s`` / ``--linger-mb`` (``linger``) before the connection closes, so
a client that sends its whole body before it reads gets the 413 too. A body within the
limit reaches the app as one message (KServe reads it whole anyway). While the app runs it
listens for the client's disconnect and cancels the app when it comes, so a request waiting
for the micro-batcher leaves its queue unscored (``batcher``). Either hang-up, mid-body or
before the response, raises ``ClientGone`` to the access log: one line, status 499 (nginx's
"client closed request"), the bytes read.
"""
from __future__ import annotations

import asyncio
from typing import Optional

import orjson

from gmeta_tf.serve.linger import Linger, discard

MIB = 1 << 20
DEFAULT_MAX_BODY_MB = 64.0  # ~470,000 one-row v1 rows of the quickstart model: far beyond a sane request
CLIENT_CLOSED = 499


class ClientGone(Exception):
    """The client closed the connection before its response: ``read`` body bytes were read of
    ``declared`` (None: chunked), ``whole`` when the body had been read whole."""

    def __init__(self, read: int, declared: Optional[int], whole: bool):
        self.read, self.declared, self.whole = read, declared, whole
        super().__init__(self.describe())

    def describe(self) -> str:
        if self.whole:
            return f"client closed the connection before the response ({self.read} body bytes read)"
        if self.declared is None:
            return f"client closed the connection after {self.read} body bytes (chunked, unfinished)"
        return f"client closed the connection after {self.read} of {self.declared} body bytes"


def _declared_length(scope) -> Optional[int]:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses such a request before it gets here
    return None


class BodyLimit:
    """ASGI middleware: the body limit and the client hang-up (see the module doc)."""

    def __init__(self, app, max_body_mb: float = DEFAULT_MAX_BODY_MB, linger: Linger = Linger()):
        self.app = app
        self.max_body_mb = max_body_mb
        self.max_bytes = int(max_body_mb * MIB)
        self.linger = linger

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(receive, send, declared, declared)
            return
        body = await self._read(receive, send, declared)
        if body is not None:
            await self._run(scope, body, receive, send, declared)

    async def _read(self, receive, send, declared: Optional[int]) -> Optional[bytes]:
        """The whole body, or None once it passed the limit (answered 413)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone(size, declared, whole=False)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                del chunks
                if not message.get("more_body", False):
                    rest = 0  # the chunk that passed the limit was the last
                else:
                    rest = None if declared is None else declared - size
                await self._refuse(receive, send, declared, rest)
                return None
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _refuse(self, receive, send, declared: Optional[int], rest: Optional[int]) -> None:
        """The 413, sent whole at once; then, if ``rest`` (bytes still to come, None: unknown) is
        worth it, the body is read out and dropped before the response ends and uvicorn closes."""
        size = f"of {declared} bytes " if declared is not None else ""
        error = (f"request body {size}is over this server's limit of {self.max_body_mb:g} MiB: send fewer rows "
                 f"per request, or start gmeta serve with a larger --max-body-mb")
        body = orjson.dumps({"error": error})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        if not self.linger.worth_it(rest):
            await send({"type": "http.response.body", "body": body})
            return
        # Every byte of the answer is on the wire now; the response ends (and the connection
        # closes) only with the empty message after the discard.
        await send({"type": "http.response.body", "body": body, "more_body": True})
        await discard(receive, self.linger)
        await send({"type": "http.response.body", "body": b""})

    async def _run(self, scope, body: bytes, receive, send, declared: Optional[int]) -> None:
        """The app on ``body``, cancelled if the client disconnects before the response ends."""
        responded, gone = asyncio.Event(), asyncio.Event()
        size, pending = len(body), [body]  # handed over once, not held while the model runs
        del body

        async def replay():
            if pending:
                return {"type": "http.request", "body": pending.pop(), "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def tracked(message):
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                responded.set()  # before the server sees it: its receive() then answers disconnect
            await send(message)

        task = asyncio.current_task()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            if not responded.is_set():
                gone.set()
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, replay, tracked)
        except asyncio.CancelledError:
            if not gone.is_set():
                raise  # not the client's doing (the server is shutting down)
            task.uncancel()
            raise ClientGone(size, declared, whole=True) from None
        finally:
            watcher.cancel()
