"""``make bench`` section ``serve``: latency and throughput of a real `gmeta serve` over HTTP.

The model is a real export of the quickstart model (``model_under_bench``). For each signature
(``predict``: 8 candidate rows of one test user per request; ``adapt_and_predict``: 16 of its
support samples with labels + those 8 queries) and 1 and 16 concurrent clients, each client sends the same v1 columnar
request back to back on its own keep-alive connection for ``seconds``, after a short warm-up.
A second server with micro-batching on runs alongside; ``predict`` points alternate between the
two in halves.
Keys: ``serve.<signature>.c<clients>.p50_ms`` / ``.p99_ms`` / ``.rps``, plus
``serve.predict_batched.c16.*`` (micro-batching on) and ``serve.batched_over_unbatched_rps_c16``.

Where the batcher should matter: one-row ``predict`` requests (one candidate each, the row format
most clients send) from 16 clients, ``serve.predict_1row.c16.*`` on the plain server and
``serve.predict_1row_batched.c16.*`` on the batched one (with ``rows_per_call``, the mean merged
batch from the server's /metrics), alternating in quarters; ``serve.batched_over_unbatched_rps_1row_c16``
is their requests/s ratio (target >= 1.5: a merged call pays one model call for many rows).
Then the issue-37 load: 64 clients of one-row requests on the batched server for ``seconds``
(``serve.predict_1row_batched.c64.*``), and that server's resident memory after everything
(``serve.rss_mib_after``: memory the requests leave behind).
Clients and server share this box's cores, so absolute figures are pessimistic; the ratios are
what to track.
"""
from __future__ import annotations

import http.client
import json
import re
import threading
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

NAME = "model"
ROWS = 8
SUPPORT = 16
BATCHING = ["--max-batch-size", "64", "--max-latency-ms", "2"]
# ``smoke`` (bench/run.py --smoke): a model trained a few steps on a few users, every point for a
# fraction of a second (each client still sends its warm-up and at least one timed request:
# ``_client``).
SMOKE_TASKS, SMOKE_TRAIN_STEPS, SMOKE_SECONDS = 300, 4, 0.4


def model_under_bench(work: Path, tasks: int = 2000, steps: int = 30) -> Path:
    """A real `gmeta export` of the quickstart model trained briefly on generated click data, and
    the request bodies: the first test user with enough samples (``SUPPORT`` support samples with
    labels, ``ROWS`` query rows), written next to it as ``requests.json``."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth
    from gmeta_tf.export.client_inputs import task_inputs
    from gmeta_tf.export.export_run import export_run
    from gmeta_tf.metaio.reader import make_dataset
    from gmeta_tf.train.trainer import train

    raw, prepared, run, out = (work / "serve-data" / "raw", work / "serve-data" / "prepared",
                               work / "serve-run", work / "serve-model")
    cfg = load_config("configs/quickstart.yaml", [f"data.path={prepared}", f"train.steps={steps}",
                                                  f"train.checkpoint_every={steps}", f"train.log_every={steps}"])
    synth(str(raw), tasks=tasks, seed=0, kind="click", overwrite=True)
    prepare([str(raw)], str(prepared), cfg.prepare, overwrite=True)
    train(cfg, run, resume=False)
    manifest = export_run(str(run), str(out), overwrite=True)
    inputs = manifest["signatures"]["adapt_and_predict"]["inputs"]
    schema = json.loads((prepared / "schema.json").read_text())
    for batch in make_dataset(str(prepared), "test", cfg.data, training=False):
        for t in range(int(batch["task_mask"].shape[0])):
            sup, qry = (int(batch[w]["mask"].numpy()[t].sum()) for w in ("support", "query"))
            if sup < SUPPORT or qry < ROWS:
                continue
            adapt = {name: value[: SUPPORT if name.startswith("support_") else ROWS].tolist()
                     for name, value in task_inputs(batch, t, inputs, schema).items()}
            predict = {k[len("query_"):]: v for k, v in adapt.items() if k.startswith("query_")}
            (work / "requests.json").write_text(json.dumps({"predict": predict, "adapt_and_predict": adapt}))
            return out
    raise RuntimeError("serve bench: no test user with enough samples")


def _body(work: Path, signature: str) -> bytes:
    inputs = json.loads((work / "requests.json").read_text())[signature]
    return json.dumps({"signature_name": signature, "inputs": inputs}).encode()


def _one_row_body(work: Path) -> bytes:
    """The first predict row, in the row format (``instances``)."""
    inputs = json.loads((work / "requests.json").read_text())["predict"]
    return json.dumps({"signature_name": "predict", "instances": [{k: v[0] for k, v in inputs.items()}]}).encode()


def _calls_and_rows(port: int):
    """(model calls, rows) of ``predict`` so far, from the server's /metrics (``serve/model.py``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    got = {}
    for what in ("calls", "rows"):
        m = re.search(rf'^gmeta_serve_model_{what}_total{{[^}}]*signature="predict"[^}}]*}} (\S+)$', text, re.M)
        got[what] = float(m.group(1)) if m else 0.0
    return got["calls"], got["rows"]


