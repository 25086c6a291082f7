"""What an emulated link really carries: one bulk TCP transfer between two emulated hosts.

The receiver runs inside the destination host's namespace and times the bytes itself, from the
first byte after the token bucket's initial burst (``skip_bytes``) to the last, so the number
is the shaped rate, not the burst. Used by tests/test_netem.py and bench/network.py
(``network.emulation.rate_error``).
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from gmeta_tf.errors import NetworkEmulationError
from launch.network.netns import EmulatedNetwork

PORT = 5201  # any port: each host is its own namespace

_RECEIVER = r"""
import json, socket, sys, time
addr, port, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr, port)); srv.listen(1); print("listening", flush=True)
srv.settimeout(30); conn, _ = srv.accept(); conn.settimeout(30)
total, t0, counted = 0, None, 0
while True:
    b = conn.recv(1 << 20)
    if not b:
        break
    total += len(b)
    if t0 is None and total >= skip:
        t0, counted = time.monotonic(), 0
    elif t0 is not None:
        counted += len(b)
t1 = time.monotonic()
print(json.dumps({"bytes": counted, "seconds": (t1 - t0) if t0 else 0.0, "total": total}), flush=True)
"""

_SENDER = r"""
import socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((addr, port), timeout=30)
chunk = b"\0" * (1 << 16); end = time.monotonic() + seconds
while time.monotonic() < end:
    s.sendall(chunk)
s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
"""


@dataclass(frozen=True)
class RateMeasurement:
    set_bit_s: int
    measured_bit_s: float
    bytes: int
    seconds: float

    @property
    def error(self) -> float:
        """Relative error of the delivered rate against the set one (signed)."""
        return self.measured_bit_s / self.set_bit_s - 1.0


def measure_rate(net: EmulatedNetwork, src: str, dst: str, seconds: float = 3.0) -> RateMeasurement:
    """Send from ``src`` to ``dst`` for ``seconds``; the rate ``dst`` received, after the burst."""
    rate = net._rates[src] or net._rates[dst]
    if rate is None:
        raise NetworkEmulationError(f"hosts {src} and {dst} have unshaped links: nothing to measure")
    skip = 4 * 256 * 1024 + rate // 8 // 10  # the buckets' bursts plus 100 ms of line rate
    recv = subprocess.Popen(net.exec_argv(dst, [sys.executable, "-c", _RECEIVER, net.address(dst), str(PORT),
                                                str(skip)]), stdout=subprocess.PIPE, text=True)
    try:
        if recv.stdout.readline().strip() != "listening":
            raise NetworkEmulationError(f"the probe receiver on {dst} did not start")
        subprocess.run(net.exec_argv(src, [sys.executable, "-c", _SENDER, net.address(dst), str(PORT),
                                           str(seconds)]), check=True, timeout=seconds + 60)
        out, _ = recv.communicate(timeout=60)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    doc = json.loads(out.strip().splitlines()[-1])
    if doc["seconds"] <= 0:
        raise NetworkEmulationError(f"the probe moved only {doc['total']} bytes from {src} to {dst}")
    return RateMeasurement(rate, doc["bytes"] * 8 / doc["seconds"], doc["bytes"], doc["seconds"])
