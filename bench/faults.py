"""``make bench`` ``faults``: what a fault costs a 2-worker + 2-PS job (issue 32).

Two real ``gmeta launch local`` jobs on the quickstart config, each hit once:

* **PS kill**: ``--max-restarts 1``, ``train.checkpoint_every`` 50; ps:0 is killed with SIGKILL
  a little after the checkpoint at step 50. The restarted trainer reports (``train_summary.json``
  ``restarts``) the seconds from the death to its first completed step after the resume
  (``ps_kill_recovery_s``: stopping the old cluster, the back-off, a new PS and ranks, the
  tables refilled from the checkpoint) and the steps it redid (``ps_kill_steps_redone`` <=
  ``checkpoint_every``).
* **Worker kill**: the same, with rank 1 killed (SIGKILL) ten steps after the checkpoint at step
  50: ``worker_kill_recovery_s`` and ``worker_kill_steps_redone``.
* Each restart's **timeline** (``*_timeline_s``): seconds after the failure at which the old
  workers exited, the cluster was torn down, the new one started, its PS answered, rank 0's
  process started, joined the cluster, restored the checkpoint and completed its first step
  (``gmeta_tf/train/restarts.py``), so the recovery's time is seen by phase.
* **Elastic worker kill** (``--elastic``, no ``--max-restarts``): rank 1 killed (SIGKILL) once the
  ranks have logged step 60 (a commit every 10 steps); rank 0 rolls back to its last commit and
  goes on alone. ``elastic_worker_kill_recovery_s``: from the kill to rank 0's record of step 70,
  the next logged step, so it includes the up to 10 steps trained after the rollback;
  ``elastic_steps_10_s``, the same rank's 10 steps between its records of steps 50 and 60 before
  the kill, is that share's order; ``elastic_worker_kill_restarts`` (0: the job was not
  restarted) and ``elastic_ranks_at_end`` (1: ``cluster.elastic_cooldown_s: null`` keeps the lost
  host out, so the ring does not grow back) come from ``train_summary.json``.
* **Preemption**: SIGTERM to the launcher at about step 60 with no periodic checkpoint due; every
  rank checkpoints the agreed step and exits. ``preempt_checkpoint_s`` is that save (rank 0's
  report), ``preempt_exit_s`` the signal-to-exit time of the whole job, and the resumed job's
  first step gives ``preempt_steps_redone`` (0 by construction of the protocol, measured here).

What the bench reads of the ranks it reads from their status records (``<run>/status``,
``gmeta_tf/train/rank_status.py``): the step they reached, the step and seconds of the
preemption checkpoint, the step a resumed job started from. No log line is parsed.

Times on this 2-core box are dominated by process start-up (TensorFlow imports, the PS
readiness, the Gloo ring): they bound what a real cluster pays, whose pods start in parallel on
their own cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List

from gmeta_tf import exit_codes
from gmeta_tf.train import rank_status

CHECKPOINT_EVERY = 50
STEPS = 120


@dataclass(frozen=True)
class Sizes:
    """The jobs' steps: ``log_every`` is also the elastic commit interval and the steps between
    the marks the faults are timed at (the kill ``log_every`` after the checkpoint, the elastic
    marks at ``checkpoint_every``, ``+ log_every`` and ``+ 2 log_every``)."""

    steps: int = STEPS
    checkpoint_every: int = CHECKPOINT_EVERY
    log_every: int = 10
    workers: int = 2
    ps: int = 2

    @property
    def kill_at(self) -> int:
        return self.checkpoint_every + self.log_every


# ``smoke`` (bench/run.py --smoke): every fault and recovery of the section on a short job
# (24 steps: the job is still running, 18 steps from its end, when the fault is sent), on
# 2 workers + 1 PS, and the PS kill and the preemption on 1 worker + 1 PS (the worker kills need
# a rank 1): the same faults, recoveries and readings on the fewest processes, which are what the
# smoke's time is.
SMOKE = Sizes(steps=24, checkpoint_every=4, log_every=2, ps=1)
SMOKE_ONE_WORKER = replace(SMOKE, workers=1, ps=1)


def _argv(data: str, run: Path, *extra: str, sizes: Sizes = Sizes()) -> List[str]:
    return [sys.executable, "-m", "gmeta_tf.cli.main", "launch", "local", "--workers", str(sizes.workers), "--ps", str(sizes.ps),
            "--timeout", "900", "--config", "configs/quickstart.yaml", "--data", data, "--out", str(run),
            "--steps", str(sizes.steps), "--set", f"train.log_every={sizes.log_every}", "--set", "train.eval_every=0",
            *extra]


class _Job:
    def __init__(self, argv: List[str], log: Path, run: Path):
        self.log_path = log
        self.status_dir = str(run / rank_status.STATUS_DIR)
        self.fh = open(log, "w+")
        self.proc = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def ranks(self) -> Dict[int, rank_status.RankStatus]:
        return rank_status.read_all(self.status_dir)

    def wait_until(self, what: str, cond: Callable[[Dict[int, rank_status.RankStatus]], bool],
                   timeout: float = 600) -> Dict[int, rank_status.RankStatus]:
        """Until the ranks' records satisfy ``cond`` (the job still running)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ranks = self.ranks()
            if cond(ranks):
                return ranks
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"bench faults: {what} not reached; log {self.log_path}:\n{self.log_path.read_text()[-3000:]}")

    def wait_step(self, step: int) -> None:
        # a record with an exit is an earlier job's (the launcher clears them as its ranks start)
        self.wait_until(f"step {step}", lambda ranks: any(r.exit is None and r.step >= step for r in ranks.values()))

    def finish(self, timeout: float = 900) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
            self.fh.close()


