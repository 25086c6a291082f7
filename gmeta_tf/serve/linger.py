"""After an early answer, read out what the client still sends, then close: nginx's lingering close.

Why: a 413 is answered while the client is still sending its body. Closing then, with the
client's bytes unread in the server's receive buffer, makes the kernel send a RST instead of a
FIN, and the RST can reach the client before it reads the answer. Most HTTP clients (Python's
``http.client`` and ``requests``, Go's, Java's) send the whole body before they read: they saw
"connection reset by peer" after 0.0 s, no status, no message, and only curl (which reads while
it sends) got the 413. nginx solves this with ``lingering_close``; this is the same.

``discard`` reads what the client sends after the answer and drops it, chunk by chunk (uvicorn
holds at most its 64 KiB read buffer of it: memory stays flat), awaiting each chunk, so the
event loop serves other requests meanwhile. It stops when the body ends or the client closes
(then the close is a clean FIN and the client reads its 413), or at the first bound passed:
``seconds`` in all (nginx's ``lingering_time``), ``IDLE_S`` with nothing arriving (nginx's
``lingering_timeout``), ``max_mb`` MiB read. A client still sending past a bound is cut off (a
RST, as before). A declared ``Content-Length`` whose rest is over ``max_mb`` is not waited for at
all: reading it would only end in the same cut.
"""
from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Optional

MIB = 1 << 20
DEFAULT_LINGER_S = 30.0  # nginx's lingering_time
DEFAULT_LINGER_MB = 1024.0  # a 300 MB body over a 64 MiB limit is read out in about a second on loopback
IDLE_S = 5.0  # nginx's lingering_timeout


class Ending(enum.Enum):
    BODY_ENDED = "the body ended"
    CLIENT_CLOSED = "the client closed"
    TIME = "the time bound passed"
    IDLE = "nothing arrived"
    BYTES = "the byte bound passed"


@dataclass(frozen=True)
class Linger:
    seconds: float = DEFAULT_LINGER_S  # longest the rest of a refused body is read, in all
    max_mb: float = DEFAULT_LINGER_MB  # most of it read, MiB; 0 (or seconds 0): close at once

    @property
    def max_bytes(self) -> int:
        return int(self.max_mb * MIB)

    def worth_it(self, rest: Optional[int]) -> bool:
        """Whether to linger over a body with ``rest`` bytes still to come (None: unknown, chunked)."""
        if self.seconds <= 0 or self.max_bytes <= 0:
            return False
        return rest is None or 0 < rest <= self.max_bytes


async def discard(receive, linger: Linger) -> tuple[int, Ending]:
    """Read and drop the request's remaining body within ``linger``'s bounds: (bytes read, why it stopped)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + linger.seconds
    read = 0
    try:
        async with asyncio.timeout(None) as timer:
            while read <= linger.max_bytes:
                timer.reschedule(min(end, loop.time() + IDLE_S))
                message = await receive()
                if message["type"] == "http.disconnect":
                    return read, Ending.CLIENT_CLOSED
                read += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return read, Ending.BODY_ENDED
    except TimeoutError:
        return read, Ending.TIME if loop.time() >= end else Ending.IDLE
    return read, Ending.BYTES
