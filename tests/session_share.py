"""One costly fixture result per pytest session, shared by the xdist workers.

A session-scoped fixture runs once per xdist worker, and ``--dist loadfile`` sends test files
to both workers, so a reference run two files compare against would be trained twice. Here the
first worker to ask builds it while the others wait on a lock, then every worker reads it
(pytest-xdist's documented recipe: the workers' base temporary directories share one parent per
session, and nothing outside that session's directory is ever read).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Callable


def once_per_session(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """``make(dir)`` run once per session; returns ``dir``. A failed ``make`` leaves nothing
    marked done, so the next worker to ask tries again (and fails the same way, visibly)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        out = tmp_path_factory.mktemp(name)
        make(out)
        return out
    root = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    root.mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (root / "done").exists():
                make(root / "out")
                (root / "done").write_text("")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return root / "out"
