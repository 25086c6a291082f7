"""``gmeta tune`` end to end: check everything, run the study in OUT, write its results.

OUT holds ``study.db`` (Optuna's SQLite storage: re-running with the same OUT resumes),
``trials/trial-NNN`` (one run directory per trial), ``trials.json`` and ``best.yaml`` (the
full config of the best trial, trainable as is). The two result files are rewritten after
every trial, so an interrupted tune still leaves the best config found so far.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import optuna

from gmeta_tf import storage
from gmeta_tf.config.loader import config_to_dict, dump_config
from gmeta_tf.tune.objective import (
    TrainingObjective,
    TuneConfigError,
    require_validation,
    resolve_metric,
    trial_overrides,
)
from gmeta_tf.tune.space import BuildConfig, SearchSpace, optuna_direction, validate_against_config
from gmeta_tf.tune.study import best_trial, make_pruner, open_study, run_study, trial_records

BEST_FILE = "best.yaml"
TRIALS_FILE = "trials.json"
STUDY_FILE = "study.db"


@dataclass
class TuneRequest:
    build: BuildConfig  # overrides -> Config through the real loader (--config, --data, --set)
    space: SearchSpace
    out: str
    trials: int
    seed: int = 0
    timeout: Optional[float] = None


@dataclass
class TuneResult:
    metric: str
    direction: str
    trials: List[dict] = field(default_factory=list)
    best: Optional[dict] = None  # the best row of ``trials``
    best_config: Optional[str] = None  # path of best.yaml


def prepare(req: TuneRequest):
    """Every check that needs no training, before OUT is touched."""
    from gmeta_tf.metaio.reader import load_schema

    if req.trials < 1:
        raise TuneConfigError(f"--trials must be >= 1, got {req.trials}")
    if "://" in req.out:
        raise TuneConfigError(f"--out {req.out}: gmeta tune keeps its study in SQLite, so OUT must be a local directory")
    base = req.build({})
    require_validation(base)
    validate_against_config(req.space, req.build)
    metric = resolve_metric(req.space.metric, base, load_schema(base.data.path)["label"]["kind"])
    return base, metric


def tune(req: TuneRequest, log: Callable[[str], None] = print) -> TuneResult:
    base, metric = prepare(req)
    direction = optuna_direction(metric)
    Path(req.out).mkdir(parents=True, exist_ok=True)
    fingerprint = {"space": req.space.to_dict(), "metric": metric,
                   "config": json.loads(json.dumps(config_to_dict(base)))}
    study = open_study(direction, req.seed,
                       # spare each trial's first validation: one noisy evaluation prunes good trials
                       pruner=make_pruner(warmup_steps=2 * base.train.eval_every),
                       storage=f"sqlite:///{Path(req.out).resolve() / STUDY_FILE}", fingerprint=fingerprint)
    objective = TrainingObjective(req.build, req.out, metric, log=log)
    result = TuneResult(metric, direction)

    def after_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        value = "-" if trial.value is None else f"{trial.value:.4f}"
        log(f"trial {trial.number} {trial.state.name.lower()}: {metric} {value}")
        write_results(req, objective, study, result)

    # A diverged trial (NaN loss at a too-high learning rate) fails alone; anything else stops.
    run_study(objective, req.space, req.trials, req.seed, direction, study=study, timeout=req.timeout,
              catch=(FloatingPointError,), callbacks=[after_trial])
    write_results(req, objective, study, result)
    return result


def write_results(req: TuneRequest, objective: TrainingObjective, study: optuna.Study, result: TuneResult) -> None:
    result.trials = trial_records(study)
    best = best_trial(study)
    if best is not None:
        result.best = next(r for r in result.trials if r["number"] == best.number)
        result.best_config = storage.join(req.out, BEST_FILE)
        cfg = objective.build(trial_overrides(req.space.values(best.params), result.metric))
        dump_config(cfg, result.best_config)
    storage.write_text(storage.join(req.out, TRIALS_FILE), json.dumps(
        {"metric": result.metric, "direction": result.direction,
         "best": None if result.best is None else result.best["number"], "trials": result.trials},
        indent=1))


def format_trials(result: TuneResult, keys: Sequence[str]) -> str:
    """Plain-text table of the trials, the best one marked with ``*``."""
    best = None if result.best is None else result.best["number"]
    header = ["trial", "state", result.metric, "best step", *keys]
    lines = [header]
    for r in result.trials:
        value = r["value"]
        lines.append([
            f"{r['number']}{'*' if r['number'] == best else ''}", r["state"].lower(),
            "-" if value is None or not math.isfinite(value) else f"{value:.4f}",
            "-" if r["best_step"] is None else str(r["best_step"]),
            *(_short(r["params"].get(k)) for k in keys),
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def _short(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)
