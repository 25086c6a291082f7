"""The order of what happens after a call (``train/after_step.py``) is the trainer's behaviour:
logs, checkpoints and status records are compared by other tests and read by the launcher. These
tests run the real handlers, in the list ``after_step.handlers`` builds, over one call's end and
record each side effect; they fail when a handler moves.

What is recorded comes from fakes of the run's surroundings only (the status record, the
checkpoint writer, the embeddings' flushes, the elastic commit, the scoring of the valid split and
the fault test's freeze); the handlers themselves are the trainer's.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.errors import Preempted
from gmeta_tf.train import after_step
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.fault_pause import PausePoint
from gmeta_tf.train.loop_state import LoopState, RunContext, StepEnd
from gmeta_tf.train.preemption import PreemptionWatch
from gmeta_tf.train.rank_status import Phase
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.validation import BestTracker

SCHEMA = {"label": {"name": "y", "kind": "click"}, "categorical": [], "multi_hot": [], "dense": []}


class Recorder:
    """The run's surroundings, each call one event in ``events``."""

    def __init__(self):
        self.events: list = []
        self.directory, self.status = None, None  # as StatusWriter: no records to read

    def update(self, write_now: bool = True, **fields) -> None:  # the rank's status record
        self.events.append(("status", fields))

    def sync_hot(self) -> None:
        self.events.append(("sync_hot",))

    def quiesce(self) -> None:
        self.events.append(("quiesce",))

    def step_boundary(self) -> None:
        self.events.append(("step_boundary",))

    def save(self, step: int, meta: dict, files: dict) -> str:
        self.events.append(("checkpoint", step, meta["validation"]["since_best"]))
        return f"ckpt-{step}"

    def mark_best(self, path: str, summary: dict) -> None:
        self.events.append(("best", path))

    def commit(self, step: int) -> None:
        self.events.append(("commit", step))

    def log(self, line: str) -> None:
        self.events.append(("log", line.split(":")[0].split(" loss ")[0]))


def run_handlers(monkeypatch, rec: Recorder, end: StepEnd, improves: bool, patience: int = 1,
                 pause: PausePoint = None):
    cfg = load_config("configs/quickstart.yaml", ["train.steps=100", "train.log_every=10", "train.eval_every=10",
                                                  "train.checkpoint_every=50", f"train.early_stop_patience={patience}"])
    tracker = BestTracker(metric="auc", patience=patience, best_step=5, best_value=0.7)

    def validation_point(cfg, model, rt, tracker, step, writer, on_validation):
        rec.events.append(("validate", step))
        return tracker.update(step, 0.8 if improves else 0.6)

    monkeypatch.setattr(after_step, "validation_point", validation_point)
    monkeypatch.setattr(after_step, "freeze", lambda: rec.events.append(("freeze",)))
    monkeypatch.delenv("GMETA_FAIL_FROM_STEP", raising=False)
    rt = Runtime(sync=LocalSync(), log=rec.log)
    built = SimpleNamespace(model=SimpleNamespace(embeddings=rec), ckpt=rec)
    ctx = RunContext(cfg, rt, "unused", SCHEMA, built, tracker, PreemptionWatch(30.0, rec.log, 0, status=rec))
    at = LoopState.at_start(cfg, "unused", 0, False)
    for handler in after_step.handlers(ctx, at, rec, None, 0, [], None, pause):
        handler.after_step(end)
    return at


CHECKPOINT = [("sync_hot",), ("quiesce",), ("step_boundary",)]


def test_a_step_is_logged_validated_checkpointed_committed_paused_then_stopped(monkeypatch):
    """Step 20 is a log and validation step that does not improve (patience 1): the status
    record first, the log line, the validation, the checkpoint it forces (recording that
    validation), the elastic commit, the fault pause, and the early stop last."""
    rec = Recorder()
    end = StepEnd(first=11, step=20, losses=[0.5] * 10, preempted=False, last=False)
    at = run_handlers(monkeypatch, rec, end, improves=False, pause=PausePoint(20))
    assert rec.events == [
        ("status", {"step": 20}),
        ("log", "step 20/100"),
        ("validate", 20),
        *CHECKPOINT, ("checkpoint", 20, 1), ("status", {"checkpoint": 20}),
        ("commit", 20),
        ("freeze",),
        ("log", "early stop at step 20"),
    ]
    assert at.stopped and end.stop and at.history[-1]["step"] == 20


def test_an_improved_step_is_marked_best_after_its_checkpoint_and_goes_on(monkeypatch):
    rec = Recorder()
    end = StepEnd(first=11, step=20, losses=[0.5] * 10, preempted=False, last=False)
    at = run_handlers(monkeypatch, rec, end, improves=True)
    assert rec.events == [
        ("status", {"step": 20}), ("log", "step 20/100"), ("validate", 20),
        *CHECKPOINT, ("checkpoint", 20, 0), ("status", {"checkpoint": 20}), ("best", "ckpt-20"),
        ("commit", 20),
    ]
    assert not at.stopped and not end.stop and end.improved


def test_a_preempted_step_says_stopping_checkpoints_then_raises_before_the_commit(monkeypatch):
    """A stop request acted on at step 13 (no log, validation or checkpoint due): STOPPING in the
    status record, the checkpoint, then ``Preempted`` on every rank; no commit, no pause."""
    rec = Recorder()
    end = StepEnd(first=13, step=13, losses=[0.5], preempted=True, last=False)
    with pytest.raises(Preempted, match=r"^rank 0: preempted \(a peer rank was asked to stop\): every rank "
                                        r"checkpointed step 13 \(ckpt-13\) in "):
        run_handlers(monkeypatch, rec, end, improves=False, pause=PausePoint(13))
    assert rec.events == [("status", {"step": 13}), ("status", {"phase": Phase.STOPPING}),
                          *CHECKPOINT, ("checkpoint", 13, 0), ("status", {"checkpoint": 13})]


def test_a_step_with_nothing_due_is_only_recorded_and_committed(monkeypatch):
    rec = Recorder()
    end = StepEnd(first=13, step=13, losses=[0.5], preempted=False, last=False)
    run_handlers(monkeypatch, rec, end, improves=False)
    assert rec.events == [("status", {"step": 13}), ("commit", 13)]
