"""The network bench's headline keys, from its per-point results (bench/network_paths.py).

Kept apart from the runs so that what the keys mean can be tested on made-up numbers in a
second, and changed without running a sweep. The inputs are ``{point: {path: figures}}`` as
``network_paths.measure_paths`` returns them (each path's ``tasks_per_s``, ``wait_share``,
``busiest_link_kb_per_step``) and the two 4-worker runs.

* each path at each point gets ``speedup`` (its tasks/s over the default path's there) and
  ``bytes_ratio`` (its busiest link's bytes per step over the default's): the ratios the issue
  reads, next to the figures they come from;
* ``wait_point``: the point where the default path waits on the link for at least
  ``WAIT_BOUND`` of its step (the fastest such rate: the first where the link binds); where no
  point reaches it, the one where it waits most, with ``wait_bound_reached`` false, so a run on
  a faster box still reports rather than failing;
* ``lean_best``: the best path there (most tasks/s) against the default: ``speedup``,
  ``wait_share_default``, ``bytes_ratio``, and which path and point;
* ``lean_4w``: the default and ``auto`` (``scale_path``) with more workers at the same point (``speedup``);
* ``lean_unshaped``: ``lean`` over the default on the unshaped hosts (``bridge``), and
  ``unshaped_over_default`` each path's;
* ``auto``: at each point, ``auto``'s tasks/s over the faster of its two choices there, the
  split on (``lean``) or off (``int8``: ``lean`` without the hot tier): ``over_faster``; ``picks_faster`` when every point is
  within ``AUTO_NOISE`` of it (one run a point: differences inside the noise are no choice).
"""
from __future__ import annotations

from typing import Dict, Optional

from bench.network_paths import UNSHAPED, WAIT_BOUND, profile_key

DEFAULT = "default"
LEAN = "lean"
AUTO, SPLIT_OFF = "auto", "int8"
AUTO_NOISE = 0.05  # repeats of one point on this box move its tasks/s by a few percent


def add_ratios(res: Dict[str, Dict]) -> None:
    """Each path's ``speedup`` and ``bytes_ratio`` against the default path at the same point."""
    for points in res.values():
        base = points.get(DEFAULT)
        if not isinstance(base, dict):
            continue
        for p in points.values():
            if isinstance(p, dict) and "tasks_per_s" in p:
                p["speedup"] = p["tasks_per_s"] / base["tasks_per_s"]
                p["bytes_ratio"] = p["busiest_link_kb_per_step"] / base["busiest_link_kb_per_step"]


def wait_point(res: Dict[str, Dict]) -> Optional[str]:
    """The point where the default path first waits ``WAIT_BOUND`` or more (least wait among
    those that do), else the one where it waits most; None without shaped points."""
    waits = {k: p[DEFAULT]["wait_share"] for k, p in res.items()
             if k != profile_key(UNSHAPED) and isinstance(p.get(DEFAULT), dict) and "wait_share" in p[DEFAULT]}
    if not waits:
        return None
    bound = {k: w for k, w in waits.items() if w >= WAIT_BOUND}
    return min(bound, key=bound.get) if bound else max(waits, key=waits.get)


def best_path(points: Dict[str, Dict]) -> str:
    """The path other than the default with the most tasks/s at one point."""
    tps = {n: p["tasks_per_s"] for n, p in points.items() if n != DEFAULT and isinstance(p, dict) and "tasks_per_s" in p}
    return max(tps, key=tps.get)


def scale_path(points: Dict[str, Dict]) -> str:
    """The path the larger ring runs beside the default: ``auto`` where it ran (its hot set is
    chosen by bytes for the job's worker count), else the best path."""
    return AUTO if isinstance(points.get(AUTO), dict) else best_path(points)