def _ps_pids(launcher_pid: int) -> List[int]:
    import psutil

    return [p.pid for p in psutil.Process(launcher_pid).children(recursive=True)
            if "ps" in p.cmdline() and "serve" in p.cmdline()]


def _measure_kill(data: str, work: Path, name: str, victim: Callable[["_Job"], int], sizes: Sizes = Sizes()) -> Dict:
    """Kill ``victim(job)`` with SIGKILL ten steps (``log_every``) after the checkpoint at
    ``checkpoint_every``; the restarted job's record of its recovery, under ``<name>_*`` keys."""
    run = work / name
    job = _Job(_argv(data, run, "--no-resume", "--max-restarts", "1", "--set",
                     f"train.checkpoint_every={sizes.checkpoint_every}", sizes=sizes), work / f"{name}.log", run)
    job.wait_step(sizes.kill_at)
    os.kill(victim(job), 9)
    code = job.finish()
    if code != 0:
        raise RuntimeError(f"bench faults: the restarted job failed ({code}); log {job.log_path}")
    (restart,) = json.loads((run / "train_summary.json").read_text())["restarts"]
    return {f"{name}_recovery_s": restart["recovery_s"], f"{name}_steps_redone": restart["steps_redone"],
            f"{name}_failed_at_step": restart["failed_at_step"],
            f"{name}_resumed_from_step": restart["resumed_from_step"], f"{name}_timeline_s": restart["timeline_s"],
            "checkpoint_every": sizes.checkpoint_every}


def measure_ps_kill(data: str, work: Path, sizes: Sizes = Sizes()) -> Dict:
    return _measure_kill(data, work, "ps_kill", lambda job: _ps_pids(job.proc.pid)[0], sizes)


def measure_worker_kill(data: str, work: Path, sizes: Sizes = Sizes()) -> Dict:
    return _measure_kill(data, work, "worker_kill", lambda job: job.ranks()[1].pid, sizes)


def measure_elastic_worker_kill(data: str, work: Path, sizes: Sizes = Sizes()) -> Dict:
    """Rank 1 killed under ``--elastic`` (module docstring): the survivor's way past the loss."""
    run = work / "elastic_worker_kill"
    every = sizes.log_every
    first, killed_at = sizes.checkpoint_every, sizes.kill_at  # steps 50 and 60 in make bench
    # cluster.elastic_cooldown_s null: the lost host stays out, so the ring ends at one (elastic_ranks_at_end)
    job = _Job(_argv(data, run, "--no-resume", "--elastic", "--set", "train.checkpoint_every=1000",
                     "--set", f"train.elastic_commit_every={every}", "--set", "cluster.elastic_cooldown_s=null",
                     sizes=sizes), work / "elastic_worker_kill.log", run)
    job.wait_until(f"rank 0 at step {first}",
                   lambda ranks: 0 in ranks and ranks[0].exit is None and ranks[0].step >= first)
    at_first = time.monotonic()
    job.wait_until(f"rank 0 at step {killed_at}", lambda ranks: ranks[0].exit is None and ranks[0].step >= killed_at)
    steps_10_s = time.monotonic() - at_first
    os.kill(job.ranks()[1].pid, 9)
    killed = time.monotonic()
    job.wait_until("rank 0 past the loss", lambda ranks: ranks[0].exit is None and ranks[0].step >= killed_at + every)
    recovery_s = time.monotonic() - killed
    code = job.finish()
    summary = json.loads((run / "train_summary.json").read_text()) if code == 0 else {}
    if code != 0 or summary.get("last_step") != sizes.steps:
        raise RuntimeError(f"bench faults: the elastic job exited {code}; log {job.log_path}")
    return {"elastic_worker_kill_recovery_s": recovery_s, "elastic_steps_10_s": steps_10_s,
            "elastic_worker_kill_restarts": len(summary["restarts"]), "elastic_ranks_at_end": summary["ranks"]}


def measure_preemption(data: str, work: Path, sizes: Sizes = Sizes()) -> Dict:
    run = work / "preempt"
    argv = _argv(data, run, "--set", "train.checkpoint_every=1000", sizes=sizes)
    job = _Job([*argv, "--no-resume"], work / "preempt.log", run)
    job.wait_step(sizes.kill_at)
    sent = time.monotonic()
    os.kill(job.proc.pid, exit_codes.STOP_SIGNALS[0])
    code = job.finish()
    exit_s = time.monotonic() - sent
    rank0 = job.ranks().get(0)
    if code != exit_codes.PREEMPTED.code or rank0 is None or rank0.exit is None or not rank0.exit.checkpointed:
        raise RuntimeError(f"bench faults: the preempted job exited {code} (rank 0: {rank0}); log {job.log_path}")
    step = rank0.checkpoint
    resumed = _Job([*argv, "--resume", "--steps", str(step + 10)], work / "preempt_resume.log", run)
    started = resumed.wait_until("the resumed job's start", lambda ranks: ranks.get(0) is not None
                                 and ranks[0].exit is None and ranks[0].start_step is not None)
    resumed.finish()
    return {"preempt_steps_redone": step - started[0].start_step, "preempt_checkpoint_s": rank0.exit.checkpoint_s,
            "preempt_exit_s": exit_s, "preempt_step": step}


def measure(data: str, work: Path, smoke: bool = False) -> Dict:
    work.mkdir(parents=True, exist_ok=True)
    sizes = SMOKE if smoke else Sizes()
    one = SMOKE_ONE_WORKER if smoke else sizes
    return {**measure_worker_kill(data, work, sizes), **measure_ps_kill(data, work, one),
            **measure_preemption(data, work, one), **measure_elastic_worker_kill(data, work, sizes)}
