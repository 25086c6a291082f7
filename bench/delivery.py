"""``python -m bench.run delivery``: continuous training, warm start against training from scratch.

A "yesterday" model is trained on day 0 of one synthetic world (``gmeta data synth --day``).
Day 1 brings new users and, in the long tail, item ids day 0 never had. Two runs train on day 1
with the same config, validating every ``EVAL_EVERY`` steps: one from scratch, one warm-started
from yesterday's best checkpoint (``gmeta train --warm-start``). The from-scratch run's best
validation AUC is the bar; we report how many steps (and how much wall time) each run needed to
reach it: ``steps_ratio_warm_over_scratch`` and ``time_ratio_warm_over_scratch`` (target ≤ 1/4).
Wall time per step is each run's whole time over its steps (validation included), measured in
this one process, one run after the other.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional

TASKS = 1500  # users per day
EVAL_EVERY = 10
SETS = [f"train.eval_every={EVAL_EVERY}", "train.early_stop_patience=8", "train.log_every=50",
        "train.checkpoint_every=1000"]


# ``smoke`` (bench/run.py --smoke): the three trainings a few steps each on a few users, one
# validation each (EVAL_EVERY divides the steps)
SMOKE_TASKS, SMOKE_STEPS = 300, 10


def _day(work: Path, day: int, tasks: int = TASKS) -> str:
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    raw, prepared = work / f"day{day}" / "raw", work / f"day{day}" / "prepared"
    synth(str(raw), tasks=tasks, seed=11, day=day, overwrite=True)
    prepare([str(raw)], str(prepared), load_config("configs/quickstart.yaml").prepare, overwrite=True)
    return str(prepared)


def _train(data: str, run: Path, steps: int, warm_start: Optional[str] = None) -> Dict:
    import shutil

    from gmeta_tf.config.loader import load_config
    from gmeta_tf.train.trainer import train

    shutil.rmtree(run, ignore_errors=True)
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data}", f"train.steps={steps}", *SETS])
    t0 = time.perf_counter()
    summary = train(cfg, run, warm_start=warm_start)
    summary["seconds"] = time.perf_counter() - t0
    return summary


def steps_to_reach(validation: List[Dict], metric: str, bar: float) -> Optional[int]:
    """The first validation step whose ``metric`` (higher is better) reaches ``bar``; None if none."""
    return next((v["step"] for v in validation if v[metric] >= bar), None)


def measure(work: Path, yesterday_steps: int = 400, today_steps: int = 400, smoke: bool = False) -> Dict:
    work.mkdir(parents=True, exist_ok=True)
    if smoke:
        yesterday_steps = today_steps = SMOKE_STEPS
    tasks = SMOKE_TASKS if smoke else TASKS
    day0, day1 = _day(work, 0, tasks), _day(work, 1, tasks)
    yesterday = _train(day0, work / "yesterday", yesterday_steps)
    scratch = _train(day1, work / "scratch", today_steps)
    warm = _train(day1, work / "warm", today_steps, warm_start=str(work / "yesterday"))
    metric = scratch["best"]["metric"]
    bar = scratch["best"]["value"]
    scratch_steps = scratch["best"]["step"]
    warm_steps = steps_to_reach(warm["validation"], metric, bar)
    per_step = {name: run["seconds"] / max(run["last_step"], 1) for name, run in (("scratch", scratch), ("warm", warm))}
    out = {
        "metric": metric, "scratch_best": bar, "scratch_steps": scratch_steps,
        "warm_steps": warm_steps, "warm_best": warm["best"]["value"], "warm_first_validation": warm["validation"][0][metric],
        "scratch_first_validation": scratch["validation"][0][metric], "yesterday_best": yesterday["best"]["value"],
        "eval_every": EVAL_EVERY, "tasks_per_day": tasks,
        "seconds_per_step": per_step,
    }
    if warm_steps is not None:
        out["steps_ratio_warm_over_scratch"] = warm_steps / scratch_steps
        out["time_ratio_warm_over_scratch"] = (warm_steps * per_step["warm"]) / (scratch_steps * per_step["scratch"])
    return out
