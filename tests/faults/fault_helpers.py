"""Shared by the fault tests (imported by name: pytest puts this directory on the path)."""
from __future__ import annotations

import os
from typing import List

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
             "train.checkpoint_every=10", "train.keep_checkpoints=5", "cluster.table_create_settle_s=1"]
