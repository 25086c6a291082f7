"""The models `gmeta serve` is tested and benchmarked on, and how tests start it: ONE place.

* ``RUNS`` / ``train_and_export``: real `gmeta export`s of tiny runs on synthetic data (the
  quickstart model's features ``item_id``, ``item_category``, ``user_city``, ``user_segment``,
  ``device``, ``hour``, ``item_tags``, ``dense``), for a click and a rating model;
  ``export_inputs`` makes valid requests for one from its ``export.json``. ``tests/conftest.py``
  trains each once per session (``exported_model``).
* ``build_model``: a stock-TensorFlow SavedModel that is *not* a gmeta export (no
  ``assets.extra/export.json``, inputs named ``user``, ``item``, ``genres``, ``dense``): what any
  other SavedModel looks like to the server, which serves it from its TensorSpecs alone.
  ``example_inputs`` makes requests for it. Its ``read`` signature fails inside the model on a
  path that does not exist: a server fault (HTTP 500), not a client error.
* ``server_process``: the real `gmeta serve` on a free port, stopped after (``server_processes``:
  several, started side by side); ``request``: one HTTP
  request to it. ``send_body`` streams a body over a raw socket (declared length or chunked)
  and reads the answer while it sends; ``big_body`` makes a request body of any size without
  holding it; ``stalled_request`` is a client that sends half a request and waits
  (``wait_read_by_server``: until the server has taken in what such clients sent); ``rss_mib``
  is a process's resident memory.

The stand-in's signatures:

* ``predict(user int64 [N], item int64 [N], genres int64 [N, L], dense float32 [N, D]) -> score [N]``
* ``adapt_and_predict(support_user, support_item, support_genres, support_dense, support_label
  float32 [S], query_user, query_item, query_genres, query_dense) -> score [Q]``: a few SGD steps of
  the output layer on the support samples (on a copy, like the real inner loop), then query scores.
* ``serving_default`` = ``predict``; ``read(path string [N]) -> size int64 [N]``.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
GENRES = 3  # L: multi-hot width
DENSE = 4  # D: dense features
FEATURES = ("user", "item", "genres", "dense")
_ROWS = 97  # rows per table; ids are taken modulo this (stands in for the unknown-id row)
_EMB = 8
_HIDDEN = 16
_INNER_STEPS = 2
_INNER_LR = 0.5


def _specs(prefix: str):
    import tensorflow as tf

    return {
        f"{prefix}user": tf.TensorSpec([None], tf.int64, name=f"{prefix}user"),
        f"{prefix}item": tf.TensorSpec([None], tf.int64, name=f"{prefix}item"),
        f"{prefix}genres": tf.TensorSpec([None, GENRES], tf.int64, name=f"{prefix}genres"),
        f"{prefix}dense": tf.TensorSpec([None, DENSE], tf.float32, name=f"{prefix}dense"),
    }


def _module():
    import tensorflow as tf

    rng = np.random.default_rng(7)

    def var(*shape):
        return tf.Variable(rng.normal(0.0, 0.5, shape).astype(np.float32))

    class StandIn(tf.Module):
        def __init__(self):
            super().__init__()
            self.user_table = var(_ROWS, _EMB)
            self.item_table = var(_ROWS, _EMB)
            self.genre_table = var(_ROWS, _EMB)
            self.dense_w = var(DENSE, _EMB)
            self.w1 = var(4 * _EMB, _HIDDEN)
            self.b1 = var(_HIDDEN)
            self.w2 = var(_HIDDEN)
            self.b2 = var()

        def hidden(self, user, item, genres, dense):
            def rows(table, ids):
                return tf.gather(table, tf.math.floormod(ids, _ROWS))

            x = tf.concat([rows(self.user_table, user), rows(self.item_table, item),
                           tf.reduce_mean(rows(self.genre_table, genres), axis=1),
                           tf.matmul(dense, self.dense_w)], axis=1)
            return tf.tanh(tf.matmul(x, self.w1) + self.b1)

        @staticmethod
        def head(h, w2, b2):
            return tf.linalg.matvec(h, w2) + b2

        @tf.function(input_signature=[_specs("")])
        def predict(self, features):
            h = self.hidden(*(features[k] for k in FEATURES))
            return {"score": tf.sigmoid(self.head(h, self.w2, self.b2))}

        @tf.function(input_signature=[{**_specs("support_"),
                                       "support_label": tf.TensorSpec([None], tf.float32, name="support_label"),
                                       **_specs("query_")}])
        def adapt_and_predict(self, features):
            hs = self.hidden(*(features[f"support_{k}"] for k in FEATURES))
            hq = self.hidden(*(features[f"query_{k}"] for k in FEATURES))
            w2, b2 = tf.identity(self.w2), tf.identity(self.b2)  # fast weights: copies, never assigned
            for _ in range(_INNER_STEPS):
                with tf.GradientTape() as tape:
                    tape.watch([w2, b2])
                    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                        labels=features["support_label"], logits=self.head(hs, w2, b2)))
                gw, gb = tape.gradient(loss, [w2, b2])
                w2, b2 = w2 - _INNER_LR * gw, b2 - _INNER_LR * gb
            return {"score": tf.sigmoid(self.head(hq, w2, b2))}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="path")])
        def read(self, path):
            return {"size": tf.map_fn(lambda p: tf.strings.length(tf.io.read_file(p), unit="BYTE"), path,
                                      fn_output_signature=tf.int32)}

    return StandIn()


def build_model(out_dir) -> Path:
    """Write the stand-in (not a gmeta export) to ``out_dir`` (a SavedModel directory) and return it."""
    import tensorflow as tf

    out = Path(out_dir)
    m = _module()
    predict = m.predict.get_concrete_function()
    tf.saved_model.save(m, str(out), signatures={
        "predict": predict,
        "serving_default": predict,
        "adapt_and_predict": m.adapt_and_predict.get_concrete_function(),
        "read": m.read.get_concrete_function(),
    })
    return out


# name: (synthetic label kind, config overrides on top of configs/quickstart.yaml)
RUNS = {
    "click_top_sgd": ("click", []),
    "click_embeddings": ("click", ["meta.adapt=dense+embedding", "meta.inner_steps=2"]),
    # The MovieLens example's inner loop (examples/movielens/config.yaml), validated so a
    # `best` checkpoint exists.
    "rating_newton": ("rating", ["meta.algo=fomaml", "meta.adapt=head", "meta.inner_solver=newton",
                                 "meta.ridge_lambda=5.0", "meta.learn_ridge_lambda=true",
                                 "train.eval_every=5"]),
    # The MovieLens example's data features: target encoding of the item (prepared with it) and
    # rare items and tags pooled into RARE_ID; k chosen so that some test ids are rare.
    # Also its recency-weighted, least-absolute-deviations support fit (meta.support_half_life,
    # learned; meta.support_loss) and absolute outer loss, and its neighbourhood head
    # (model.neighbourhood), so the export's scores with the head are checked against gmeta eval's.
    "rating_te_rare": ("rating_te", ["meta.algo=fomaml", "meta.adapt=head", "meta.inner_solver=newton",
                                     "meta.ridge_lambda=5.0", "meta.learn_ridge_lambda=true",
                                     "meta.support_half_life=4", "model.rating_loss=absolute",
                                     "meta.support_loss=absolute", "model.neighbourhood=true",
                                     "train.eval_every=5", "data.min_id_count.item_id=3",
                                     "data.min_id_count.item_tags=3"]),
}


def train_and_export(data: Path, root: Path, name: str) -> Tuple[Path, Path, dict]:
    """Run ``name`` of ``RUNS`` trained (10 steps) on the prepared ``data`` into ``root/run`` and
    exported to ``root/export``: (run dir, export dir, manifest)."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.export.export_run import export_run
    from gmeta_tf.train.trainer import train

    _, sets = RUNS[name]
    cfg = load_config(REPO / "configs" / "quickstart.yaml", [
        f"data.path={data}", "data.tasks_per_batch=8", "train.steps=10",
        "train.checkpoint_every=10", "train.log_every=5", *sets])
    run = root / "run"
    train(cfg, run)
    out = root / "export"
    return run, out, export_run(str(run), str(out))


