"""The parameter-server process (``gmeta ps serve``): a ``tf.distribute.Server`` for job ``ps``.

Workers place TFRA hash tables (and their optimizer slot tables) on ``/job:ps/task:i`` and run
lookups / upserts there over gRPC. Three things make it production-safe:

* **TFRA kernels registered before serving.** A PS that has not loaded TFRA's op libraries
  answers the first table creation with ``'TFRA>CuckooHashTableOfTensors' is neither a type of
  a primitive operation``; ``load_tfra_kernels`` loads them before the server starts.
* **A readiness probe, not a sleep.** An HTTP endpoint (``/ready``: 200 once the gRPC server is
  serving, 503 before) that the local launcher polls and a Kubernetes readinessProbe can use.
* **Clean shutdown on SIGTERM/SIGINT/SIGHUP** (TF's ``Server.join`` never returns): the handler
  only records the signal (``gmeta_tf/stop_signals.py``: a handler that logs or sets an Event can
  deadlock on the lock the main thread holds where it is interrupted); the main loop, woken by the
  wake-up pipe, logs and exits with the signal's code (143 for SIGTERM, ``gmeta_tf/exit_codes.py``),
  so a scheduler's ExitCode policy restarts a PS stopped from outside.
* **No orphan.** Started by ``gmeta launch local`` (``GMETA_LAUNCHER_PID`` set), the PS exits
  when the launcher is gone, even if it was killed with SIGKILL and could not stop its children.
"""
from __future__ import annotations

import glob
import http.server
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, List, Optional

from gmeta_tf import exit_codes

if TYPE_CHECKING:
    from gmeta_tf.stop_signals import StopSignals

log = logging.getLogger("gmeta.ps")
LAUNCHER_PID_ENV = "GMETA_LAUNCHER_PID"  # set by the launcher that started this PS (launch/local_cluster.py)


def load_tfra_kernels() -> List[str]:
    """Load every TFRA op library this PS may be asked to run. Returns the ones loaded."""
    import tensorflow as tf

    from gmeta_tf.embedding.tfra import tfra  # sets TF_USE_LEGACY_KERAS first (gmeta_tf/__init__.py)

    core = os.path.join(os.path.dirname(tfra.__file__), "dynamic_embedding", "core")
    loaded = []
    for so in sorted(glob.glob(os.path.join(core, "_*.so"))):
        name = os.path.basename(so)
        try:
            tf.load_op_library(so)
            loaded.append(name)
        except (tf.errors.NotFoundError, OSError) as e:  # e.g. a GPU-only library on a CPU host
            if "cuckoo" in name:
                raise
            log.warning("skipping TFRA op library %s: %s", name, str(e).splitlines()[0])
    return loaded


class _Health(http.server.BaseHTTPRequestHandler):
    ready = threading.Event()

    def do_GET(self):  # noqa: N802 (http.server's naming)
        ok = self.path in ("/ready", "/healthz") and self.ready.is_set()
        self.send_response(200 if ok else 503)
        self.end_headers()
        self.wfile.write(b"ready\n" if ok else b"not ready\n")

    def log_message(self, *args):  # keep probes out of the PS log
        pass


def serve(ps_hosts: List[str], index: int, health_port: Optional[int] = None,
          ready_file: Optional[str] = None) -> None:
    if not 0 <= index < len(ps_hosts):
        raise ValueError(f"PS index {index} is not in [0, {len(ps_hosts)})")
    address = ps_hosts[index]
    kernels = load_tfra_kernels()
    import tensorflow as tf

    health = None
    if health_port is not None:
        health = http.server.ThreadingHTTPServer(("0.0.0.0", health_port), _Health)
        # a short poll: ``shutdown`` waits for it, and it comes between a stop signal and the exit
        threading.Thread(target=health.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    from gmeta_tf.stop_signals import StopSignals

    launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0") or 0)
    # Installed before the server starts, so a stop asked during the start is kept for after it.
    with StopSignals() as signals:
        cluster = tf.train.ClusterSpec({"ps": ps_hosts})
        server = tf.distribute.Server(cluster, job_name="ps", task_index=index, protocol="grpc", start=True)
        _Health.ready.set()
        if ready_file:
            from gmeta_tf.atomic_file import replace_file

            replace_file(ready_file, f"{server.target}\n")
        log.info("ps %d ready at %s (grpc %s; TFRA kernels: %s; health port %s)",
                 index, address, server.target, ", ".join(kernels), health_port)
        signum = _wait_for_stop(signals, launcher)
        # Still inside the block: a second signal meanwhile is recorded too, not a default death.
        if signum is not None:
            log.info("ps %d (%s): %s, shutting down", index, address, exit_codes.signal_name(signum))
            code = exit_codes.signal_exit(signum)
        else:
            log.info("ps %d (%s): launcher (pid %d) is gone, shutting down", index, address, launcher)
            code = exit_codes.DONE.code
        if health is not None:
            health.shutdown()
        log.info("ps %d stopped", index)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        # tf.distribute.Server has no stop(); its threads would keep the process alive.
        os._exit(code)


def _wait_for_stop(signals: "StopSignals", launcher: int) -> Optional[int]:
    """The stop signal that ended the wait, or None when the launcher (``launcher``, 0: none) is
    gone. Woken by the signal's byte on the wake-up pipe, so the exit follows the signal at once;
    the launcher is looked at once a second."""
    from gmeta_tf.process import pid_alive

    while not signals.received:
        if launcher and not pid_alive(launcher):
            return None
        if not signals.installed:  # served from another thread than the main one: no handler, no pipe
            time.sleep(1.0)
            continue
        got = signals.wait(1.0)
        if got and not signals.received:  # the byte came before the handler ran: it is the same signal
            return got[0]
    return signals.first


def wait_ready(health_url: str, timeout_s: float, proc=None, stop=None) -> None:
    """Block until ``health_url`` answers 200, the process dies, or the time-out passes; raises
    ``InterruptedError`` as soon as ``stop()`` is true (a launcher told to stop meanwhile)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop is not None and stop():
            raise InterruptedError(f"stopped while waiting for {health_url}")
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(health_url, timeout=1.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not ready after {timeout_s:.0f} s ({health_url})")
