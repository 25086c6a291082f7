"""The ``network`` section of ``make bench``: first, how faithful the emulated links are.

``emulation_check`` builds two emulated hosts (launch/network), shapes both links at ``rate``,
pushes one bulk TCP transfer between them and reports the delivered rate against the set one:
``network.emulation.rate_error``. The delivered rate is TCP payload, so even a perfect link
shows about -4.4% at a 1500-byte MTU (1448 payload bytes of every 1514 on the wire);
``rate_error_wire`` corrects for that and is what measures the shaper itself. Then the
training paths under three link rates (bench/network_paths.py says what is run and counted how;
bench/network_summary.py what the headline keys are).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

from bench.network_paths import (
    HOT_BUDGET,
    UNSHAPED,
    measure_paths,
    measure_scale,
    profile_key,
    smoke_sweep,
    sweep_from_env,
)
from bench.network_summary import scale_path, summarize, wait_point
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


# ``smoke`` (bench/run.py --smoke): the two ends of the sweep (unshaped, the slowest rate) with
# the default and ``lean`` paths, then the scale's best path: every step of the section on 3 short
# jobs (the slowest rate's cells read the unshaped jobs: network_paths.SMOKE_STAND_INS)
SMOKE_POINTS, SMOKE_PATHS, SMOKE_CHECK_S = (UNSHAPED, "rate=5mbit"), ("default", "lean"), 0.5


def measure(work: Optional[Path] = None, log=print, smoke: bool = False) -> Dict:
    checks = {r: emulation_check(r, SMOKE_CHECK_S if smoke else 3.0) for r in RATES}
    worst = max(checks.values(), key=lambda c: abs(c["rate_error"]))
    out: Dict = {"emulation": {"rate_error": worst["rate_error"], "rate_error_wire": worst["rate_error_wire"],
                               "by_rate": checks}}
    if work is not None:
        out.update(measure_paths_section(work, log, smoke))
    return out


def measure_paths_section(work: Path, log=print, smoke: bool = False) -> Dict:
    """The paths at each point (bench/network_paths.py), then the default and the best path with
    ``SCALE``'s workers at the point where the default first waits >= 50% of its step on the link
    (``wait_point``), then the headline keys (bench/network_summary.py)."""
    from bench.hot_split import _prepare, count_traffic

    sweep = sweep_from_env()
    if smoke:
        sweep = smoke_sweep(sweep, SMOKE_POINTS, SMOKE_PATHS)
    data = _prepare(work, 1.2, smoke)
    res = measure_paths(data, work, sweep, log=log)
    scale, label = None, ""
    point = wait_point(res)
    if sweep.scale and point is not None:
        workers, ps = sweep.scale
        # ``auto`` where the sweep has it: it chooses the hot rows by bytes for the job's worker
        # count, so it is the combination meant for a larger ring (the all-gather grows with it);
        # the 2-worker best (``lean`` and ``auto`` are within noise there) keeps every hot row.
        best = scale_path(res[point])
        profile = next(p for p in sweep.points if profile_key(p) == point)
        # The smoke runs the larger ring's best path only (the 2-worker job on emulated hosts:
        # its ring and all-gather); its default, which differs from the sweep's default at this
        # point only by the worker count, is that job's figures (the smoke reads none).
        scaled = {best: sweep.paths[best]} if smoke else {"default": sweep.paths["default"], best: sweep.paths[best]}
        scale = measure_scale(data, work, profile, scaled, workers, ps, log=log,
                              window_steps=sweep.window_for(profile), log_every=sweep.log_every)
        if smoke:
            scale = {"default": dict(res[point]["default"]), **scale}
        label = f"{workers}w{ps}ps"
    out: Dict = dict(res)
    out.update(summarize(res, scale, label))
    counted = count_traffic(data, HOT_BUDGET, batches=2) if smoke else count_traffic(data, HOT_BUDGET)
    out["ps_bytes_counted"] = {"default": counted["ps_bytes_per_step_off"],
                               "hot_split": counted["ps_bytes_per_step_on"]}
    return out
