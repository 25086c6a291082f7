"""`gmeta serve` under a careless or hostile client (issue 37): the before / after figures.

Not a ``make bench`` section: before the body limit one case took 15 s and 4 GiB. Run it on
this tree, and with ``--repo`` on a checkout of another commit, e.g. the one before the limit::

    python -m bench.serve_abuse                      # this tree
    git archive ad06346 | tar -x -C /tmp/before && python -m bench.serve_abuse --repo /tmp/before

It serves the ``serve`` bench's quickstart export (``bench/serve.py:model_under_bench``, reused
from ``bench/out/serve`` when there) with ``--max-batch-size 64`` and no other option, as a new user
would, and prints one JSON object:

* ``body_300mb_content_length`` / ``body_300mb_chunked``: a 300 MB v1 body of one-row instances
  (the bench's row, repeated: a valid request without a limit), its length declared or chunked:
  status, seconds, MB the client got to send, the server's RSS before and after, and its peak
  so far (MiB);
* ``python_300mb``: the same body sent as most clients send one, whole before the answer is
  read: Python's ``http.client`` and ``requests``, its length declared or chunked: what the client
  saw (the status and the start of the answer, or the exception), seconds, the server's RSS
  before and after, and its peak so far (issue 44: before, ``http.client`` saw a connection reset);
* ``stalled_100``: 100 clients send half a request and stall; a normal request's latency
  meanwhile; then they hang up: new log lines, lines at ERROR, tracebacks, 499 lines;
* ``after``: the status of a normal request after all of it.

``--c64-against DIR`` measures instead what the per-request work costs under load: 64 clients of
one-row requests on this tree's server and on DIR's, side by side, alternating four 2 s rounds
(requests/s, p99, RSS after).
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, Tuple

from bench.serve import BATCHING, NAME, _drive, _one_row_body, _summary, model_under_bench
from gmeta_tf import exit_codes
from tests.serve_fixture import REPO, hang_up, rss_mib, send_body, server_process, stalled_request

WORK = REPO / "bench" / "out" / "serve"  # the serve section's work folder (bench/run.py)
PATH = f"/v1/models/{NAME}:predict"
SIZE = 300_000_000


def _rows_body(work: Path, size: int) -> Tuple[int, Iterator[bytes]]:
    """A v1 body of about ``size`` bytes: the bench's one row, repeated: (exact length, chunks)."""
    row = json.dumps(json.loads(_one_row_body(work))["instances"][0]).encode()
    head, unit, tail = b'{"signature_name": "predict", "instances": [', row + b", ", row + b"]}"
    n = (size - len(head) - len(tail)) // len(unit)
    per_chunk = max(1, (1 << 20) // len(unit))

    def chunks():
        yield head
        left = n
        while left > 0:
            k = min(per_chunk, left)
            yield unit * k
            left -= k
        yield tail

    return len(head) + n * len(unit) + len(tail), chunks()


def _post(port: int, body: bytes) -> Tuple[int, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        t0 = time.perf_counter()
        conn.request("POST", PATH, body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, (time.perf_counter() - t0) * 1000.0
    finally:
        conn.close()


def _big(port: int, pid: int, work: Path, chunked: bool) -> Dict:
    time.sleep(1.0)
    rss0 = rss_mib(pid)
    length, chunks = _rows_body(work, SIZE)
    t0 = time.perf_counter()
    status, text, sent = send_body(port, PATH, chunks, length=None if chunked else length, timeout=300)
    seconds = time.perf_counter() - t0
    time.sleep(2.0)
    return {"status": status, "seconds": round(seconds, 2), "client_sent_mb": round(sent / 1e6, 1),
            "body_mb": round(length / 1e6, 1), "answer": text[:200], "rss_mib_before": round(rss0, 1),
            "rss_mib_after": round(rss_mib(pid), 1), "rss_mib_peak_so_far": round(rss_mib(pid, "VmHWM"), 1)}


class _Sized:
    """Chunks with a known total, so ``requests`` declares a ``Content-Length`` instead of chunking."""

    def __init__(self, length: int, chunks: Iterator[bytes]):
        self.length, self.chunks = length, chunks

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks


def _send_whole_then_read(port: int, client: str, length: int, chunks: Iterator[bytes], chunked: bool) -> str:
    headers = {"content-type": "application/json"}
    if client == "requests":
        import requests

        r = requests.post(f"http://127.0.0.1:{port}{PATH}", data=chunks if chunked else _Sized(length, chunks),
                          headers=headers, timeout=300)
        return f"{r.status_code} {r.text}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", PATH, body=chunks, encode_chunked=chunked,
                     headers={**headers, **({} if chunked else {"content-length": str(length)})})
        resp = conn.getresponse()
        return f"{resp.status} {resp.read().decode('utf-8', 'replace')}"
    finally:
        conn.close()


def _python_client(port: int, pid: int, work: Path, client: str, chunked: bool) -> Dict:
    time.sleep(1.0)
    rss0 = rss_mib(pid)
    length, chunks = _rows_body(work, SIZE)
    t0 = time.perf_counter()
    try:
        seen = _send_whole_then_read(port, client, length, chunks, chunked)
    except Exception as e:  # what the client saw is the measurement
        seen = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    time.sleep(2.0)
    return {"client_saw": seen[:200], "seconds": round(seconds, 2), "body_mb": round(length / 1e6, 1),
            "rss_mib_before": round(rss0, 1), "rss_mib_after": round(rss_mib(pid), 1),
            "rss_mib_peak_so_far": round(rss_mib(pid, "VmHWM"), 1)}


def _stalled(port: int, log: Path, work: Path, clients: int = 100) -> Dict:
    time.sleep(0.5)
    before = log.read_text()
    socks = [stalled_request(port, PATH, chunked=bool(i % 2)) for i in range(clients)]
    time.sleep(1.0)
    status, ms = _post(port, _one_row_body(work))
    hang_up(socks)
    time.sleep(3.0)
    new = log.read_text()[len(before):].splitlines()
    return {"clients": clients, "normal_request_meanwhile": {"status": status, "ms": round(ms, 1)},
            "new_log_lines": len(new), "lines_at_error": sum(" ERROR " in ln for ln in new),
            "tracebacks": sum("Traceback" in ln for ln in new), "lines_499": sum('" 499 ' in ln for ln in new),
            "lines_500": sum('" 500 ' in ln for ln in new)}


def measure(repo: Path = REPO, work: Path = WORK) -> Dict:
    work.mkdir(parents=True, exist_ok=True)
    model = work / "serve-model" if (work / "requests.json").is_file() else model_under_bench(work)
    log = work / "abuse.log"
    out: Dict = {"repo": str(repo)}
    with server_process(model, log, name=NAME, extra=BATCHING[:2], repo=repo) as (port, proc):
        out["warm"] = _post(port, _one_row_body(work))[0]
        out["body_300mb_content_length"] = _big(port, proc.pid, work, chunked=False)
        out["body_300mb_chunked"] = _big(port, proc.pid, work, chunked=True)
        out["python_300mb"] = {f"{client} {'chunked' if chunked else 'content-length'}":
                               _python_client(port, proc.pid, work, client, chunked)
                               for client in ("http.client", "requests") for chunked in (False, True)}
        out["stalled_100"] = _stalled(port, log, work)
        out["after"] = _post(port, _one_row_body(work))[0]
        out["rss_mib_end"] = round(rss_mib(proc.pid), 1)
    return out


def compare_c64(other: Path, work: Path = WORK, rounds: int = 4, seconds: float = 2.0) -> Dict:
    """This tree's batched server and ``other``'s, 64 one-row clients, alternating rounds."""
    work.mkdir(parents=True, exist_ok=True)
    model = work / "serve-model" if (work / "requests.json").is_file() else model_under_bench(work)
    body, extra = _one_row_body(work), ["--no-access-log", *BATCHING]
    with server_process(model, work / "c64-this.log", name=NAME, extra=extra) as (this, this_proc), \
            server_process(model, work / "c64-other.log", name=NAME, extra=extra, repo=other) as (that, that_proc):
        _drive(this, body, 64, 1.0), _drive(that, body, 64, 1.0)  # warm-up
        runs = [(_drive(that, body, 64, seconds), _drive(this, body, 64, seconds)) for _ in range(rounds)]
        return {"other": {**_summary([r[0] for r in runs]), "rss_mib_after": rss_mib(that_proc.pid), "repo": str(other)},
                "this": {**_summary([r[1] for r in runs]), "rss_mib_after": rss_mib(this_proc.pid)}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose gmeta_tf serves (default: this one)")
    parser.add_argument("--c64-against", type=Path, default=None, metavar="DIR",
                        help="instead: 64 one-row clients on this tree's server and DIR's, side by side")
    args = parser.parse_args(argv)
    out = compare_c64(args.c64_against.resolve()) if args.c64_against else measure(args.repo.resolve())
    print(json.dumps(out, indent=1))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
