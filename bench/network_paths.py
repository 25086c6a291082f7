"""The paths of the ``network`` bench section: tasks/s and bytes on the wire under emulated links.

Every point is one job on emulated hosts (launch/emulated_cluster.py: each PS and each worker in
its own network namespace, started TFJob-style), 2 workers + 2 PS unless said otherwise, on the
hot split's Zipf 1.2 data (bench/hot_split.py), so every path reads the same batches.

What is run (``PATHS`` x ``POINTS``, then ``SCALE``): the default path, each option that cuts
bytes alone, and all of them together (``lean``), at three link rates: unshaped (``bridge``),
100 Mbit/s, and 5 Mbit/s, the rate where the default path waits on the link for most of its
step (70% measured, docs/network.md). ``GMETA_BENCH_NETWORK=full`` adds TFRA's per-table path
and one table per feature, over five rates (the sweep before issue 41, ~50 min).

What is counted, and why this way:

* **the window**: the job's start-up (TF imports, graph registration on the PS, the first
  tracing step) is not what a link rate changes, and on 2 cores it dwarfs a short run. So the
  bench reads worker 0's status record (gmeta_tf/train/rank_status.py, rewritten at each
  logged step) every ``POLL_S`` and snapshots each host's link counters when it first shows a
  step >= ``FIRST`` and again >= ``STEPS``: tasks/s and bytes are of the steps between the two
  records seen, timed by the records' own ``updated_unix`` (when rank 0 wrote them, not when
  they were read). The record is data, so a changed log line changes nothing here. The job
  runs ``RUN_STEPS``, past the window's end, so the last step's checkpoint (every row read off
  the PS) stays out of the counters;
* **bytes on the wire**: each host's ``eth0`` counters (``ip -s link`` in its namespace: what
  the veth carried, Ethernet frames with their headers). A PS host carries only PS traffic; the
  workers' links carry PS traffic plus the all-reduce between workers, so
  ``allreduce_bytes_per_step = (sum over workers - sum over PS) / 2`` (each worker-to-worker
  byte crosses two worker links). The counters are read up to ``POLL_S`` (plus the read) after
  the record was written; each mark keeps when they were read, and the bytes are divided by
  the steps the counters span (the window's, plus the two lags' difference over the step);
* **the busiest link** (``busiest_link_kb_per_step``): the most bytes one host's link carried
  per job step *in its busier direction* (a link is full duplex: the busier direction is what a
  rate bounds), kB = 1000 bytes. The same figure ``link_busy_share`` divides by the rate;
* **wait share**: the part of the step the link adds, ``1 - step_s(unshaped) / step_s(profile)``
  against the same path on the unshaped emulated hosts (``bridge``); ``link_busy_share`` is the
  busiest link direction's bytes per step over the rate, divided by the step: the least share
  of the step that direction must spend sending. The in-process lookup/apply timing of
  bench/distributed.py needs a Horovod rank under horovodrun, which these hosts do not run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

PER_WORKER_T = 16
WORKERS, PS = 2, 2
# The measured window: worker 0's steps FIRST..STEPS (its record is rewritten every LOG_EVERY
# steps). 60 steps: 4-8 s unshaped, ~15 s at 5 Mbit/s; the wall time of a point is mostly start-up.
FIRST, STEPS = 20, 80
LOG_EVERY = 10
# The job runs on past the window's end, so that end is mid-run: the last step's checkpoint
# (every row read off the PS) and the exit do not fall in the counters read up to POLL_S late.
RUN_STEPS = STEPS + 2 * LOG_EVERY
POLL_S = 0.2  # how often worker 0's status record is read
HOT_BUDGET = "2MiB"  # bench/hot_split.py's BUDGET
BF16 = "cluster.wire_dtype=bfloat16"
# The paths without BF16 are float32 on the wire, as every path was before bfloat16 became the
# default (issue 41): ``default`` stays the baseline the targets compare with.
F32 = "cluster.wire_dtype=float32"
HOT = f"hot.budget={HOT_BUDGET}"
STALE = "model.hot_sync_every=4"
INT8 = "cluster.dense_compression=int8"
AUTO = "model.hot_split=auto"
# The default sweep's paths: the default, each byte-cutting option alone, and all together. Edit
# here. ``auto`` is ``lean`` with the split and its rows left to ``model.hot_split: auto``
# (the rows that save bytes at this point's link rate, embedding/hot/by_bytes.py): the job is
# told the point's rate (``cluster.link_rate``, ``_point_sets``); unshaped, bytes are free and
# auto turns the split off, which makes it the bf16 path with k=4 meaningless.
PATHS: Dict[str, List[str]] = {
    "default": ["hot.budget=0", F32],  # fused tables, one request per PS, no hot tier, float32 wire
    "bf16": ["hot.budget=0", BF16],  # bfloat16 on the wire
    # the dense gradients as int8 blocks on today's default wire (bfloat16): ``lean`` without the
    # hot tier, which is what ``auto`` runs where it turns the split off
    "int8": ["hot.budget=0", BF16, INT8],
    "hot_stale": [HOT, STALE, F32],  # the hot tier, synced every 4th step
    "lean": [HOT, STALE, BF16, INT8],
    "auto": [HOT, STALE, BF16, INT8, AUTO],
}
# GMETA_BENCH_NETWORK=full adds these (the sweep before issue 41, and the hot tier synced every
# step, which issue 41 measured sending more than it saves: 134.4 kB against the default's 134.4).
FULL_PATHS: Dict[str, List[str]] = {
    "hot_split": [HOT, F32],  # the hot tier, synced every step
    "per_table": ["hot.budget=0", "model.ps_requests=per_table", "model.fuse_tables=false"],  # TFRA's own
    "unfused": ["hot.budget=0", "model.fuse_tables=false", F32],  # one request per PS, one table each
}
UNSHAPED = "bridge"
POINTS = (UNSHAPED, "rate=100mbit", "rate=5mbit")
FULL_POINTS = (UNSHAPED, "rate=1gbit", "rate=100mbit", "rate=20mbit", "rate=5mbit")
WAIT_BOUND = 0.5  # the point where the default waits at least this share of its step on the link
SCALE = (4, 2)  # workers, PS of the two extra runs (default and the best path) at that point
REPEATS = 1  # one pass over the sweep; 2 halves the noise (docs/network.md)
FULL_ENV = "GMETA_BENCH_NETWORK"
# 30 steps (was 60) at 5 Mbit/s, the sweep's slowest point (~220 ms a step on the default path):
# there the step is the link's, not the CPU's (0.97 of the busiest link busy), and the 60-step
# window gave 143 tasks/s where 120 steps gave 144 (docs/network.md, "The shorter window's
# noise"), and a 15-step window (issue 53's smoke run) 144 again: half of it reads the same figure. Every path and the two 4-worker runs there:
# ~45 s off make bench. Unshaped and at 100 Mbit/s a step is 35-60 ms: 60 steps stay (a few s).
SLOW_WINDOWS: Dict[str, Tuple[int, int]] = {"rate=5mbit": (FIRST, FIRST + 30)}


@dataclass(frozen=True)
class Sweep:
    """What one ``network`` bench run measures."""
    points: Tuple[str, ...]
    paths: Dict[str, List[str]]
    repeats: int = REPEATS
    scale: Optional[Tuple[int, int]] = SCALE
    window: Tuple[int, int] = (FIRST, STEPS)  # worker 0's steps that are counted
    point_windows: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # a point's own window
    log_every: int = LOG_EVERY  # worker 0's record is rewritten every this many steps
    workers: int = WORKERS  # hosts of each path's job (the scale runs have their own)
    ps: int = PS
    smoke: bool = False  # ``smoke_sweep``'s: a job already run in this process is not run again


    def window_for(self, profile: str) -> Tuple[int, int]:
        return self.point_windows.get(profile, self.window)


# ``smoke`` (bench/run.py --smoke): a 15-step window, records every 5 steps, one pass, each path
# on 1 worker + 1 PS and the scale runs on 2 workers + 1 PS: the same jobs on emulated hosts and
# the same counting, on the fewest processes (a process's start is most of a smoke job). (A 2-step
# window with records every step ended its 6-step job before the 0.2 s poll saw both ends.)
SMOKE_WINDOW, SMOKE_LOG_EVERY = (5, 20), 5
SMOKE_HOSTS, SMOKE_SCALE = (1, 1), (2, 1)
# The smoke's cells that run no job of their own (issue 53): each differs from the cell that
# stands in for it only by a parameter of the same code, which that cell's job runs (the smoke
# reads no figure, so a ratio of the two reads 1). bf16 unshaped: the wire dtype only, and the
# bfloat16 wire runs in ``lean``; default and lean on a shaped link: the shaper's rate only (their
# wire and hot split are set, so the job's ``cluster.link_rate`` changes nothing in it), and
# shaped links carry the smoke's other jobs (the scale's, network_repeats' ``auto``,
# sharding_network's arms).
SMOKE_STAND_INS: Dict[Tuple[str, str], Tuple[str, str]] = {
    (UNSHAPED, "bf16"): (UNSHAPED, "default"),
    ("rate=5mbit", "default"): (UNSHAPED, "default"),
    ("rate=5mbit", "lean"): (UNSHAPED, "lean"),
    ("rate=100mbit", "lean"): (UNSHAPED, "lean"),
}
# This process's smoke jobs by everything that makes one: the network sections in one lane
# (bench/smoke_lanes.py's ONE_LANE) run one job each cell of theirs shares, e.g. the unshaped
# default and lean paths (network) are network_repeats' and hot_in_program_2w's too.
_SMOKE_JOBS: Dict[Tuple, Tuple[str, Dict[str, float]]] = {}


def smoke_sweep(sweep: "Sweep", points: Optional[Sequence[str]] = None,
                paths: Optional[Sequence[str]] = None) -> "Sweep":
    """``sweep`` on smoke sizes, with only ``points`` and ``paths`` where named."""
    return Sweep(tuple(points or sweep.points), {n: p for n, p in sweep.paths.items() if paths is None or n in paths},
                 1, SMOKE_SCALE if sweep.scale else None, SMOKE_WINDOW, {}, SMOKE_LOG_EVERY, *SMOKE_HOSTS, smoke=True)


def _job_key(data: str, profile: str, sets: Sequence[str], sweep: "Sweep") -> Tuple:
    return (data, profile, tuple(_point_sets(profile, sets)), sweep.workers, sweep.ps, sweep.window_for(profile),
            sweep.log_every)


def smoke_point(data: str, out: Path, profile: str, name: str, sets: Sequence[str], sweep: "Sweep",
                log=print) -> Dict[str, float]:
    """A smoke cell's figures: the job's own, or an identical job's or its stand-in's
    (``SMOKE_STAND_INS``) already run in this process; run here when neither was."""
    keys = [_job_key(data, profile, sets, sweep)]
    if (profile, name) in SMOKE_STAND_INS:
        other, other_path = SMOKE_STAND_INS[(profile, name)]
        keys.append(_job_key(data, other, PATHS[other_path], sweep))
    for key in keys:
        if key in _SMOKE_JOBS:
            label, got = _SMOKE_JOBS[keys[0]] = _SMOKE_JOBS[key]
            log(f"[network] smoke: {profile_key(profile)} {name} reads the job of {label}, run before")
            return dict(got)
    got = run_point(data, out, profile, sets, workers=sweep.workers, ps=sweep.ps,
                    window_steps=sweep.window_for(profile), log_every=sweep.log_every)
    _SMOKE_JOBS[keys[0]] = (f"{profile_key(profile)} {name}", got)
    return dict(got)


# The fast points again, for what one pass cannot tell (``python -m bench.run network_repeats``).
# Unshaped, a step is ~35 ms, so the sweep's 60-step window is 2 s and one run of a point moved by
# up to 2.5x between passes; here each window is 300 steps and each path runs REPEATS_FAST times,
# interleaved. The paths are the two questions of the fast points: does today's default (bfloat16
# on the wire) keep the float32 path's speed, and does ``auto`` (which turns the split off where
# bytes are cheap) beat keeping it (``lean``)? ``auto`` at these rates runs what ``int8`` runs.
FAST_POINTS = (UNSHAPED, "rate=100mbit")
REPEATS_FAST = 3
WINDOW_FAST = (FIRST, FIRST + 300)


# ``meta.hot_in_program`` with two workers (issue 43; ``python -m bench.run hot_in_program_2w``):
# ``lean`` (the hot tier synced every 4th step) with the dense math compiled and the hot rows'
# steps outside the XLA program (``lean_jit``) or in it (``lean_in_program``: 3 steps of 4 keep
# the hot rows' whole update there), and ``lean`` itself (uncompiled, today's default) beside
# them. Unshaped: the link costs next to nothing, so what differs is the step's CPU.
JIT = "meta.jit_compile=true"
PROGRAM_PATHS: Dict[str, List[str]] = {"lean": PATHS["lean"], "lean_jit": [*PATHS["lean"], JIT],
                                       "lean_in_program": [*PATHS["lean"], JIT, "meta.hot_in_program=true"]}


def program_sweep() -> Sweep:
    return Sweep((UNSHAPED,), PROGRAM_PATHS, REPEATS_FAST, None, WINDOW_FAST)


def repeat_sweeps() -> List[Sweep]:
    """The ``network_repeats`` runs: unshaped, the default against float32 and ``auto`` against
    ``lean``; at 100 Mbit/s ``auto`` against ``lean`` only."""
    both = {"default": PATHS["default"], "bf16": PATHS["bf16"], "auto": PATHS["auto"], "lean": PATHS["lean"]}
    choice = {"auto": PATHS["auto"], "lean": PATHS["lean"]}
    return [Sweep((FAST_POINTS[0],), both, REPEATS_FAST, None, WINDOW_FAST),
            Sweep(FAST_POINTS[1:], choice, REPEATS_FAST, None, WINDOW_FAST)]


def sweep_from_env(env=os.environ) -> Sweep:
    """The default sweep, or ``GMETA_BENCH_NETWORK=full``'s (five rates, TFRA's per-table path
    and one table per feature too)."""
    if env.get(FULL_ENV, "") == "full":
        return Sweep(FULL_POINTS, {**PATHS, **FULL_PATHS}, point_windows=dict(SLOW_WINDOWS))
    return Sweep(POINTS, dict(PATHS), point_windows=dict(SLOW_WINDOWS))


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
class Mark:
    """One end of the window: worker 0's step as its record said, when rank 0 wrote it, and
    every host's link counters read right after."""
    step: int
    at_unix: float
    counters: Dict[str, Tuple[int, int]]
    read_unix: Optional[float] = None  # when the counters were read (midway); None: at ``at_unix``

    @property
    def lag_s(self) -> float:
        return 0.0 if self.read_unix is None else self.read_unix - self.at_unix


