"""The smoke's sections in two processes at once (``python -m bench.run --smoke``).

Why: a smoke section is almost all process start-ups and ends (TensorFlow imports, the PS
readiness wait, the Gloo ring, checkpoints, teardown waits), few of which keep both cores busy
for long; a second section beside it fills what one leaves idle. Each lane is ``python -m
bench.run --smoke --serial`` on its own sections, in its own work directory
(``<smoke work>/lane-<i>``: sections prepare data under fixed names), and writes its own results
file; this merges them and names every section that failed, whichever lane ran it.

The network sections whose jobs are each other's (``ONE_LANE``: e.g. network's unshaped default
and lean jobs are network_repeats' and hot_in_program_2w's too, bench/network_paths.py's
``smoke_point``) run in one lane, one after another, so that one process runs each job once.
Emulated hosts of two lanes do not clash: a network's namespaces carry its owner's pid and id
(``gm-<pid>-<id>-``, launch/network/netns.py), its addresses live inside its own bridge's
namespace, and a sweep removes only networks whose owner is gone; so ``sharding_network``
(no job in common with them) goes to either lane. ``scale_100m`` follows ``scale`` in its
lane (``TOGETHER``): the smoke's run of one is the other's. The lanes are balanced on ``WALL_S``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

LANES = 2
ONE_LANE = ("network", "network_repeats", "hot_in_program_2w")
TOGETHER = (("scale", "scale_100m"),)
# Each section's smoke wall in a lane beside another (s, the mean of ``bench_section_wall_s`` of two
# smoke runs of 2026-11-29 after issue 53's stand-ins, on the 2-core box; one run to the next moves
# a section by up to a fifth): only the lanes' balance reads it; a section not here counts 30 s.
WALL_S = {"meta": 83, "distributed": 69, "sharding": 26, "hot_split": 43, "startup": 17, "serve": 24,
          "export": 1, "delivery": 15, "faults": 107, "network": 76, "network_repeats": 15,
          "hot_in_program_2w": 46, "wire_quality": 14, "sharding_network": 68, "scale": 32, "scale_100m": 0,
          "table_scale": 18}
REPO = Path(__file__).resolve().parents[1]


def plan(sections: Sequence[str], lanes: int = LANES) -> List[List[str]]:
    """``sections`` cut into at most ``lanes`` lists, each in the order given: ``ONE_LANE``'s and
    each of ``TOGETHER`` in one list, the groups placed heaviest first on the lightest lane."""
    groups: List[List[str]] = []
    for tied in (ONE_LANE, *TOGETHER):
        group = [s for s in sections if s in tied]
        if group:
            groups.append(group)
    grouped = {s for g in groups for s in g}
    groups += [[s] for s in sections if s not in grouped]
    load = [0.0] * max(1, lanes)
    placed: List[List[str]] = [[] for _ in load]
    for group in sorted(groups, key=lambda g: -sum(WALL_S.get(s, 30) for s in g)):
        i = load.index(min(load))
        placed[i] += group
        load[i] += sum(WALL_S.get(s, 30) for s in group)
    order = {s: k for k, s in enumerate(sections)}
    return [sorted(lane, key=order.get) for lane in placed if lane]


def merge(into: Dict, other: Dict) -> Dict:
    """``other`` into ``into``, dicts key by key (two lanes may write parts of one section's
    object, e.g. ``sharding`` and ``sharding.network``)."""
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value
    return into


def _relay(i: int, stream) -> None:
    for line in stream:
        print(f"[lane {i}] {line}", end="", flush=True)


def run(sections: Sequence[str], work: Path, lanes: int = LANES) -> Tuple[Dict, List[str]]:
    """Every section in its lane, the lanes at once: the merged results (without the lanes' own
    ``bench_*`` keys) with each section's wall time, and the sections that failed (a lane that
    died counts every section it did not finish)."""
    procs = []
    for i, lane in enumerate(plan(sections, lanes)):
        path = work / f"lane-{i}" / "results.json"
        path.unlink(missing_ok=True)
        env = {**os.environ, "GMETA_BENCH_SMOKE_WORK": str(path.parent), "PYTHONUNBUFFERED": "1"}
        print(f"[bench smoke] lane {i}: {', '.join(lane)}", flush=True)
        proc = subprocess.Popen([sys.executable, "-m", "bench.run", "--smoke", "--serial", "--results", str(path),
                                 *lane], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        relay = threading.Thread(target=_relay, args=(i, proc.stdout), daemon=True)
        relay.start()
        procs.append((lane, path, proc, relay))
    results: Dict = {}
    walls: Dict[str, float] = {}
    failed: List[str] = []
    for lane, path, proc, relay in procs:
        proc.wait()
        relay.join()
        got = json.loads(path.read_text()) if path.is_file() else {}
        lane_walls = got.get("bench_section_wall_s", {})
        walls.update(lane_walls)
        lost = [s for s in lane if s in got.get("bench_failed", []) or s not in lane_walls]
        if proc.returncode != 0 and not lost:  # the lane died after its last section: blame them all
            print(f"[bench smoke] lane {lane} exited {proc.returncode}", file=sys.stderr)
            lost = list(lane)
        failed += lost
        merge(results, {k: v for k, v in got.items() if not k.startswith("bench_")})
    results["bench_section_wall_s"] = {s: walls[s] for s in sections if s in walls}
    return results, [s for s in sections if s in failed]
