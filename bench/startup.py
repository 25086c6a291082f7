"""The ``startup`` row of ``make bench``: time to the first step with 1, 2, 4 and 8 workers, 2 PS.

What is timed, per worker count, on fresh PS processes (``bench/startup_rank.py`` prints the two
timestamps from inside every rank):

* ``seconds_<n>w`` (*start-up*): from the moment every rank has imported TensorFlow and joined
  the Horovod ring (the latest rank's "joined" timestamp, taken after a barrier) to the first
  completed training step on the slowest rank. This is the part the cluster protocol owns:
  connecting to the PS, creating / binding the tables and slot tables, restoring, tracing and
  running the first step.
* ``wall_seconds_<n>w``: from launching ``horovodrun`` to the same point. On a small box this is
  dominated by n processes importing TensorFlow at once, which no protocol change can remove.

``ratio_8w_over_1w`` is ``seconds_8w / seconds_1w`` (target ≤ 1.5). ``GMETA_BENCH_STARTUP_BASELINE``
may name another checkout (e.g. one before the change); its numbers are measured in the same run
and stored under ``baseline_…`` for a before/after comparison.
"""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, Optional

WORKERS = (1, 2, 4, 8)
# ``smoke`` (bench/run.py --smoke): the hook, the stamps and the ratio with the fewest ranks that
# still make a ratio (``ratio_2w_over_1w``); the same code at any worker count.
SMOKE_WORKERS = (1, 2)
PS, SMOKE_PS = 2, 1  # the smoke's rings against 1 PS: the same hook and stamps, one process fewer a run
# The smoke launches the 2-worker ring only and reads its times for the 1-worker one too
# (``same_as``): the two runs differ by the worker count only, the same hook, stamps and ratio
# code on both (issue 53: two processes fewer; the smoke reads no figure).
SMOKE_SAME_AS = {1: 2}
RANK_SCRIPT = Path(__file__).resolve().with_name("startup_rank.py")
_STAMP = re.compile(r"GMETA_STARTUP (joined|step) (\d+) ([0-9.]+)")


def _train_argv(data: str, out: Path) -> list:
    return ["train", "--config", "configs/quickstart.yaml", "--data", data, "--out", str(out), "--no-resume",
            "--steps", "2", "--set", "data.tasks_per_batch=8", "--set", "train.log_every=1",
            "--set", "train.checkpoint_every=1000"]


def run_once(workers: int, data: str, out: Path, code: Optional[str] = None, log=print,
             timeout_s: float = 590.0, ps: int = PS) -> Dict[str, float]:
    """One launch of ``workers`` ranks against ``ps`` fresh PS; the two times in seconds."""
    from launch.local_cluster import LocalCluster

    env = {"PYTHONPATH": os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p)}
    cluster = LocalCluster(log=lambda m: None, env=env)
    try:
        cluster.start_ps(ps)
        argv = [sys.executable, str(RANK_SCRIPT), *_train_argv(data, out), "--ps", ",".join(cluster.ps_addresses)]
        t0 = time.time()
        code_ = cluster.run_workers(workers, argv, timeout_s=timeout_s)
        lines = [line for c in cluster.children if c.name == "horovodrun" for line in c.lines]
        ps_alive = all(c.proc.poll() is None for c in cluster.ps_children())
    finally:
        cluster.teardown()
    stamps: Dict[str, Dict[int, float]] = {"joined": {}, "step": {}}
    for line in lines:
        m = _STAMP.search(line)
        if m:
            stamps[m.group(1)][int(m.group(2))] = float(m.group(3))
    if code_ != 0 or not ps_alive or any(len(s) != workers for s in stamps.values()):
        tail = "\n".join([line for line in lines if "rror" in line][-10:] + lines[-20:])
        raise RuntimeError(f"start-up run with {workers} workers failed (exit {code_}, PS alive {ps_alive}):\n{tail}")
    last_step = max(stamps["step"].values())
    result = {"seconds": last_step - max(stamps["joined"].values()), "wall_seconds": last_step - t0}
    log(f"[startup] {workers} worker(s){' (' + code + ')' if code else ''}: start-up {result['seconds']:.1f} s, "
        f"from launch {result['wall_seconds']:.1f} s")
    return result


def measure(data: str, work: Path, workers: Iterable[int] = WORKERS, log=print, ps: int = PS,
            same_as: Optional[Dict[int, int]] = None) -> Dict[str, float]:
    """``same_as`` (the smoke's ``SMOKE_SAME_AS``): worker counts whose times are another
    count's, launched first."""
    out: Dict[str, float] = {}
    same_as = same_as or {}
    baseline = os.environ.get("GMETA_BENCH_STARTUP_BASELINE")
    for prefix, code in (("", None), ("baseline_", baseline)):
        if prefix and not code:
            continue
        runs: Dict[int, Dict[str, float]] = {}
        for n in sorted(workers, key=lambda n: n in same_as):  # the launched counts first
            if n in same_as:
                r = runs[same_as[n]]
            else:
                r = runs[n] = run_once(n, data, work / f"startup-{prefix}{n}w", code=code, log=log, ps=ps)
            out[f"{prefix}seconds_{n}w"] = r["seconds"]
            out[f"{prefix}wall_seconds_{n}w"] = r["wall_seconds"]
        most = max(workers)  # the largest ring against one worker: ratio_8w_over_1w in make bench
        if most > 1 and f"{prefix}seconds_1w" in out:
            out[f"{prefix}ratio_{most}w_over_1w"] = out[f"{prefix}seconds_{most}w"] / out[f"{prefix}seconds_1w"]
            out[f"{prefix}wall_ratio_{most}w_over_1w"] = out[f"{prefix}wall_seconds_{most}w"] / out[f"{prefix}wall_seconds_1w"]
    if baseline:
        out["baseline_code"] = baseline
    return out


if __name__ == "__main__":  # python -m bench.startup DATA [N ...]: some worker counts, without make bench
    data_dir, *ns = sys.argv[1:]
    print(measure(data_dir, Path("bench/out"), [int(n) for n in ns] or WORKERS))