@dataclass
class Window:
    """Polls worker 0's status record in a thread and marks the window's two ends."""
    hosts: Dict[str, str]  # host -> namespace
    status_dir: str
    first: int = FIRST
    last: int = STEPS
    marks: List[Mark] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def start(self) -> "Window":
        self._thread = threading.Thread(target=self._poll, name="network-window", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _poll(self) -> None:
        from gmeta_tf.train import rank_status

        while not self._stop.is_set() and not self.done.is_set():
            record = rank_status.read(self.status_dir, 0)
            if record is not None:
                self.on_record(record.step, record.updated_unix)
            self._stop.wait(POLL_S)

    def on_record(self, step: int, at_unix: float) -> None:
        want = self.first if not self.marks else self.last
        if self.done.is_set() or step < want or (self.marks and step <= self.marks[-1].step):
            return
        t0 = time.time()
        counters = {h: link_bytes(ns) for h, ns in self.hosts.items()}
        self.marks.append(Mark(step, at_unix, counters, (t0 + time.time()) / 2))
        if len(self.marks) == 2:
            self.done.set()


def _entrypoint_args(data: str, out: Path, sets: Sequence[str], run_steps: int = RUN_STEPS,
                     log_every: int = LOG_EVERY) -> List[str]:
    return ["--config", "configs/quickstart.yaml", "--data", data, "--out", str(out), "--steps", str(run_steps),
            *[a for s in [f"data.tasks_per_batch={PER_WORKER_T}", f"train.log_every={log_every}",
                          f"train.checkpoint_every={run_steps * 10}", *sets] for a in ("--set", s)]]


def _point_sets(profile: str, sets: Sequence[str]) -> List[str]:
    """``sets``, plus the point's link rate (``cluster.link_rate``), as ``gmeta launch local
    --network`` tells its jobs and a job on real hosts is told: ``model.hot_split: auto`` and
    ``cluster.wire_dtype: auto`` decide by it. A path that sets both explicitly is unchanged by it."""
    from gmeta_tf.config.rates import format_rate
    from launch.network.profile import parse_profile

    rate = parse_profile(profile).rate_bit_s
    return [*sets, f"cluster.link_rate={format_rate(rate)}"] if rate else list(sets)


def run_point(data: str, out: Path, profile: str, sets: Sequence[str], timeout_s: float = 600,
              workers: int = WORKERS, ps: int = PS, window_steps: Tuple[int, int] = (FIRST, STEPS),
              log_every: int = LOG_EVERY) -> Dict[str, float]:
    """One job on emulated hosts: tasks/s and bytes per step over worker 0's measured window
    (``window_steps``; the job runs ``2 * log_every`` steps past its end)."""
    sets = _point_sets(profile, sets)
    from launch.emulated_cluster import EmulatedCluster
    from launch.emulated_hosts import host_names
    from launch.network.netns import EmulatedNetwork, sweep_stale
    from launch.network.profile import parse_profile

    t0 = time.monotonic()
    shutil.rmtree(out, ignore_errors=True)  # the entrypoint always resumes: an old run would start at its end
    sweep_stale()
    hosts = host_names(workers, ps)
    net = EmulatedNetwork(hosts, parse_profile(profile))
    status_dir = str(out / "status")
    window = Window({h: net.namespace(h) for h in hosts}, status_dir, *window_steps)
    with net:
        cluster = EmulatedCluster(net, log=lambda line: None)  # each child keeps its own tail
        cluster.watch_stops(None, 10.0, status_dir)  # the ranks write their records there
        window.start()
        try:
            cluster.start_ps(ps)
            code = cluster.train(workers, _entrypoint_args(data, out, sets, window_steps[1] + 2 * log_every, log_every),
                                 timeout_s)
            dead_ps = [c.name for c in cluster.ps_children() if c.proc.poll() is not None]
        finally:
            window.stop()
            cluster.teardown()
    if code != 0 or dead_ps or not window.done.is_set():
        tail = "\n".join(line for c in cluster.children for line in c.lines[-15:])
        raise RuntimeError(f"network bench point {profile} {list(sets)} failed: exit {code}, dead PS {dead_ps}, "
                           f"window marks {[m.step for m in window.marks]}\n{tail}")
    return figures(window.marks[0], window.marks[1], hosts, parse_profile(profile).rate_bit_s, workers,
                   time.monotonic() - t0)


def figures(a: Mark, b: Mark, hosts: Sequence[str], rate_bit_s: Optional[int], workers: int,
            wall_s: float = 0.0) -> Dict[str, float]:
    """A point's figures from the window's two ends (module docstring: what each counts)."""
    steps = b.step - a.step
    seconds = b.at_unix - a.at_unix
    step_s = seconds / steps
    # The counters were read a little after each record was written: the steps they span are
    # the window's plus the difference of the two lags (2-10 steps each on an unshaped link).
    counted_steps = steps + (b.lag_s - a.lag_s) / step_s
    per_dir = {h: [(y - x) / counted_steps for x, y in zip(a.counters[h], b.counters[h])]
               for h in hosts}  # host -> [rx, tx] bytes per step
    per_host = {h: sum(d) for h, d in per_dir.items()}
    busiest_dir = max(max(d) for d in per_dir.values())
    ps_bytes = sum(v for h, v in per_host.items() if h.startswith("ps"))
    worker_bytes = sum(v for h, v in per_host.items() if h.startswith("worker"))
    return {
        "tasks_per_s": steps * workers * PER_WORKER_T / seconds,
        "step_ms": step_s * 1000,
        "window_steps": steps,
        "counted_steps": counted_steps,
        "wall_s": wall_s,  # the whole point, start-up included: what the sweep's time is made of
        "busiest_link_kb_per_step": busiest_dir / 1000,
        "wire_ps_bytes_per_step": ps_bytes,  # per job step (every worker's requests)
        "wire_ps_bytes_per_worker_step": ps_bytes / workers,
        "wire_allreduce_bytes_per_step": max(0.0, (worker_bytes - ps_bytes) / 2),
        "wire_busiest_host_bytes_per_step": max(per_host.values()),  # both directions
        "wire_busiest_direction_bytes_per_step": busiest_dir,
        "link_busy_share": (busiest_dir * 8 / rate_bit_s / step_s) if rate_bit_s else 0.0,
        "wire_bytes_per_step_by_host": per_host,  # both directions, per host
    }


def combine(runs: List[Dict[str, float]]) -> Dict[str, float]:
    """Repeats of one point: the median of each figure, and every run's tasks/s (this box is
    shared: one run's tasks/s can move by a quarter with other sessions' load)."""
    import statistics

    def median(values):  # a per-host figure is a dict: the median host by host
        values = list(values)
        if isinstance(values[0], dict):
            return {h: statistics.median(v[h] for v in values) for h in values[0]}
        return statistics.median(values)

    out = {k: median(r[k] for r in runs) for k in runs[0]}
    out["runs_tasks_per_s"] = [r["tasks_per_s"] for r in runs]
    return out


def measure_paths(data: str, work: Path, sweep: Optional[Sweep] = None, log=print) -> Dict:
    """Every path at every point, ``repeats`` passes over the whole sweep (a burst of outside
    load hits one pass, not every run of one point), the point in the outer loop; each path's
    wait share and the per-point ratios (``ratios``)."""
    sweep = sweep_from_env() if sweep is None else sweep
    runs: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
    for rep in range(sweep.repeats):
        for profile in sweep.points:
            key = profile_key(profile)
            for name, sets in sweep.paths.items():
                out = work / f"net-{key}-{name}-{rep}"
                if sweep.smoke:
                    point = smoke_point(data, out, profile, name, sets, sweep, log)
                else:
                    point = run_point(data, out, profile, sets, workers=sweep.workers, ps=sweep.ps,
                                      window_steps=sweep.window_for(profile), log_every=sweep.log_every)
                runs.setdefault(key, {}).setdefault(name, []).append(point)
                log(f"[network] {key} {name}: {point['tasks_per_s']:.0f} tasks/s, "
                    f"busiest link {point['busiest_link_kb_per_step']:,.1f} kB/step, "
                    f"PS {point['wire_ps_bytes_per_worker_step']:,.0f} B/worker-step, "
                    f"all-reduce {point['wire_allreduce_bytes_per_step']:,.0f} B/step, {point['wall_s']:.0f} s")
    return ratios({key: {name: combine(r) for name, r in points.items()} for key, points in runs.items()})


def measure_scale(data: str, work: Path, profile: str, paths: Dict[str, List[str]], workers: int, ps: int,
                  log=print, window_steps: Tuple[int, int] = (FIRST, STEPS),
                  log_every: int = LOG_EVERY) -> Dict[str, Dict[str, float]]:
    """``paths`` at one point with ``workers`` + ``ps`` hosts (one run each)."""
    out = {}
    for name, sets in paths.items():
        out[name] = p = run_point(data, work / f"net-{profile_key(profile)}-{workers}w{ps}ps-{name}", profile, sets,
                                  workers=workers, ps=ps, window_steps=window_steps, log_every=log_every)
        log(f"[network] {profile_key(profile)} {workers}w{ps}ps {name}: {p['tasks_per_s']:.0f} tasks/s, "
            f"busiest link {p['busiest_link_kb_per_step']:,.1f} kB/step, {p['wall_s']:.0f} s")
    return out


def ratios(res: Dict[str, Dict]) -> Dict[str, Dict]:
    """Per point: each path's wait share (against the same path unshaped) and, where the full
    sweep ran them, the default path over TFRA's per-table path and over one table each."""
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
    return res
