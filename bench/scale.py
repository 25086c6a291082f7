"""The pipeline at scale: synth, prepare, train (1 process; 2 workers + 2 PS) and eval of N rows.

``python -m bench.scale [ROWS ...] [--smoke]`` (default 1M and 10M rows; ``100000000`` on
request) prints the JSON of ``measure_scale``. Each command is the real CLI (``gmeta data
synth``, ``gmeta data prepare``, ``gmeta train``, ``gmeta launch local``, ``gmeta eval``) in a
process of its own under ``/usr/bin/time -v``, whose "Maximum resident set size" is the peak
RSS of the command (of its largest process: ``launch local``'s workers and PS are processes of
their own, so no peak is given for it). Per size:

* ``synth_rows_per_s`` / ``prepare_rows_per_s``: rows over the command's wall time (its
  Python and library start included: at the smoke size that is most of it);
* ``train_tasks_per_s`` / ``train_tasks_per_s_2w2ps``: the run's own ``aggregate_tasks_per_s``
  (``train_summary.json``, ``train/progress.py``'s window: training steps only, no start-up),
  ``STEPS`` steps of the quickstart config (2 workers: 16 tasks each, the same 32 a step);
* ``eval_users_per_s``: the test split's users (``eval.json``'s ``tasks``) over the wall time of
  ``gmeta eval`` (loading the checkpoint included).

The data of one size lives under ``bench/out/scale/rows-N`` and is deleted once the size is
measured (10M rows are gigabytes); ``bench/scale.png`` plots the cost per row (synth, prepare)
and per user (eval) against the size.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from bench.data import BENCH_DIR, WORK, sizes_from_argv
from gmeta_tf import exit_codes

REPO = BENCH_DIR.parent
ROWS_PER_TASK = 67  # synth's mean rows per user (gmeta_tf/data/synth.py): 15k tasks are ~1M rows
STEPS = 120  # as bench/distributed.py: tasks/s of the steady state, not of the start
SMOKE_ROWS = 20_000
SMOKE_STEPS = 10
# The launched run's workers, PS; the smoke's on 1 + 1: the same ``gmeta launch local``, two
# processes fewer (issue 53; the faults and start-up sections launch 2-worker rings)
HOSTS, SMOKE_HOSTS = (2, 2), (1, 1)
CONFIG = "configs/quickstart.yaml"
FIGURE = BENCH_DIR / "scale.png"
KEYS = ("synth_peak_rss_mb", "synth_rows_per_s", "prepare_rows_per_s", "prepare_peak_rss_mb", "train_tasks_per_s",
        "train_tasks_per_s_2w2ps", "eval_users_per_s", "eval_peak_rss_mb")
_MAX_RSS = re.compile(r"Maximum resident set size \(kbytes\):\s*(\d+)")


class CommandFailed(RuntimeError):
    """A CLI command of the bench exited non-zero; the message holds its log's tail."""


def gmeta(*args: str) -> List[str]:
    return [sys.executable, "-m", "gmeta_tf.cli.main", *args]


