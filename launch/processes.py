"""The launcher's child processes: started in a group of their own, their output streamed, ended
with the whole group. Every kind of process a launch starts (a PS, ``horovodrun``, a worker on an
emulated host) goes through here, so teardown is one rule:

* every child runs in its own process group (``start_new_session``) and the whole group gets
  SIGTERM, then SIGKILL after a grace period: no orphans, horovodrun's ranks included;
* a launcher killed outright (kill -9) runs no teardown, so each child also asks the kernel for
  SIGTERM when the launcher dies (``prctl(PR_SET_PDEATHSIG)``);
* every line is echoed with a prefix (``[ps0]``) and only echoed: what the launcher knows of a
  rank comes from its status record, never from its text. The last lines are kept per child.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from gmeta_tf import exit_codes
from gmeta_tf.quiet import NOISE

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)  # loaded before any fork
_KEPT_LINES = 2000  # per child; the oldest half goes when it fills


def _die_with(parent: int):
    """A ``preexec_fn``: SIGTERM this child when ``parent`` (the launcher) dies, however it dies.
    If the launcher is already gone when the child gets here, the child exits at once, with the
    code the death signal would have given it a moment later."""
    def setup() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(exit_codes.signal_exit(signal.SIGTERM))
    return setup


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    lines: List[str] = field(default_factory=list)
    thread: Optional[threading.Thread] = None
    stopping: bool = False
    rank: Optional[int] = None  # a worker rank the launcher started itself (no horovodrun)


def spawn_child(name: str, argv: List[str], env: Dict[str, str], log: Callable[[str], None],
                lock: threading.Lock, prefix: Optional[str] = None) -> Child:
    """Start ``argv`` in a process group of its own, its output echoed to ``log`` (under ``lock``,
    so lines of different children never interleave) with ``[prefix]``."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, text=True, bufsize=1, preexec_fn=_die_with(os.getpid()))
    child = Child(name, proc)
    tag = f"[{prefix}] " if prefix else ""

    def pump():
        for line in proc.stdout:
            line = line.rstrip("\n")
            if NOISE.search(line):  # TF start-up chatter of horovodrun and the ranks
                continue
            child.lines.append(line)
            if len(child.lines) > _KEPT_LINES:
                del child.lines[:_KEPT_LINES // 2]
            with lock:
                log(f"{tag}{line}")

    child.thread = threading.Thread(target=pump, daemon=True)
    child.thread.start()
    return child


def stop_child(child: Child, grace_s: float) -> None:
    """SIGTERM to the child's group, SIGKILL after ``grace_s``; the child is reaped."""
    child.stopping = True
    if child.proc.poll() is not None:
        return
    try:
        os.killpg(child.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        child.proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.proc.wait()


def end_children(children: List[Child], grace_s: float) -> None:
    """Stop each child in order, then SIGKILL what it left in its group, then join the echoes."""
    for child in children:
        stop_child(child, grace_s)
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)  # anything the child left in its group
        except (ProcessLookupError, PermissionError):
            pass
    for child in children:
        if child.thread is not None:
            child.thread.join(timeout=2)