def export_inputs(manifest: dict, signature: str, batch: int = 4, support: int = 6, seed: int = 0,
                  width: int = 3) -> Dict[str, np.ndarray]:
    """Valid inputs for ``signature`` of the export ``manifest`` describes: ids in the data's
    range (some unseen), multi-hot lists of ``width`` padded with -1, dense values near the
    data's, labels the model was trained on (``batch`` rows; ``adapt_and_predict``: ``support``
    labelled samples and ``batch`` queries)."""
    rng = np.random.default_rng(seed)
    sig = manifest["signatures"][signature]
    sig = manifest["signatures"][sig["same_as"]] if "same_as" in sig else sig
    label = manifest["label"]
    out = {}
    for x in sig["inputs"]:
        n = support if x["name"].startswith("support_") else batch
        if x["role"] == "categorical":
            out[x["name"]] = rng.integers(0, 40, n).astype(np.int64)
        elif x["role"] == "multi_hot":
            ids = rng.integers(0, 40, (n, width)).astype(np.int64)
            ids[:, 1:][rng.random((n, width - 1)) < 0.4] = -1
            out[x["name"]] = ids
        elif x["role"] == "dense":
            out[x["name"]] = rng.uniform(0.0, 50.0, (n, x["shape"][1])).astype(np.float32)
        else:  # the label
            values = label["values"] if "values" in label else np.arange(label.get("min", 1), label.get("max", 5) + 1)
            out[x["name"]] = rng.choice(values, n).astype(np.float32)
    return out