def timed(argv: List[str], log: Path, timeout_s: float) -> Dict[str, float]:
    """Run ``argv`` under ``/usr/bin/time -v`` from the repository root (its output in ``log``);
    its wall seconds and peak RSS (MB)."""
    stats = log.with_suffix(".time")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.perf_counter()
    with open(log, "w") as out:
        # a session of its own: a command past its time-out goes with every process it started
        # (``launch local``'s PS and workers), not only ``time`` itself
        proc = subprocess.Popen(["/usr/bin/time", "-v", "-o", str(stats), *argv], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise CommandFailed(f"{' '.join(argv[2:])} ran past {timeout_s:.0f} s (log {log})") from None
    wall = time.perf_counter() - t0
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise CommandFailed(f"{' '.join(argv[2:])} exited {code} (log {log}):\n{tail}")
    m = _MAX_RSS.search(stats.read_text())
    return {"wall_s": wall, "peak_rss_mb": int(m.group(1)) / 1024 if m else float("nan")}


def parquet_rows(directory: Path) -> int:
    """Rows of every parquet file in ``directory`` (from the footers)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(directory.glob("*.parquet")))


def _summary(run: Path) -> float:
    return float(json.loads((run / "train_summary.json").read_text())["aggregate_tasks_per_s"])


def _train_sets(steps: int) -> List[str]:
    return ["--no-resume", "--steps", str(steps), "--set", f"train.log_every={steps}",
            "--set", f"train.checkpoint_every={steps}", "--set", "train.eval_every=0"]


def epoch_steps(prepared: Path) -> int:
    """Steps of one pass over the prepared train split's tasks, at the config's meta-batch."""
    from gmeta_tf.config.loader import load_config

    schema = json.loads((prepared / "schema.json").read_text())
    return max(1, math.ceil(int(schema["splits"]["train"]["tasks"]) / load_config(REPO / CONFIG).data.tasks_per_batch))


def measure_rows(rows: int, work: Path, steps: int = STEPS, log=print, epoch: bool = False,
                 hosts: Tuple[int, int] = HOSTS) -> Dict[str, float]:
    """One size: the five commands on ``rows`` rows of synthetic data under ``work`` (deleted after).
    ``epoch``: the one-process run trains one epoch of the train split instead of ``steps`` (the
    end-to-end run of docs/scale.md: synth → prepare → one epoch → eval, ``end_to_end_wall_s``)."""
    work.mkdir(parents=True, exist_ok=True)
    timeout = 900 + rows / 1_000  # the lead's 10M-row run on a loaded 2-core box
    raw, prep, run1, run2 = work / "raw", work / "prepared", work / "run-1proc", work / "run-2w2ps"
    tasks = max(1, round(rows / ROWS_PER_TASK))
    train_sets = _train_sets(steps)
    try:
        synth = timed(gmeta("data", "synth", "--out", str(raw), "--tasks", str(tasks), "--overwrite"),
                      work / "synth.log", timeout)
        n = parquet_rows(raw)
        log(f"[scale] {rows:,}: synth {n:,} rows ({tasks:,} tasks) in {synth['wall_s']:.1f} s")
        prepare = timed(gmeta("data", "prepare", "-i", str(raw), "--out", str(prep), "--config", CONFIG,
                              "--overwrite"), work / "prepare.log", timeout)
        shutil.rmtree(raw)  # not read again: the biggest intermediate goes first
        log(f"[scale] {rows:,}: prepare in {prepare['wall_s']:.1f} s")
        one_steps = epoch_steps(prep) if epoch else steps
        train = timed(gmeta("train", "--config", CONFIG, "--data", str(prep), "--out", str(run1),
                            *_train_sets(one_steps)), work / "train.log", timeout)
        dist = timed(gmeta("launch", "local", "--workers", str(hosts[0]), "--ps", str(hosts[1]), "--timeout", str(timeout),
                           "--config", CONFIG, "--data", str(prep), "--out", str(run2), *train_sets,
                           "--set", "data.tasks_per_batch=16"), work / "launch.log", timeout)
        log(f"[scale] {rows:,}: train {_summary(run1):.0f} tasks/s, 2w2ps {_summary(run2):.0f} tasks/s")
        ev = timed(gmeta("eval", "--run", str(run1)), work / "eval.log", timeout)
        users = int(json.loads((run1 / "eval.json").read_text())["tasks"])
        return {
            "rows": n, "tasks": tasks, "steps": steps, "train_steps": one_steps,
            "synth_peak_rss_mb": synth["peak_rss_mb"], "synth_rows_per_s": n / synth["wall_s"],
            "prepare_rows_per_s": n / prepare["wall_s"], "prepare_peak_rss_mb": prepare["peak_rss_mb"],
            "train_tasks_per_s": _summary(run1), "train_tasks_per_s_2w2ps": _summary(run2),
            "train_peak_rss_mb": train["peak_rss_mb"], "train_wall_s": train["wall_s"],
            "launch_wall_s": dist["wall_s"],
            "eval_users": users, "eval_users_per_s": users / ev["wall_s"], "eval_peak_rss_mb": ev["peak_rss_mb"],
            "synth_us_per_row": synth["wall_s"] / n * 1e6, "prepare_us_per_row": prepare["wall_s"] / n * 1e6,
            "eval_ms_per_user": ev["wall_s"] / users * 1e3,
            "synth_wall_s": synth["wall_s"], "prepare_wall_s": prepare["wall_s"], "eval_wall_s": ev["wall_s"],
            **({"end_to_end_wall_s": synth["wall_s"] + prepare["wall_s"] + train["wall_s"] + ev["wall_s"]}
               if epoch else {}),
        }
    finally:
        for path in (raw, prep, run1, run2):  # gigabytes at 10M rows; the logs stay
            shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Fleet:
    """The machines the on-paper model spreads 10^9 rows over (assumed, not measured)."""

    machines: int = 16
    cores: int = 16
    memory_gb: float = 64.0
    memory_use: float = 0.8  # share of a machine's memory a plan may fill
    epochs: float = 1.0
    # distinct embedding ids at 10^9 rows: assumed (synth draws items from 1M ids, far fewer than a
    # production catalogue and its users would bring)
    ids: int = 100_000_000
    # TFRA's bytes per row with Adam's slots at 10^8 ids (bench/table_scale.py's cuckoo_model: 596;
    # its measured ps_bytes_per_row at the largest size replaces it)
    table_bytes_per_row: float = 600.0


def on_paper(results: Dict[str, Dict[str, float]], rows: int = 10 ** 9, fleet: Fleet = Fleet()) -> Dict:
    """``rows`` rows from the largest measured size: cut into parts of that size (the size the
    commands were seen to handle: its wall time and peak RSS, no extrapolation), each part one
    process on one core, as many at once per machine as cores and memory allow; training at the
    measured one-process tasks/s per worker (one per machine) times the measured 2w2ps
    efficiency; the tables over PS machines by ``fleet.table_bytes_per_row``. Hours are wall
    hours of the whole fleet; what it leaves out (the parts' schema merge, data transfer,
    validation) is the model's error, not a cost here."""
    size = max((k for k in results if k.isdigit()), key=int)
    r = results[size]
    part_rows = r["rows"]
    parts = math.ceil(rows / part_rows)
    budget_mb = fleet.memory_gb * 1024 * fleet.memory_use
    out: Dict = {"rows": rows, "from_rows": part_rows, "parts": parts, "fleet": asdict(fleet)}
    for stage, wall, rss, units in (("synth", "synth_wall_s", "synth_peak_rss_mb", parts),
                                    ("prepare", "prepare_wall_s", "prepare_peak_rss_mb", parts)):
        at_once = max(1, min(fleet.cores, int(budget_mb // r[rss]))) * fleet.machines
        out[stage] = {"processes_at_once": at_once, "hours": math.ceil(units / at_once) * r[wall] / 3600}
    tasks = rows / ROWS_PER_TASK
    efficiency = r["train_tasks_per_s_2w2ps"] / (2 * r["train_tasks_per_s"])
    train_rate = fleet.machines * r["train_tasks_per_s"] * efficiency
    out["train"] = {"tasks": tasks * fleet.epochs, "workers": fleet.machines, "efficiency_2w2ps": efficiency,
                    "hours": tasks * fleet.epochs / train_rate / 3600}
    table_gb = fleet.ids * fleet.table_bytes_per_row / 2 ** 30
    out["tables"] = {"gb": table_gb, "ps_machines": math.ceil(table_gb * 1024 / budget_mb)}
    users = r["eval_users"] * rows / part_rows
    at_once = max(1, min(fleet.cores, int(budget_mb // r["eval_peak_rss_mb"]))) * fleet.machines
    out["eval"] = {"users": users, "processes_at_once": at_once,
                   "hours": math.ceil(parts / at_once) * r["eval_wall_s"] / 3600}
    out["hours"] = sum(out[s]["hours"] for s in ("synth", "prepare", "train", "eval"))
    return out


def plot(results: Dict[str, Dict[str, float]], path: Path) -> None:
    """Cost per row (synth, prepare: µs) and per user (eval: ms) against the size, log x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted((k for k in results if k.isdigit()), key=int)
    x = [results[s]["rows"] for s in sizes]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("synth_us_per_row", "gmeta data synth"), ("prepare_us_per_row", "gmeta data prepare")):
        a.plot(x, [results[s][key] for s in sizes], "o-", label=label)
    a.set(xscale="log", xlabel="rows", ylabel="µs per row (wall)", title="data: cost per row")
    a.legend()
    b.plot(x, [results[s]["eval_ms_per_user"] for s in sizes], "o-", color="C2", label="gmeta eval (test users)")
    b.set(xscale="log", xlabel="rows", ylabel="ms per user (wall)", title="eval: cost per user")
    b.legend()
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def measure_scale(rows_list: Sequence[int] = (1_000_000, 10_000_000), smoke: bool = False,
                  figure: Optional[Path] = None, log=print, previous: Optional[Dict] = None,
                  epoch: bool = False) -> Dict[str, Dict[str, float]]:
    """``{str(rows): {synth_peak_rss_mb, synth_rows_per_s, prepare_rows_per_s, prepare_peak_rss_mb,
    train_tasks_per_s, train_tasks_per_s_2w2ps, eval_users_per_s, eval_peak_rss_mb, ...},
    "on_paper": on_paper(...)}``; ``previous`` (an earlier result, e.g. 1M and 10M before the 100M
    run on request): its sizes are kept beside the new ones, in the figure and in the result.
    ``smoke``: 20,000 rows and 10 steps, the figure under ``bench/out/scale`` (not ``scale.png``);
    ``epoch``: the one-process run trains one epoch (``measure_rows``)."""
    rows_list = (SMOKE_ROWS,) if smoke else tuple(rows_list)
    steps = SMOKE_STEPS if smoke else STEPS
    work = WORK / "scale"
    kept = {} if smoke else {k: v for k, v in (previous or {}).items() if k.isdigit()}
    hosts = SMOKE_HOSTS if smoke else HOSTS
    out: Dict = {**kept, **{str(r): measure_rows(int(r), work / f"rows-{r}", steps, log, epoch, hosts) for r in rows_list}}
    out = dict(sorted(out.items(), key=lambda kv: int(kv[0])))
    plot(out, figure or (work / "scale-smoke.png" if smoke else FIGURE))
    out["on_paper"] = on_paper(out)  # 10^9 rows from the largest size measured (docs/scale.md)
    return out


def main(argv: List[str]) -> int:
    smoke, rows = sizes_from_argv(argv, [1_000_000, 10_000_000])
    print(json.dumps(measure_scale(rows, smoke=smoke), indent=1))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
