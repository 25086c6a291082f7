"""Shared by the fault tests (imported by name: pytest puts this directory on the path)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List

from gmeta_tf.train.fault_pause import PAUSE_ENV

FAULT_ENV = "GMETA_FAULT_TEST"  # on every process a fault test starts, through the environment
_PROJECT = (b"gmeta", b"ps serve", b"horovod")


def project_processes(tag: str) -> List[int]:
    """Live (not zombie) project processes whose environment carries ``FAULT_ENV=tag``: what
    one test started, wherever it was re-parented to, and nothing other sessions run."""
    needle = f"{FAULT_ENV}={tag}".encode()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            continue
        if not zombie and any(p in cmd for p in _PROJECT):
            out.append(int(pid))
    return out

# A model and batch small enough that a step takes milliseconds on a shared 2-core box.
TINY_SETS = ["data.tasks_per_batch=8", "data.support=8", "data.query=4", "data.shuffle_buffer=64",
             "model.embedding_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[16]", "train.log_every=10",
             "train.checkpoint_every=10", "train.keep_checkpoints=5"]


# -- real processes: spawn, wait, read their output --------------------------------------------
REPO = Path(__file__).resolve().parents[2]
GMETA = [sys.executable, "-m", "gmeta_tf.cli.main"]


def _sets(*extra):
    return [a for s in [*TINY_SETS, *extra] for a in ("--set", s)]


def _spawn(argv, pause_at=None, env=None):
    """A project process in its own session (so a kill here hits only it), output to a file.
    ``pause_at`` ("N" or "N:RANK"): its ranks freeze themselves after step N
    (``GMETA_PAUSE_AT_STEP``, gmeta_tf/train/fault_pause.py), the fault's exact moment.
    ``env``: variables to add to its environment."""
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"fault-{os.getpid()}-{time.monotonic_ns()}.log", "w+")
    env = {**{k: v for k, v in os.environ.items() if k != PAUSE_ENV}, **(env or {})}
    if pause_at is not None:
        env[PAUSE_ENV] = str(pause_at)
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**env, "PYTHONUNBUFFERED": "1"})
    proc.log = log
    return proc


def _output(proc) -> str:
    proc.log.flush()
    proc.log.seek(0)
    return proc.log.read()


def _wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _finish(proc, timeout=300):
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, _output(proc)


def _ckpt_done(run, step):
    return (run / "checkpoints" / f"ckpt-{step:08d}" / "meta.json").exists()


def _rank_pids(tag, rank):
    """The ``gmeta train`` processes of Horovod rank ``rank`` started under this test."""
    out = []
    for pid in project_processes(tag):
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if f"HOROVOD_RANK={rank}".encode() in env and b"train" in cmd and b"horovodrun" not in cmd:
            out.append(pid)
    return out


def _launch_argv(tiny_data, run, steps=40):
    return [*GMETA, "launch", "local", "--workers", "2", "--ps", "1", "--timeout", "400",
            "--data", str(tiny_data), "--out", str(run), "--steps", str(steps), *_sets()]


REFERENCE_STEPS = 60  # crosses a fault at step 20 (checkpoints every 10) with steps left to redo


def one_worker_argv(tiny_data, run, *extra_sets, restarts=0, steps=REFERENCE_STEPS):
    """``gmeta launch local`` with one worker and one PS: the configuration whose runs are
    deterministic across a resume, so a faulted run must end at the reference model."""
    argv = _launch_argv(tiny_data, run, steps=steps)
    argv[argv.index("--workers") + 1] = "1"
    return [*argv, "--max-restarts", str(restarts), "--restart-backoff", "0.5", *_sets(*extra_sets)]


def _assert_all_complete(run: Path):
    left = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("ckpt-")
            and not (p / "meta.json").exists()]
    assert not left, f"incomplete checkpoints left: {left}"


def _complete_steps(run):
    return sorted(int(c.name[5:13]) for c in (run / "checkpoints").glob("ckpt-*") if (c / "meta.json").exists())


def _cmd(pid) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
    except OSError:
        return b""




# -- a rank frozen at its pause step (GMETA_PAUSE_AT_STEP), and signals waiting for it -------------
def _state(pid) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _wait_frozen(pids: Callable[[], List[int]], proc, timeout=300, what="a rank to freeze") -> int:
    """The pid, among ``pids()``, that froze itself (state T); fails if ``proc`` ends first."""
    found: List[int] = []

    def frozen():
        found[:] = [p for p in pids() if _state(p) == "T"]
        return bool(found) or proc.poll() is not None
    _wait_for(frozen, timeout, what)
    assert found, f"{what}: the process ended first\n{_output(proc)[-3000:]}"
    return found[0]


def _pending(pid, sig) -> bool:
    """Whether ``sig`` waits, undelivered, for ``pid`` (a frozen process cannot take it yet)."""
    bit = 1 << (int(sig) - 1)
    try:
        with open(f"/proc/{pid}/status") as f:
            masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    except OSError:
        return False
    return any(m & bit for m in masks)


def _resume_once_stop_requested(pid, timeout=60):
    """Let the frozen rank ``pid`` go on once its launcher has written the stop request it reads
    before each step's vote (``GMETA_STOP_FILE`` in its environment; issue 42: the launcher
    no longer signals ranks): it then stops right after the step it froze at."""
    from gmeta_tf.train.rank_status import STOP_FILE_ENV

    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    stop_file = Path(env[STOP_FILE_ENV.encode()].decode())
    _wait_for(stop_file.exists, timeout, f"the launcher's stop request {stop_file}")
    os.kill(pid, signal.SIGCONT)


def _resume_once_pending(pid, sig, timeout=60):
    """Let the frozen ``pid`` go on once ``sig`` (sent by the test or forwarded by the launcher)
    waits for it: it then takes the signal right after the step it froze at."""
    _wait_for(lambda: _pending(pid, sig), timeout, f"{signal.Signals(sig).name} pending for {pid}")
    os.kill(pid, signal.SIGCONT)


def _kill_frozen_rank(argv, tag, rank=1, step=20, timeout=400, while_frozen=None, env=None):
    """Run ``argv`` (a launch) with rank ``rank`` frozen after ``step`` (``GMETA_PAUSE_AT_STEP``),
    call ``while_frozen(proc)`` if given, kill the rank with SIGKILL; the launch's exit code and
    output once it ends. ``env``: variables added to the launch's environment."""
    proc = _spawn(argv, pause_at=f"{step}:{rank}", env=env)
    pid = _wait_frozen(lambda: _rank_pids(tag, rank), proc, what=f"rank {rank} to freeze after step {step}")
    if while_frozen is not None:
        while_frozen(proc)
    os.kill(pid, signal.SIGKILL)
    return _finish(proc, timeout=timeout)
