"""The read-out after a 413 (``gmeta_tf/serve/linger.py``) against a scripted ASGI ``receive``: each
bound ends it, and says which. Over real HTTP it is ``tests/test_serve_limits.py``."""
from __future__ import annotations

import asyncio
import time

import pytest

from gmeta_tf.serve import linger
from gmeta_tf.serve.linger import Ending, Linger, discard

pytestmark = pytest.mark.fast
CHUNK = 1 << 16


def _receive(messages=None, every: float = 0.0, endless: bool = False):
    """An ASGI receive that answers ``messages`` in turn (then endless chunks, or nothing ever),
    each after ``every`` seconds."""
    left = list(messages or [])

    async def receive():
        await asyncio.sleep(every)
        if left:
            return left.pop(0)
        if endless:
            return {"type": "http.request", "body": b"7" * CHUNK, "more_body": True}
        await asyncio.Event().wait()  # a client that sends nothing more and stays

    return receive


def _run(receive, bound: Linger):
    t0 = time.monotonic()
    read, ending = asyncio.run(discard(receive, bound))
    return read, ending, time.monotonic() - t0


def test_the_body_ending_or_the_client_closing_ends_it():
    body = [{"type": "http.request", "body": b"7" * 10, "more_body": True},
            {"type": "http.request", "body": b"7" * 5, "more_body": False}]
    assert _run(_receive(body), Linger())[:2] == (15, Ending.BODY_ENDED)
    gone = [body[0], {"type": "http.disconnect"}]
    assert _run(_receive(gone), Linger())[:2] == (10, Ending.CLIENT_CLOSED)


def test_the_byte_bound_cuts_off_a_client_that_keeps_sending():
    read, ending, _ = _run(_receive(endless=True), Linger(seconds=30, max_mb=1))
    assert ending is Ending.BYTES
    assert (1 << 20) < read <= (1 << 20) + CHUNK


def test_the_time_bound_cuts_off_a_slow_client():
    read, ending, seconds = _run(_receive(every=0.01, endless=True), Linger(seconds=0.3, max_mb=1024))
    assert ending is Ending.TIME
    assert 0.3 <= seconds < 2.0 and 0 < read < (1 << 30)


def test_a_client_that_sends_nothing_is_not_waited_for_past_the_idle_bound(monkeypatch):
    monkeypatch.setattr(linger, "IDLE_S", 0.2)
    read, ending, seconds = _run(_receive(), Linger(seconds=30))
    assert (read, ending) == (0, Ending.IDLE)
    assert 0.2 <= seconds < 2.0


@pytest.mark.parametrize("bound, rest, worth", [
    (Linger(), None, True),  # chunked: the rest is unknown
    (Linger(max_mb=1), 1 << 20, True),
    (Linger(max_mb=1), (1 << 20) + 1, False),  # it would be cut off anyway
    (Linger(), 0, False),  # nothing left to read
    (Linger(seconds=0), None, False),  # turned off
    (Linger(max_mb=0), None, False),
])
def test_whether_to_read_out_at_all(bound, rest, worth):
    assert bound.worth_it(rest) is worth
