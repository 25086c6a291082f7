"""Validation while training: score the valid split as ``gmeta eval`` would, keep the best step.

Why: training loss says nothing about cold-start quality (on MovieLens it kept falling while the
cold users' MAE rose), so the only honest signal for "how long to train" and "which weights to
ship" is the metric the user will be judged on, measured on users that training never saw.
The valid split is scored by the very function ``gmeta eval`` uses (adapt on support, score
query), so the number logged here is the number ``gmeta eval --split valid`` prints.

``BestTracker`` is pure bookkeeping (no TensorFlow), so the early-stopping rule is tested on
plain numbers; its state rides in each checkpoint's ``meta.json`` so a resumed run continues
the same patience count.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from gmeta_tf.config.schema import Config, ConfigError, metric_direction

if TYPE_CHECKING:  # the bookkeeping above runs without TensorFlow; validation_point needs it
    from gmeta_tf.model.dlrm import DLRM
    from gmeta_tf.train.runtime import Runtime

OnValidation = Callable[[int, Dict], None]


def auto_metric(kind: str) -> str:
    """What ``auto`` means: the headline metric of the label kind."""
    return "mae" if kind == "rating" else "auc"


# Metrics only one label kind reports (ranking metrics and their variants are reported for both).
KIND_ONLY_METRICS = {"mae": "rating", "rmse": "rating", "auc": "click", "auc_pooled": "click", "logloss": "click"}


def metric_mismatch(name: str, kind: str, cfg: Config) -> Optional[str]:
    """Why validation of this run can never report metric ``name`` (None when it can), so a
    wrong ``train.best_metric`` fails before training, not at the first validation."""
    base = name.removesuffix("_finetune").removesuffix("_no_adapt")
    if base in KIND_ONLY_METRICS and KIND_ONLY_METRICS[base] != kind:
        return f"{name} is a metric of {KIND_ONLY_METRICS[base]} data, but {cfg.data.path} has {kind} labels"
    if name.endswith("_finetune") and (cfg.meta.algo != "erm" or cfg.eval.finetune_steps == 0):
        return f"{name} is reported for ERM runs fine-tuned on the support set (meta.algo erm, eval.finetune_steps > 0)"
    return None


def resolve_metric(cfg: Config, kind: str) -> str:
    """``train.best_metric`` with ``auto`` made concrete for the data's label kind."""
    if cfg.train.best_metric == "auto":
        return auto_metric(kind)
    problem = metric_mismatch(cfg.train.best_metric, kind, cfg)
    if problem and cfg.train.eval_every > 0:
        raise ConfigError(f"config key 'train.best_metric': {problem}")
    return cfg.train.best_metric


@dataclass
class BestTracker:
    """The best validation value so far and how many validations have not beaten it."""

    metric: str
    patience: int = 0
    best_step: int = 0
    best_value: Optional[float] = None
    since_best: int = 0
    history: List[Dict] = field(default_factory=list)

    @property
    def direction(self) -> int:
        return metric_direction(self.metric) or -1

    def update(self, step: int, value: float) -> bool:
        """Record one validation; True when it is a new best (NaN never is)."""
        self.history.append({"step": step, self.metric: value})
        better = math.isfinite(value) and (
            self.best_value is None or (value - self.best_value) * self.direction > 0)
        if better:
            self.best_step, self.best_value, self.since_best = step, float(value), 0
        else:
            self.since_best += 1
        return better

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.since_best >= self.patience

    def state(self) -> Dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: Optional[Dict], metric: str, patience: int) -> "BestTracker":
        """A resumed run continues the saved count; a changed metric starts afresh."""
        if not state or state.get("metric") != metric:
            return cls(metric=metric, patience=patience)
        return cls(metric=metric, patience=patience, best_step=int(state.get("best_step", 0)),
                   best_value=state.get("best_value"), since_best=int(state.get("since_best", 0)),
                   history=list(state.get("history", [])))

    def summary(self) -> Optional[Dict]:
        if self.best_value is None:
            return None
        return {"step": self.best_step, "metric": self.metric, "value": self.best_value}


def validate(model, cfg: Config) -> Dict:
    """The valid split's metrics, computed by ``gmeta eval``'s own function."""
    from gmeta_tf.evaluation.evaluate import evaluate

    return evaluate(model, cfg, cfg.meta.algo, split="valid", with_baselines=False)


def validation_point(cfg: Config, model: "DLRM", rt: "Runtime", tracker: BestTracker, step: int,
                      writer, on_validation: Optional[OnValidation]) -> bool:
    """Rank 0 scores the valid split (the others wait, so the PS holds one state); returns
    whether this step is the best so far, agreed by every rank."""
    import tensorflow as tf

    model.embeddings.quiesce()  # the PS must hold every rank's updates before rank 0 reads it
    rt.sync.barrier()
    improved = 0
    if rt.rank == 0:
        metrics = validate(model, cfg)  # reports tracker.metric: resolve_metric checked it at start
        improved = int(tracker.update(step, float(metrics[tracker.metric])))
        shown = {k: v for k, v in metrics.items() if isinstance(v, float) and not k.endswith("_no_adapt")}
        rt.log(f"step {step} valid " + " ".join(f"{k} {v:.4f}" for k, v in shown.items())
               + (" (best)" if improved else f" (best {tracker.best_value:.4f} at step {tracker.best_step})"))
        if writer is not None:
            with writer.as_default():
                for k, v in metrics.items():
                    if isinstance(v, float):
                        tf.summary.scalar(f"valid/{k}", v, step=step)
        if on_validation is not None:
            on_validation(step, metrics)
    return bool(rt.sync.broadcast_int(improved))