def _features(rng, prefix: str, n: int) -> Dict[str, np.ndarray]:
    return {
        f"{prefix}user": rng.integers(0, 10_000, n).astype(np.int64),
        f"{prefix}item": rng.integers(0, 10_000, n).astype(np.int64),
        f"{prefix}genres": rng.integers(0, 50, (n, GENRES)).astype(np.int64),
        f"{prefix}dense": rng.normal(0.0, 1.0, (n, DENSE)).astype(np.float32),
    }


def example_inputs(signature: str, batch: int = 4, support: int = 6, seed: int = 0) -> Dict[str, np.ndarray]:
    """Valid inputs for ``signature`` (``predict``/``serving_default``: ``batch`` rows;
    ``adapt_and_predict``: ``support`` labelled samples and ``batch`` query samples)."""
    rng = np.random.default_rng(seed)
    if signature in ("predict", "serving_default"):
        return _features(rng, "", batch)
    if signature == "adapt_and_predict":
        out = _features(rng, "support_", support)
        out["support_label"] = (rng.random(support) < 0.5).astype(np.float32)
        out.update(_features(rng, "query_", batch))
        return out
    raise ValueError(f"no example inputs for signature {signature!r}")



def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> List[int]:
    from launch import local_cluster

    return local_cluster.free_ports(n)


