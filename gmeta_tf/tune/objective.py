"""One ``gmeta tune`` trial: train with the sampled keys, scored on the valid split.

The trainer validates every ``train.eval_every`` steps; each validation is reported to Optuna,
which may prune the trial there (``optuna.TrialPruned`` raised from the hook stops training).
A finished trial is worth its best validation value, i.e. the step early stopping would keep.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict

import optuna

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.errors import UserError
from gmeta_tf.train.validation import auto_metric, metric_mismatch
from gmeta_tf.tune.space import METRIC_DIRECTIONS, BuildConfig, optuna_direction


class TuneConfigError(UserError):
    """The config cannot be tuned as given (no validation to score trials on, unknown metric)."""


def resolve_metric(spec_metric: str | None, cfg: Config, label_kind: str) -> str:
    """The space's metric, else ``train.best_metric``; ``auto`` = mae for ratings, auc for clicks."""
    name = spec_metric or cfg.train.best_metric
    if name == "auto":
        return auto_metric(label_kind)
    if optuna_direction(name) is None:
        raise TuneConfigError(f"config key 'train.best_metric': gmeta tune needs one of "
                              f"{', '.join(METRIC_DIRECTIONS)} or auto, got {name!r}")
    problem = metric_mismatch(name, label_kind, cfg)
    if problem:
        source = "the search space's metric" if spec_metric else "config key 'train.best_metric'"
        raise TuneConfigError(f"{source}: {problem}")
    return name


def require_validation(cfg: Config, where: str = "") -> None:
    if cfg.train.eval_every <= 0:
        raise TuneConfigError(f"config key 'train.eval_every'{where}: gmeta tune scores and prunes trials on "
                              f"the valid split, so it must be > 0 (e.g. --set train.eval_every=50)")


def trial_overrides(params: Dict[str, Any], metric: str) -> Dict[str, Any]:
    """A trial's keys, with the metric its best step is kept by."""
    return {**params, "train.best_metric": metric}


def trial_dir(out: str, number: int) -> str:
    return storage.join(out, "trials", f"trial-{number:03d}")


class TrainingObjective:
    """``(trial, params) -> best validation value``, training embedded in this process."""

    def __init__(self, build: BuildConfig, out: str, metric: str, log: Callable[[str], None] = print):
        self.build, self.out, self.metric, self.log = build, out, metric, log

    def config(self, params: Dict[str, Any]) -> Config:
        cfg = self.build(trial_overrides(params, self.metric))
        require_validation(cfg, f" (with {params})")
        return cfg

    def __call__(self, trial: optuna.Trial, params: Dict[str, Any]) -> float:
        from gmeta_tf.train.trainer import train

        cfg = self.config(params)
        run_dir = trial_dir(self.out, trial.number)
        trial.set_user_attr("run_dir", run_dir)
        self.log(f"trial {trial.number}: {params} -> {run_dir}")

        sign = 1.0 if optuna_direction(self.metric) == "minimize" else -1.0
        best_so_far = [math.inf]

        def on_validation(step: int, metrics: dict) -> None:
            value = float(metrics[self.metric])
            if not math.isfinite(value):  # e.g. AUC of a valid split with one class: nothing to compare
                return
            if sign * value < best_so_far[0]:  # a pruned trial still says where it was best
                best_so_far[0] = sign * value
                trial.set_user_attr("best_step", step)
            trial.report(value, step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"{self.metric} {value:.4f} at step {step} is worse than "
                                         f"the median of earlier trials")

        summary = train(cfg, run_dir, resume=False, on_validation=on_validation)
        best = summary.get("best")
        if not best:
            raise TuneConfigError(f"{run_dir}: training reported no validation result")
        trial.set_user_attr("best_step", int(best["step"]))
        return float(best["value"])
