"""The paths of the ``network`` bench section: tasks/s and bytes on the wire under emulated links.

Every point is one 2-worker + 2-PS job on emulated hosts (launch/emulated_cluster.py: each PS and
each worker in its own network namespace, started TFJob-style), on the hot split's Zipf 1.2 data
(bench/hot_split.py), so the default path and the hot split read the same batches.

What is counted, and why this way:

* **the window**: the job's start-up (TF imports, graph registration on the PS, the first
  tracing step) is not what a link rate changes, and on 2 cores it dwarfs a short run. So the
  launcher watches worker 0's log and snapshots each host's link counters when it logs step
  ``FIRST`` and again at step ``STEPS``: tasks/s and bytes are of those steps only;
* **bytes on the wire**: each host's ``eth0`` counters (``ip -s link`` in its namespace: what
  the veth carried, Ethernet frames with their headers, both directions). A PS host carries only
  PS traffic; the workers' links carry PS traffic plus the all-reduce between workers, so
  ``allreduce_bytes_per_step = (sum over workers - sum over PS) / 2`` (each worker-to-worker
  byte crosses two worker links). The counters are read when worker 0's log line reaches the
  launcher: under heavy load that is a few steps late, at both ends of the window alike;
* **wait share**: the part of the step the link adds, ``1 - step_s(unshaped) / step_s(profile)``
  against the same path on the unshaped emulated hosts (``bridge``); ``link_busy_share`` is the
  busiest link direction's bytes per step over the rate, divided by the step: the least share
  of the step that direction must spend sending. The in-process lookup/apply timing of bench/distributed.py needs a
  Horovod rank under horovodrun, which these hosts do not run.
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

PER_WORKER_T = 16
WORKERS, PS = 2, 2
FIRST, STEPS = 40, 160  # the measured window: worker 0's steps FIRST..STEPS
LOG_EVERY = 20
HOT_BUDGET = "2MiB"  # bench/hot_split.py's BUDGET
PATHS: Dict[str, List[str]] = {
    "default": ["hot.budget=0"],  # fused tables, one request per PS
    "per_table": ["hot.budget=0", "model.ps_requests=per_table", "model.fuse_tables=false"],  # TFRA's own
    "unfused": ["hot.budget=0", "model.fuse_tables=false"],  # one request per PS, one table each
    "hot_split": [f"hot.budget={HOT_BUDGET}"],
}
UNSHAPED = "bridge"
PROFILES = (UNSHAPED, "rate=1gbit", "rate=100mbit", "rate=20mbit", "rate=5mbit")
REPEATS = 1  # one pass over the sweep: ~50 min on this box; 2 halves the noise (docs/network.md)
_STEP = re.compile(r"\[worker0\].*\bstep (\d+)/(\d+) ")


def profile_key(profile: str) -> str:
    """``rate=100mbit`` -> ``100mbit`` (the results key); a named profile keeps its name."""
    return profile.split("=", 1)[1] if profile.startswith("rate=") else profile


def link_bytes(ns: str, dev: str = "eth0") -> Tuple[int, int]:
    """Bytes ``dev`` in namespace ``ns`` received and sent (Ethernet frames, headers included)."""
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    stats = json.loads(out)[0]["stats64"]
    return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])


@dataclass
class _Window:
    """Link counters of every host at worker 0's steps FIRST and STEPS."""
    hosts: Dict[str, str]  # host -> namespace
    marks: Dict[int, float] = field(default_factory=dict)  # step -> monotonic time
    counters: Dict[int, Dict[str, Tuple[int, int]]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)

    def on_line(self, line: str) -> None:
        m = _STEP.search(line)
        if not m:
            return
        step = int(m.group(1))
        if step in (FIRST, STEPS) and step not in self.marks:
            self.marks[step] = time.monotonic()
            self.counters[step] = {h: link_bytes(ns) for h, ns in self.hosts.items()}
            if step == STEPS:
                self.done.set()


def _entrypoint_args(data: str, out: Path, sets: Sequence[str]) -> List[str]:
    return ["--config", "configs/quickstart.yaml", "--data", data, "--out", str(out), "--steps", str(STEPS),
            *[a for s in [f"data.tasks_per_batch={PER_WORKER_T}", f"train.log_every={LOG_EVERY}",
                          f"train.checkpoint_every={STEPS * 10}", *sets] for a in ("--set", s)]]


