"""What a run reports while it trains: the loss and throughput between two log lines, the log
line itself (with the aggregate over ranks) and TensorBoard's scalars. A resumed run continues
the history its previous attempts wrote into ``train_summary.json``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.train.model_build import SUMMARY_FILE
from gmeta_tf.train.runtime import Runtime


@dataclass
class Window:
    """Loss and throughput between two log lines; the first step (tracing) is kept out."""

    tasks_per_batch: int
    t0: Optional[float] = None
    steps: int = 0
    loss_sum: float = 0.0
    loss_n: int = 0
    tasks_per_s: float = float("nan")
    total_time: float = 0.0
    total_steps: int = 0

    def add(self, loss: float) -> None:
        self.add_call([loss])

    def add_call(self, losses: Sequence[float]) -> None:
        """The losses of one compiled call's steps (``train.steps_per_call``), in step order.
        Throughput counts calls' steps from the end of the first call: that call traces and
        compiles, and its later steps ran before the clock started."""
        self.loss_sum, self.loss_n = self.loss_sum + sum(losses), self.loss_n + len(losses)
        if self.t0 is None:
            self.t0, self.steps = time.perf_counter(), 0
            self.loss_sum, self.loss_n = sum(losses), len(losses)
        else:
            self.steps += len(losses)

    def close(self) -> float:
        """The window's mean loss; updates ``tasks_per_s`` and starts the next window."""
        elapsed = time.perf_counter() - self.t0
        if self.steps:
            self.tasks_per_s = self.steps * self.tasks_per_batch / elapsed
            self.total_time, self.total_steps = self.total_time + elapsed, self.total_steps + self.steps
        mean_loss = self.loss_sum / max(self.loss_n, 1)
        self.t0, self.steps, self.loss_sum, self.loss_n = time.perf_counter(), 0, 0.0, 0
        return mean_loss

    @property
    def rank_tasks_per_s(self) -> float:
        return (self.total_steps * self.tasks_per_batch / self.total_time) if self.total_time else float("nan")


def log_window(cfg: Config, rt: Runtime, window: Window, step: int, history: list, writer) -> None:
    mean_loss = window.close()
    tasks_per_s = window.tasks_per_s
    history.append({"step": step, "loss": mean_loss, "tasks_per_s": tasks_per_s})
    line = (f"step {step}/{cfg.train.steps} loss {mean_loss:.4f} "
            f"tasks/s {tasks_per_s:,.0f} (rank {rt.rank})")
    if rt.size > 1:
        agg = rt.sync.allreduce_scalar(tasks_per_s if math.isfinite(tasks_per_s) else 0.0)
        line += f" aggregate tasks/s {agg:,.0f}"
    rt.log(line)
    if writer is not None:
        with writer.as_default():
            tf.summary.scalar("loss", mean_loss, step=step)
            tf.summary.scalar("tasks_per_s", tasks_per_s, step=step)


def previous_history(run_dir: str) -> list:
    f = storage.join(run_dir, SUMMARY_FILE)
    if storage.exists(f):
        try:
            return json.loads(storage.read_text(f)).get("history", [])
        except ValueError:
            return []
    return []
