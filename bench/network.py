"""The ``network`` section of ``make bench``: first, how faithful the emulated links are.

``emulation_check`` builds two emulated hosts (launch/network), shapes both links at ``rate``,
pushes one bulk TCP transfer between them and reports the delivered rate against the set one:
``network.emulation.rate_error``. The delivered rate is TCP payload, so even a perfect link
shows about -4.4% at a 1500-byte MTU (1448 payload bytes of every 1514 on the wire);
``rate_error_wire`` corrects for that and is what measures the shaper itself. Then the
training paths under a sweep of link rates (bench/network_paths.py says what is counted how).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

from bench.network_paths import HOT_BUDGET, UNSHAPED, measure_paths
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


def measure(work: Optional[Path] = None, log=print) -> Dict:
    checks = {r: emulation_check(r) for r in RATES}
    worst = max(checks.values(), key=lambda c: abs(c["rate_error"]))
    out: Dict = {"emulation": {"rate_error": worst["rate_error"], "rate_error_wire": worst["rate_error_wire"],
                               "by_rate": checks}}
    if work is not None:
        out.update(measure_paths_section(work, log))
    return out


def measure_paths_section(work: Path, log=print) -> Dict:
    """The paths under the profile sweep (bench/network_paths.py), plus the headline keys."""
    from bench.hot_split import _prepare, count_traffic

    data = _prepare(work, 1.2)
    res = measure_paths(data, work, log=log)
    out: Dict = dict(res)
    out.update(summarize(res))
    counted = count_traffic(data, HOT_BUDGET)
    out["ps_bytes_counted"] = {"default": counted["ps_bytes_per_step_off"],
                               "hot_split": counted["ps_bytes_per_step_on"]}
    return out


def summarize(res: Dict) -> Dict:
    """``hot_split_best`` (the best speedup over the default and its profile), ``hot_split_loopback``
    (on the unshaped emulated hosts) and the per-PS / per-table ratio at each sweep point."""
    speedups = {k: p["hot_split_speedup"] for k, p in res.items() if "hot_split_speedup" in p}
    out: Dict = {}
    if speedups:
        best = max(speedups, key=speedups.get)
        out["hot_split_best"] = {"speedup": speedups[best], "profile": best}
        out["hot_split_by_profile"] = speedups
    if UNSHAPED in speedups:
        out["hot_split_loopback"] = speedups[UNSHAPED]
    out["per_ps_over_per_table"] = {k: p["per_ps_over_per_table"] for k, p in res.items()
                                    if "per_ps_over_per_table" in p}
    return out