def run_point(data: str, out: Path, profile: str, sets: Sequence[str], timeout_s: float = 600) -> Dict[str, float]:
    """One job on emulated hosts: tasks/s and bytes per step over worker 0's measured window."""
    from launch.emulated_cluster import EmulatedCluster
    from launch.emulated_hosts import host_names
    from launch.network.netns import EmulatedNetwork, sweep_stale
    from launch.network.profile import parse_profile

    sweep_stale()
    hosts = host_names(WORKERS, PS)
    net = EmulatedNetwork(hosts, parse_profile(profile))
    window = _Window({h: net.namespace(h) for h in hosts})
    with net:
        cluster = EmulatedCluster(net, log=window.on_line)
        try:
            cluster.start_ps(PS)
            code = cluster.train(WORKERS, _entrypoint_args(data, out, sets), timeout_s)
            dead_ps = [c.name for c in cluster.ps_children() if c.proc.poll() is not None]
        finally:
            cluster.teardown()
    if code != 0 or dead_ps or not window.done.is_set():
        tail = "\n".join(line for c in cluster.children for line in c.lines[-15:])
        raise RuntimeError(f"network bench point {profile} {list(sets)} failed: exit {code}, dead PS {dead_ps}\n{tail}")
    steps = STEPS - FIRST
    seconds = window.marks[STEPS] - window.marks[FIRST]
    per_dir = {h: [(b - a) / steps for a, b in zip(window.counters[FIRST][h], window.counters[STEPS][h])]
               for h in hosts}  # host -> [rx, tx] bytes per step
    per_host = {h: sum(d) for h, d in per_dir.items()}
    busiest_dir = max(max(d) for d in per_dir.values())  # a link is full duplex: its busier direction
    ps_bytes = sum(v for h, v in per_host.items() if h.startswith("ps"))
    worker_bytes = sum(v for h, v in per_host.items() if h.startswith("worker"))
    rate = parse_profile(profile).rate_bit_s
    step_s = seconds / steps
    return {
        "tasks_per_s": steps * WORKERS * PER_WORKER_T / seconds,
        "step_ms": step_s * 1000,
        "wire_ps_bytes_per_step": ps_bytes,  # per job step (both workers' requests)
        "wire_ps_bytes_per_worker_step": ps_bytes / WORKERS,
        "wire_allreduce_bytes_per_step": max(0.0, (worker_bytes - ps_bytes) / 2),
        "wire_busiest_host_bytes_per_step": max(per_host.values()),
        "wire_busiest_direction_bytes_per_step": busiest_dir,
        "link_busy_share": (busiest_dir * 8 / rate / step_s) if rate else 0.0,
    }


def combine(runs: List[Dict[str, float]]) -> Dict[str, float]:
    """Repeats of one point: the median of each figure, and every run's tasks/s (this box is
    shared: one run's tasks/s can move by a quarter with other sessions' load)."""
    import statistics

    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["runs_tasks_per_s"] = [r["tasks_per_s"] for r in runs]
    return out


def measure_paths(data: str, work: Path, profiles: Sequence[str] = PROFILES,
                  paths: Optional[Dict[str, List[str]]] = None, repeats: int = REPEATS, log=print) -> Dict:
    """Every path at every profile, ``repeats`` passes over the whole sweep (a burst of outside
    load hits one pass, not every run of one point), the profile in the outer loop; then the
    ratios the issue asks for (``ratios``)."""
    paths = PATHS if paths is None else paths
    runs: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    for rep in range(repeats):
        for profile in profiles:
            key = profile_key(profile)
            for name, sets in paths.items():
                point = run_point(data, work / f"net-{key}-{name}-{rep}", profile, sets)
                runs.setdefault(key, {}).setdefault(name, []).append(point)
                log(f"[network] {key} {name}: {point['tasks_per_s']:.0f} tasks/s, "
                    f"PS {point['wire_ps_bytes_per_worker_step']:,.0f} B/worker-step, "
                    f"all-reduce {point['wire_allreduce_bytes_per_step']:,.0f} B/step")
    return ratios({key: {name: combine(r) for name, r in points.items()} for key, points in runs.items()})


def ratios(res: Dict[str, Dict]) -> Dict[str, Dict]:
    """Per profile: each path's wait share (against the same path unshaped) and the ratios of
    the default path to TFRA's per-table path, to one table each, and of the hot split to it."""
    base = res.get(profile_key(UNSHAPED), {})
    for points in res.values():
        for name, p in list(points.items()):
            if isinstance(p, dict) and name in base:
                p["wait_share"] = max(0.0, 1.0 - base[name]["step_ms"] / p["step_ms"])
        tps = {n: p["tasks_per_s"] for n, p in points.items() if isinstance(p, dict)}
        if "default" in tps and "per_table" in tps:
            points["per_ps_over_per_table"] = tps["default"] / tps["per_table"]
        if "default" in tps and "unfused" in tps:
            points["fused_over_unfused"] = tps["default"] / tps["unfused"]
        if "default" in tps and "hot_split" in tps:
            points["hot_split_speedup"] = tps["hot_split"] / tps["default"]
    return res