def _client(port: int, body: bytes, stop_at: float, warmup: int, out: List[float], errors: List[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"content-type": "application/json"}
    path = f"/v1/models/{NAME}:predict"
    try:
        i = 0
        while True:
            t0 = time.perf_counter()
            # at least one timed request a client, whatever the window: 64 clients' warm-ups can
            # outlast a short one (the smoke's), and a point with no timed request has no p50
            if i > warmup and t0 >= stop_at:
                break
            conn.request("POST", path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}")
                return
            if i >= warmup:
                out.append(time.perf_counter() - t0)
            i += 1
    finally:
        conn.close()


def _drive(port: int, body: bytes, clients: int, seconds: float, warmup: int = 5):
    """Latencies (s) of every measured request and the wall time they took."""
    per_client: List[List[float]] = [[] for _ in range(clients)]
    errors: List[str] = []
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    threads = [threading.Thread(target=_client, args=(port, body, stop_at, warmup, per_client[c], errors))
               for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"serve bench c{clients}: {errors[0]}")
    return np.concatenate([np.asarray(c) for c in per_client]), time.perf_counter() - t0


def _summary(runs) -> Dict[str, float]:
    lat = np.concatenate([r[0] for r in runs]) * 1000.0
    elapsed = max(sum(r[1] for r in runs), 1e-9)
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "rps": float(len(lat) / elapsed), "requests": int(len(lat))}


def measure(work: Path, seconds: float = 3.0, smoke: bool = False) -> Dict:
    """Both servers run side by side; each predict point alternates between them in two halves,
    so the batching ratio compares the same minutes of this shared box."""
    from tests.serve_fixture import rss_mib, server_process

    work.mkdir(parents=True, exist_ok=True)
    model = model_under_bench(work, SMOKE_TASKS, SMOKE_TRAIN_STEPS) if smoke else model_under_bench(work)
    seconds = SMOKE_SECONDS if smoke else seconds
    predict, adapt = _body(work, "predict"), _body(work, "adapt_and_predict")
    results: Dict = {"rows_per_request": ROWS, "support_per_request": SUPPORT, "seconds_per_point": seconds}
    with server_process(model, work / "serve.log", name=NAME, extra=["--no-access-log"]) as (plain, _), \
            server_process(model, work / "serve-batched.log", name=NAME,
                           extra=["--no-access-log", *BATCHING]) as (batched, batched_proc):
        results["predict"], results["predict_batched"] = {}, {}
        for c in (1, 16):
            halves = [(_drive(plain, predict, c, seconds / 2), _drive(batched, predict, c, seconds / 2))
                      for _ in range(2)]
            results["predict"][f"c{c}"] = _summary([h[0] for h in halves])
            results["predict_batched"][f"c{c}"] = _summary([h[1] for h in halves])
        results["adapt_and_predict"] = {f"c{c}": _summary([_drive(plain, adapt, c, seconds)])
                                        for c in (1, 16)}
        one_row = _one_row_body(work)
        calls0, rows0 = _calls_and_rows(batched)
        quarters = [(_drive(plain, one_row, 16, seconds / 4), _drive(batched, one_row, 16, seconds / 4))
                    for _ in range(4)]
        calls1, rows1 = _calls_and_rows(batched)
        results["predict_1row"] = {"c16": _summary([q[0] for q in quarters])}
        results["predict_1row_batched"] = {"c16": {**_summary([q[1] for q in quarters]),
                                                   "rows_per_call": (rows1 - rows0) / max(calls1 - calls0, 1)}}
        calls0, rows0 = _calls_and_rows(batched)
        results["predict_1row_batched"]["c64"] = _summary([_drive(batched, one_row, 64, seconds)])
        calls1, rows1 = _calls_and_rows(batched)
        results["predict_1row_batched"]["c64"]["rows_per_call"] = (rows1 - rows0) / max(calls1 - calls0, 1)
        time.sleep(1.0)
        results["rss_mib_after"] = rss_mib(batched_proc.pid)
    results["batched_over_unbatched_rps_c16"] = (results["predict_batched"]["c16"]["rps"]
                                                 / results["predict"]["c16"]["rps"])
    results["batched_over_unbatched_rps_1row_c16"] = (results["predict_1row_batched"]["c16"]["rps"]
                                                      / results["predict_1row"]["c16"]["rps"])
    return results
