"""The ``network`` section of ``make bench``: first, how faithful the emulated links are.

``emulation_check`` builds two emulated hosts (launch/network), shapes both links at ``rate``,
pushes one bulk TCP transfer between them and reports the delivered rate against the set one:
``network.emulation.rate_error``. The delivered rate is TCP payload, so even a perfect link
shows about -4.4% at a 1500-byte MTU (1448 payload bytes of every 1514 on the wire);
``rate_error_wire`` corrects for that and is what measures the shaper itself. The paths
under emulated links (tasks/s, wait share per profile) are issue 33's next step.
"""
from __future__ import annotations

from typing import Dict

from launch.network.netns import EmulatedNetwork, list_namespaces
from launch.network.probe import measure_rate
from launch.network.profile import parse_profile

PAYLOAD_PER_WIRE = 1448 / 1514  # TCP payload / Ethernet frame (20 IP + 32 TCP with timestamps + 14)
RATES = ("100mbit", "1gbit")


def emulation_check(rate: str = "100mbit", seconds: float = 3.0) -> Dict:
    net = EmulatedNetwork(["sender", "receiver"], parse_profile(f"rate={rate}"))
    with net:
        m = measure_rate(net, "sender", "receiver", seconds)
    left = [n for n in list_namespaces() if n.startswith(net.prefix)]
    return {"rate": rate, "set_bit_s": m.set_bit_s, "measured_bit_s": m.measured_bit_s,
            "rate_error": m.error, "rate_error_wire": m.measured_bit_s / PAYLOAD_PER_WIRE / m.set_bit_s - 1.0,
            "seconds": m.seconds, "namespaces_left": len(left)}


def measure() -> Dict:
    checks = {r: emulation_check(r) for r in RATES}
    worst = max(checks.values(), key=lambda c: abs(c["rate_error"]))
    return {"emulation": {"rate_error": worst["rate_error"], "rate_error_wire": worst["rate_error_wire"],
                          "by_rate": checks}}
