"""``make bench`` ``faults``: what a fault costs a 2-worker + 2-PS job (issue 32).

Two real ``gmeta launch local`` jobs on the quickstart config, each hit once:

* **PS kill**: ``--max-restarts 1``, ``train.checkpoint_every`` 50; ps:0 is killed with SIGKILL
  a little after the checkpoint at step 50. The restarted trainer reports (``train_summary.json``
  ``restarts``) the seconds from the death to its first completed step after the resume
  (``ps_kill_recovery_s``: stopping the old cluster, the back-off, a new PS and ranks, the
  tables refilled from the checkpoint) and the steps it redid (``ps_kill_steps_redone`` <=
  ``checkpoint_every``).
* **Preemption**: SIGTERM to the launcher at about step 60 with no periodic checkpoint due; every
  rank checkpoints the agreed step and exits. ``preempt_checkpoint_s`` is that save (rank 0's
  report), ``preempt_exit_s`` the signal-to-exit time of the whole job, and the resumed job's
  first step gives ``preempt_steps_redone`` (0 by construction of the protocol, measured here).

Times on this 2-core box are dominated by process start-up (TensorFlow imports, the PS
readiness, the Gloo ring): they bound what a real cluster pays, whose pods start in parallel on
their own cores.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

CHECKPOINT_EVERY = 50
STEPS = 120


def _argv(data: str, run: Path, *extra: str) -> List[str]:
    return [sys.executable, "-m", "gmeta_tf.cli.main", "launch", "local", "--workers", "2", "--ps", "2",
            "--timeout", "900", "--config", "configs/quickstart.yaml", "--data", data, "--out", str(run),
            "--steps", str(STEPS), "--set", "train.log_every=10", "--set", "train.eval_every=0", *extra]


class _Job:
    def __init__(self, argv: List[str], log: Path):
        self.log_path = log
        self.fh = open(log, "w+")
        self.proc = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def text(self) -> str:
        self.fh.flush()
        return self.log_path.read_text()

    def wait_for(self, pattern: str, timeout: float = 600) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"bench faults: {pattern!r} not seen; log {self.log_path}:\n{self.text()[-3000:]}")

    def finish(self, timeout: float = 900) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.fh.close()


def _ps_pids(launcher_pid: int) -> List[int]:
    import psutil

    return [p.pid for p in psutil.Process(launcher_pid).children(recursive=True)
            if "ps" in p.cmdline() and "serve" in p.cmdline()]


def measure_ps_kill(data: str, work: Path) -> Dict:
    run = work / "ps_kill"
    job = _Job(_argv(data, run, "--no-resume", "--max-restarts", "1", "--set",
                     f"train.checkpoint_every={CHECKPOINT_EVERY}"), work / "ps_kill.log")
    job.wait_for(rf"step {CHECKPOINT_EVERY + 10}/{STEPS}")
    os.kill(_ps_pids(job.proc.pid)[0], signal.SIGKILL)
    code = job.finish()
    if code != 0:
        raise RuntimeError(f"bench faults: the restarted job failed ({code}); log {job.log_path}")
    (restart,) = json.loads((run / "train_summary.json").read_text())["restarts"]
    return {"ps_kill_recovery_s": restart["recovery_s"], "ps_kill_steps_redone": restart["steps_redone"],
            "ps_kill_failed_at_step": restart["failed_at_step"], "ps_kill_resumed_from_step": restart["resumed_from_step"],
            "checkpoint_every": CHECKPOINT_EVERY}


def measure_preemption(data: str, work: Path) -> Dict:
    run = work / "preempt"
    argv = _argv(data, run, "--set", "train.checkpoint_every=1000")
    job = _Job([*argv, "--no-resume"], work / "preempt.log")
    job.wait_for(rf"step 60/{STEPS}")
    sent = time.monotonic()
    os.kill(job.proc.pid, signal.SIGTERM)
    code = job.finish()
    exit_s = time.monotonic() - sent
    text = job.text() if not job.fh.closed else job.log_path.read_text()
    saved = re.search(r"rank 0: preempted .*checkpointed step (\d+) .* in ([\d.]+) s", text)
    if code != 128 + signal.SIGTERM or saved is None:
        raise RuntimeError(f"bench faults: the preempted job exited {code}; log {job.log_path}")
    step = int(saved.group(1))
    resumed = _Job([*argv, "--resume", "--steps", str(step + 10)], work / "preempt_resume.log")
    m = resumed.wait_for(r"resumed from .* at step (\d+)")
    resumed.finish()
    return {"preempt_steps_redone": step - int(m.group(1)), "preempt_checkpoint_s": float(saved.group(2)),
            "preempt_exit_s": exit_s, "preempt_step": step}


def measure(data: str, work: Path) -> Dict:
    work.mkdir(parents=True, exist_ok=True)
    return {**measure_ps_kill(data, work), **measure_preemption(data, work)}