def request(port: int, method: str, path: str, body: Any = None, timeout: float = 30.0,
            raw: bytes = None, headers: Dict[str, str] = None,
            content_type: Optional[str] = "application/json") -> Tuple[int, Any]:
    """One HTTP request to 127.0.0.1:port; returns (status, parsed JSON or text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        sent = {**({"content-type": content_type} if content_type else {}), **(headers or {})}
        conn.request(method, path, body=data, headers=sent)
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident memory of process ``pid``, MiB: now (``VmRSS``) or its peak so far (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no {field} for process {pid}")


def big_body(path: str, size: int, chunk: int = 1 << 20) -> Tuple[int, Iterator[bytes]]:
    """A JSON request body for ``path`` (v1 ``/…:predict`` or v2 ``/…/infer``) of exactly ``size``
    bytes (at least ~100), made as it is sent: (size, chunks). v1: one ``user`` input of ``size``/2
    ids; v2: one INT64 input whose data is as many ids. Which input does not matter: it is the
    size under test (without a limit the server parses it whole)."""
    if path.endswith("/infer"):
        head, tail = b'{"inputs": [{"name": "user", "shape": [-1], "datatype": "INT64", "data": [', b"7]}]}"
    else:
        head, tail = b'{"inputs": {"user": [', b"7]}}"
    middle = size - len(head) - len(tail)
    if middle < 0:
        raise ValueError(f"big_body: {size} bytes is too small")

    def chunks() -> Iterator[bytes]:
        yield head
        block = b"7," * (chunk // 2)
        left = middle - middle % 2
        while left > 0:
            part = block[:left]
            left -= len(part)
            yield part
        if middle % 2:
            yield b" "
        yield tail

    return size, chunks()


def send_body(port: int, path: str, chunks: Iterable[bytes], length: Optional[int] = None,
              timeout: float = 60.0) -> Tuple[int, str, int]:
    """POST ``chunks`` to 127.0.0.1:port over a raw socket, with ``Content-Length: length``, or
    chunked when ``length`` is None; the answer is read while the body is still being sent (a
    server that refuses a body answers before it is sent whole, and closes). Returns (status, body
    text, body bytes the client managed to send). Status 0: the connection closed without an answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
            f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"]
    sent = [0]

    def write() -> None:
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
            for c in chunks:
                if not c:
                    continue
                sock.sendall(c if length is not None else b"%x\r\n%s\r\n" % (len(c), c))
                sent[0] += len(c)
            if length is None:
                sock.sendall(b"0\r\n\r\n")
        except OSError:  # the server refused the rest (closed): what the caller checks
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    answer = b""
    try:
        while True:
            try:
                data = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not data:
                break
            answer += data
            head_end = answer.find(b"\r\n\r\n")
            if head_end >= 0:
                lines = answer[:head_end].decode("latin-1").split("\r\n")
                declared = [int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")]
                if declared and len(answer) >= head_end + 4 + declared[0]:
                    break
    finally:
        if writer.is_alive():  # still sending to a server that answered: stop it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        writer.join(timeout)
        sock.close()
    if not answer:
        return 0, "", sent[0]
    head_end = answer.find(b"\r\n\r\n")
    return int(answer.split(b" ", 2)[1]), answer[head_end + 4:].decode("utf-8", "replace"), sent[0]


def stalled_request(port: int, path: str, chunked: bool = False, body: int = 1000) -> socket.socket:
    """A client that sends the headers and half of a ``body``-byte request, then waits (the
    caller closes it: a hang-up)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {body}"
    half = b"7" * (body // 2)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
                 .encode() + (b"%x\r\n%s\r\n" % (len(half), half) if chunked else half))
    return sock


def wait_read_by_server(port: int, connections: int, timeout: float = 15.0) -> None:
    """Wait until ``connections`` connections to the server on ``port`` are established and their
    server side has nothing unread (receive queues empty in ``/proc/net/tcp``): the server has
    taken in all its clients sent. TimeoutError past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        drained = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if int(local.split(":")[1], 16) == port and state == "01":  # ESTABLISHED, the server's side
                drained += int(queues.split(":")[1], 16) == 0
        if drained >= connections:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{drained} of {connections} connections to port {port} read by the server")
        time.sleep(0.02)


def hang_up(socks: List[socket.socket]) -> None:
    for s in socks:
        s.close()


@contextlib.contextmanager
def server_process(model_dir, log_path, name: str = "model", extra: Sequence[str] = (),
                   start_timeout: float = 180.0, repo: Path = REPO) -> Iterator[Tuple[int, subprocess.Popen]]:
    """A real `gmeta serve` on a free loopback port, ready when yielded, always stopped after.

    Yields ``(port, process)``. Start-up is bounded: a server that exits or is not ready within
    ``start_timeout`` s fails with the tail of its log. ``repo``: the checkout whose gmeta_tf
    serves (another commit's, to measure before and after a change).
    """
    with server_processes(model_dir, [(log_path, extra)], name, start_timeout, repo) as ((port, proc),):
        yield port, proc


@contextlib.contextmanager
def server_processes(model_dir, runs: Sequence[Tuple[Path, Sequence[str]]], name: str = "model",
                     start_timeout: float = 180.0, repo: Path = REPO) -> Iterator[List[Tuple[int, subprocess.Popen]]]:
    """``server_process`` for several servers of one model at once, one per ``(log path, extra
    options)`` of ``runs``, started side by side (a start is mostly TensorFlow's import, on one
    core: two take little longer than one). Yields ``[(port, process)]`` in ``runs``' order, once
    all are ready; all are stopped after, whichever failed."""
    ports = free_ports(len(runs))
    started: List[Tuple[int, subprocess.Popen, Path, Any]] = []
    try:
        for port, (log_path, extra) in zip(ports, runs):
            cmd = [sys.executable, "-m", "gmeta_tf.cli.main", "serve", "--model", str(model_dir), "--port", str(port),
                   "--name", name, *extra]
            log = open(log_path, "wb")
            try:
                proc = subprocess.Popen(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
            except BaseException:
                log.close()
                raise
            started.append((port, proc, Path(log_path), log))
        deadline = time.monotonic() + start_timeout
        for port, proc, log_path, _ in started:
            _wait_ready(port, proc, name, log_path, deadline, start_timeout)
        yield [(port, proc) for port, proc, _, _ in started]
    finally:
        for _, proc, _, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _, log in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            log.close()


def _wait_ready(port: int, proc: subprocess.Popen, name: str, log_path: Path, deadline: float,
                start_timeout: float) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"gmeta serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if request(port, "GET", f"/v2/models/{name}/ready", timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"gmeta serve not ready after {start_timeout:.0f} s:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
