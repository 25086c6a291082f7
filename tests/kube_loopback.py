"""A loopback Kubernetes API server for ``gmeta job``'s tests, and a kubeconfig pointing at it.

``tests/test_job_kube_answers.py`` (the ``kubernetes`` client asked) and
``tests/test_job_real_kubectl.py`` (the real kubectl asked) give it their own request handler:
each plays the answers its client reads. ``serve`` starts it on a free port, writes the kubeconfig
(context ``dev``, namespace ``ml``) and points ``KUBECONFIG`` at it; ``handler.kubeconfig(port)``
repoints it (a test's unreachable server).
"""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml
from click.testing import CliRunner

from gmeta_tf.cli.job_cmd import job_group


class JsonHandler(BaseHTTPRequestHandler):
    """Replies in JSON, quietly."""

    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve(base, tmp_path, monkeypatch):
    """Start a fresh subclass of ``base`` on loopback (a test sets its class attributes: they
    last for that test only); yields the subclass."""
    handler = type(base.__name__, (base,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def kubeconfig(port):
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "dev",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}]}))
        monkeypatch.setenv("KUBECONFIG", str(path))

    kubeconfig(server.server_address[1])
    handler.kubeconfig = staticmethod(kubeconfig)
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def cli_error(args):
    """``gmeta job ARGS``'s one-line error (exit 2), asserted to be one line on stderr."""
    r = CliRunner(mix_stderr=False).invoke(job_group, args)
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    return r.stderr


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): an API server that does not answer."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
