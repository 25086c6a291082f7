"""The Optuna study behind ``gmeta tune``, independent of training.

``run_study`` only knows a search space and an objective ``(trial, params) -> value``; tests
plug in planted objectives, ``gmeta_tf.tune.objective`` plugs in training. Sampling is
Optuna's seeded TPE (not a grid: it spends the trials near what has worked so far) and pruning
its median rule on the values the objective reports while it runs.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import optuna
from optuna.trial import TrialState

from gmeta_tf.errors import UserError
from gmeta_tf.tune.space import SearchSpace

Objective = Callable[[optuna.Trial, Dict[str, Any]], float]

# Trials that end in these states count towards --trials, except one left RUNNING by a killed
# run: it is marked failed and ``abandoned`` when the study is resumed, and a new trial takes its
# place (with new parameters: ``open_study`` reseeds the sampler of a resumed study).
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class StudyMismatchError(UserError):
    """The stored study was started for another search, so its trials cannot be continued."""


def make_pruner(warmup_steps: int = 0, startup_trials: int = 3) -> optuna.pruners.BasePruner:
    """Median rule: a trial stops once its best report is worse than the median of earlier
    trials' at the same step. ``warmup_steps`` spares its first validation(s), which are noisy."""
    return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)


def open_study(direction: str, seed: int, pruner: Optional[optuna.pruners.BasePruner] = None,
               storage: Optional[str] = None, study_name: str = "gmeta-tune",
               fingerprint: Optional[dict] = None) -> optuna.Study:
    """A new study, or the one already in ``storage`` under ``study_name`` (resume).

    ``fingerprint`` (JSON-ready: the space, the base config, ...) is stored with a new study and
    must be equal on resume: trials of another search would mislead the sampler and the result.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage, study_name=study_name, direction=direction, load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner or optuna.pruners.NopPruner(),
    )
    where = f"study '{study_name}' in {storage}"
    if study.direction != optuna.study.StudyDirection[direction.upper()]:
        raise StudyMismatchError(f"{where} was started to {study.direction.name.lower()} its metric, "
                                 f"this run would {direction} it; use a new output directory")
    if fingerprint is not None:
        stored = study.user_attrs.get("fingerprint")
        if stored is None and not study.get_trials(deepcopy=False):
            study.set_user_attr("fingerprint", fingerprint)
        elif stored != fingerprint:
            changed = sorted(k for k in set(fingerprint) | set(stored or {})
                             if (stored or {}).get(k) != fingerprint.get(k))
            raise StudyMismatchError(f"{where} was started with a different {', '.join(changed)}; "
                                     f"re-run with the same arguments to resume it, or use a new output directory")
    _fail_abandoned(study)
    stored = len(study.get_trials(deepcopy=False))
    if stored:
        # A sampler seeded as before would draw the same parameters as the first trials again
        # (TPE starts with seeded random draws): a resumed study draws from a stream of its own,
        # still reproducible from (seed, trials stored).
        study.sampler = optuna.samplers.TPESampler(seed=int(np.random.SeedSequence([seed, stored]).generate_state(1)[0]))
    return study


def _fail_abandoned(study: optuna.Study) -> None:
    """A trial still RUNNING when the study is opened was cut off (one process tunes an OUT)."""
    storage = study._storage  # noqa: SLF001  (Optuna has no public handle on a loaded study's storage)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        storage.set_trial_user_attr(t._trial_id, "abandoned", True)  # noqa: SLF001
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)  # noqa: SLF001


def finished_trials(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if not t.user_attrs.get("abandoned"))


def run_study(objective: Objective, space: SearchSpace, n_trials: int, seed: int, direction: str,
              pruner: Optional[optuna.pruners.BasePruner] = None, *, study: Optional[optuna.Study] = None,
              timeout: Optional[float] = None, catch: Sequence[type] = (),
              callbacks: Sequence[Callable] = ()) -> optuna.Study:
    """Run trials until the study holds ``n_trials`` finished ones (a resumed study counts the
    trials it already has) or ``timeout`` seconds pass. Exceptions in ``catch`` fail one trial;
    any other stops the study and propagates."""
    study = study or open_study(direction, seed, pruner)
    remaining = n_trials - finished_trials(study)
    if remaining > 0:
        study.optimize(lambda trial: objective(trial, space.sample(trial)), n_trials=remaining,
                       timeout=timeout, catch=tuple(catch), callbacks=list(callbacks))
    return study


def best_trial(study: optuna.Study) -> Optional[optuna.trial.FrozenTrial]:
    """The best COMPLETE trial, or None (Optuna raises when every trial was pruned or failed)."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    return study.best_trial


def trial_records(study: optuna.Study) -> List[dict]:
    """One JSON-ready row per trial, in trial order."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({
            "number": t.number,
            "state": t.state.name,
            "params": dict(t.params),
            "value": t.value,
            "best_step": t.user_attrs.get("best_step"),
            "last_step": t.last_step,
            "run_dir": t.user_attrs.get("run_dir"),
        })
    return rows
