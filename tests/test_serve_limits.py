"""`gmeta serve` under a careless or hostile client, over real HTTP (issue 37).

* A body over ``--max-body-mb`` is 413 naming the limit and the flag, v1 and v2, with its length
  declared or chunked; the server reads no further than the limit, so a 300 MB body does not
  grow it (before the limit, one was parsed whole: +4.4 GiB, kept).
* A client that hangs up, mid-body or while the model runs its request, is one access line
  (499, the bytes read) at WARNING: no traceback, never a 500.
* A normal request after each answers 200.

The model is the stock SavedModel of ``serve_fixture.build_model`` (its ``read`` signature opens
a file: a FIFO holds a request inside the model for as long as the test wants).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from types import SimpleNamespace

import pytest
from serve_fixture import (
    big_body,
    build_model,
    example_inputs,
    hang_up,
    request,
    rss_mib,
    send_body,
    server_process,
    stalled_request,
)

pytestmark = pytest.mark.integration

NAME = "recs"
V1 = f"/v1/models/{NAME}:predict"
V2 = f"/v2/models/{NAME}/infer"
LIMIT_MB = 1
LIMIT = LIMIT_MB << 20
HUGE = 300_000_000  # the 300 MB body


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("limits") / "model")


def _server(model_dir, tmp_path_factory, extra=()):
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    return log, server_process(model_dir, log, name=NAME, extra=list(extra))


@pytest.fixture(scope="module")
def limited(model_dir, tmp_path_factory):
    log, ctx = _server(model_dir, tmp_path_factory, ["--max-body-mb", str(LIMIT_MB)])
    with ctx as (port, proc):
        yield SimpleNamespace(port=port, proc=proc, log=log)


@pytest.fixture(scope="module")
def default(model_dir, tmp_path_factory):
    """Started as a user would, with no option: the hang-up cases need no flag."""
    log, ctx = _server(model_dir, tmp_path_factory)
    with ctx as (port, proc):
        yield SimpleNamespace(port=port, proc=proc, log=log)


def _valid_body(extra_bytes: int = 0) -> bytes:
    x = example_inputs("predict", batch=2, seed=3)
    body = json.dumps({"signature_name": "predict", "inputs": {k: v.tolist() for k, v in x.items()}}).encode()
    return body + b" " * extra_bytes  # JSON allows trailing whitespace


def _predict_ok(srv):
    status, out = request(srv.port, "POST", V1, raw=_valid_body())
    assert status == 200, out
    assert len(out["outputs"]) == 2


def _new_lines(srv, before: str, count: int, timeout: float = 15.0):
    """The log lines written after ``before`` once there are ``count`` (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        new = srv.log.read_text()[len(before):].splitlines()
        if len(new) >= count or time.monotonic() > deadline:
            return new
        time.sleep(0.1)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", [V1, V2], ids=["v1", "v2"])
def test_a_body_over_the_limit_is_413_and_not_read(limited, path, chunked):
    _predict_ok(limited)  # warm: what the first request allocates is not the body's doing
    time.sleep(0.3)
    rss0, before = rss_mib(limited.proc.pid), limited.log.read_text()
    t0 = time.monotonic()
    size, chunks = big_body(path, HUGE)
    status, text, sent = send_body(limited.port, path, chunks, length=None if chunked else size)
    seconds = time.monotonic() - t0
    assert status == 413, (status, text[:500])
    error = json.loads(text)["error"]
    assert "1 MiB" in error and "--max-body-mb" in error, error
    assert "\n" not in error
    assert sent < HUGE // 4, sent  # the server stopped reading at the limit (and closed): the rest never went
    time.sleep(0.3)
    grown = rss_mib(limited.proc.pid) - rss0
    assert grown < 8, f"server grew {grown:.1f} MiB on a refused {HUGE / 1e6:.0f} MB body (in {seconds:.1f} s)"
    (line,) = _new_lines(limited, before, 1)
    assert " WARNING " in line and '" 413 ' in line and "--max-body-mb" in line, line
    _predict_ok(limited)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_at_the_limit_is_served(limited, chunked):
    """The limit is inclusive and exact: LIMIT bytes are served, LIMIT + 1 are refused."""
    at = _valid_body()
    at += b" " * (LIMIT - len(at))
    status, text, _ = send_body(limited.port, V1, [at[i:i + 65536] for i in range(0, len(at), 65536)],
                                length=None if chunked else len(at))
    assert status == 200, text[:500]
    over = at + b" "
    status, text, _ = send_body(limited.port, V1, [over], length=None if chunked else len(over))
    assert status == 413, text[:500]
    _predict_ok(limited)


def test_clients_that_hang_up_mid_body_are_one_line_each(default):
    """The issue's 100 stalled clients (here 20): each hang-up is one 499 line at WARNING with the
    bytes read, no ERROR, no traceback; the server serves on."""
    _predict_ok(default)
    time.sleep(0.3)
    before = default.log.read_text()
    socks = [stalled_request(default.port, V1 if i % 2 else V2, chunked=i % 4 >= 2) for i in range(20)]
    time.sleep(1.0)  # every request is in the server, reading its body
    _predict_ok(default)  # stalled clients do not hold up another
    hang_up(socks)
    _new_lines(default, before, 21)
    time.sleep(0.5)
    new = default.log.read_text()[len(before):].splitlines()
    assert "Traceback" not in "\n".join(new), "\n".join(new)[-3000:]
    assert not [ln for ln in new if " ERROR " in ln], new
    gone = [ln for ln in new if '" 499 ' in ln]
    assert len(gone) == 20 and len(new) == 21, new
    assert all(" WARNING " in ln for ln in gone), gone
    assert sum("after 500 of 1000 body bytes" in ln for ln in gone) == 10, gone  # declared length
    assert sum("after 500 body bytes (chunked" in ln for ln in gone) == 10, gone
    _predict_ok(default)


def test_a_client_that_hangs_up_while_the_model_runs_is_499(default, tmp_path):
    """The request is read whole and inside the model (a FIFO holds it there) when its client
    leaves: one 499 line when it leaves, and nothing more when the model finishes."""
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    _predict_ok(default)
    time.sleep(0.3)
    before = default.log.read_text()
    body = json.dumps({"signature_name": "read", "inputs": {"path": [str(fifo)]}}).encode()
    sock = socket.create_connection(("127.0.0.1", default.port), timeout=10)
    try:
        sock.sendall(f"POST {V1} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(1.5)  # read whole; the model is blocked opening the FIFO
        assert default.log.read_text() == before
        hang_up([sock])
        _new_lines(default, before, 1)
    finally:
        sock.close()
        with contextlib.suppress(OSError):  # release the model's thread (ENXIO: it never opened the FIFO)
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"x")
            os.close(fd)
    time.sleep(1.0)
    new = default.log.read_text()[len(before):].splitlines()
    assert "Traceback" not in "\n".join(new), "\n".join(new)[-3000:]
    assert len(new) == 1, new  # no late 200 (or 500) when the model finishes
    assert " WARNING " in new[0] and '" 499 ' in new[0], new
    assert f"before the response ({len(body)} body bytes read)" in new[0], new
    _predict_ok(default)