def summarize(res: Dict[str, Dict], scale: Optional[Dict[str, Dict]] = None,
              scale_label: str = "") -> Dict:
    """The headline keys (module docstring). ``res`` gains ``speedup`` / ``bytes_ratio``."""
    add_ratios(res)
    out: Dict = {}
    point = wait_point(res)
    if point is not None:
        best = best_path(res[point])
        d, b = res[point][DEFAULT], res[point][best]
        out["lean_best"] = {"speedup": b["tasks_per_s"] / d["tasks_per_s"], "wait_share_default": d["wait_share"],
                            "bytes_ratio": b["busiest_link_kb_per_step"] / d["busiest_link_kb_per_step"],
                            "path": best, "point": point, "wait_bound_reached": d["wait_share"] >= WAIT_BOUND}
    if scale and DEFAULT in scale and len(scale) > 1:
        other = next(n for n in scale if n != DEFAULT)
        out["lean_4w"] = {"speedup": scale[other]["tasks_per_s"] / scale[DEFAULT]["tasks_per_s"],
                          "bytes_ratio": (scale[other]["busiest_link_kb_per_step"]
                                          / scale[DEFAULT]["busiest_link_kb_per_step"]),
                          "path": other, "point": point, "hosts": scale_label, "runs": scale}
    per_table = {k: p["per_ps_over_per_table"] for k, p in res.items() if "per_ps_over_per_table" in p}
    if per_table:  # GMETA_BENCH_NETWORK=full only
        out["per_ps_over_per_table"] = per_table
    unshaped = res.get(profile_key(UNSHAPED), {})
    if isinstance(unshaped.get(DEFAULT), dict):
        out["unshaped_over_default"] = {n: p["speedup"] for n, p in unshaped.items()
                                        if n != DEFAULT and isinstance(p, dict) and "speedup" in p}
        if LEAN in out["unshaped_over_default"]:
            out["lean_unshaped"] = out["unshaped_over_default"][LEAN]
    auto = auto_choice(res)
    if auto:
        out["auto"] = auto
    return out


def auto_choice(res: Dict[str, Dict]) -> Dict:
    """``auto`` against the faster of split on / off at each point (module docstring)."""
    over = {}
    for key, points in res.items():
        runs = {n: points.get(n) for n in (AUTO, LEAN, SPLIT_OFF)}
        if all(isinstance(r, dict) and "tasks_per_s" in r for r in runs.values()):
            over[key] = runs[AUTO]["tasks_per_s"] / max(runs[LEAN]["tasks_per_s"], runs[SPLIT_OFF]["tasks_per_s"])
    if not over:
        return {}
    return {"over_faster": over, "picks_faster": all(v >= 1 - AUTO_NOISE for v in over.values())}


def repeats_summary(res: Dict[str, Dict]) -> Dict:
    """The ``network_repeats`` runs' keys (``network_paths.repeat_sweeps``), medians over the
    repeats: ``unshaped_bf16_over_float32`` (today's default wire against the float32 path,
    unshaped; the issue's bound is 0.97) with each pass's own ratio beside it; per fast point
    ``auto_over_lean`` and whether ``auto`` turned the split off there (its PS bytes are the
    split-off path's, several times ``lean``'s); ``auto_picks_faster`` where ``auto`` is within
    ``AUTO_NOISE`` of ``lean`` or ahead at every point."""
    out: Dict = {}
    unshaped = res.get(profile_key(UNSHAPED), {})
    d, b = unshaped.get(DEFAULT), unshaped.get("bf16")
    if isinstance(d, dict) and isinstance(b, dict):
        out["unshaped_bf16_over_float32"] = b["tasks_per_s"] / d["tasks_per_s"]
        out["unshaped_bf16_over_float32_by_pass"] = [x / y for x, y in zip(b["runs_tasks_per_s"], d["runs_tasks_per_s"])]
    over, split_off = {}, {}
    for key, points in res.items():
        a, lean = points.get(AUTO), points.get(LEAN)
        if isinstance(a, dict) and isinstance(lean, dict):
            over[key] = a["tasks_per_s"] / lean["tasks_per_s"]
            split_off[key] = a["wire_ps_bytes_per_worker_step"] > 2 * lean["wire_ps_bytes_per_worker_step"]
    if over:
        out.update(auto_over_lean=over, auto_split_off=split_off,
                   auto_picks_faster=all(v >= 1 - AUTO_NOISE for v in over.values()))
    return out
