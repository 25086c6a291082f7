"""What each ``horovodrun`` rank of ``gmeta launch local`` runs: the rank as a child, and its exit.

Why: a rank writes its own exit into its status record (``gmeta_tf/train/rank_status.py``), but a
rank killed by a signal (kill -9, the OOM killer) writes nothing, and its exit status goes to its
parent alone. Under ``horovodrun`` that parent is Horovod's (a middleman and a shell), not the
launcher, which therefore used to read the code from horovodrun's "Process N exit with status
code" lines. This agent is the rank's parent instead, the way torchrun's agent is: it starts the
rank (``GMETA_RANK_ARGV``, JSON), waits for it, and writes the exit the status says into the
record when the rank's own is missing or disagrees (``rank_status.record_exit``); then it exits
with the rank's code, so horovodrun sees what it always saw. In an elastic ring the agent names
the rank's record (``GMETA_RECORD_ID``: one record per process, since a worker that joins can
get the slot rank a live one started as), so it writes into that process's record alone.

The rank's command travels in the environment, not in this process's argv, so the agent's command
line names no ``train``: what looks for a rank process by its command line finds the rank alone.
A stop signal to the agent (horovodrun stopping its ranks signals both) is the rank's to act on;
the agent waits for it. The rank gets SIGTERM should the agent die first. Standard library and
``rank_status`` only: it adds milliseconds to a rank's start.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
from typing import List

from gmeta_tf import exit_codes
from gmeta_tf.train.rank_status import ELASTIC_ENV, RECORD_ID_ENV, STATUS_DIR_ENV, record_exit, record_id

RANK_ARGV_ENV = "GMETA_RANK_ARGV"
_PR_SET_PDEATHSIG = 1


def agent_argv(python: str = sys.executable) -> List[str]:
    return [python, "-m", "launch.rank_agent"]


def _die_with_agent() -> None:
    ctypes.CDLL(ctypes.util.find_library("c") or None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def main() -> int:
    argv = json.loads(os.environ.pop(RANK_ARGV_ENV))
    status_dir = os.environ.get(STATUS_DIR_ENV)
    rank = int(os.environ.get("HOROVOD_RANK", "0") or 0)
    for s in exit_codes.STOP_SIGNALS:  # a handler, not SIG_IGN: the rank must not inherit "ignored"
        signal.signal(s, lambda *_: None)
    process = None
    if os.environ.get(ELASTIC_ENV) == "1":
        process = os.environ[RECORD_ID_ENV] = record_id({})  # a new one: never one inherited
    proc = subprocess.Popen(argv, preexec_fn=_die_with_agent)
    code = proc.wait()
    if status_dir:
        try:
            record_exit(status_dir, rank, proc.pid, code, process)
        except OSError as e:
            print(f"rank {rank}: cannot write its exit into {status_dir}: {e}", file=sys.stderr)
    return exit_codes.normalized(code)


if __name__ == "__main__":
    sys.exit(main())
