"""Is a process still there? Used to clean up after killed runs and to notice a dead launcher."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie (dead, not yet reaped by its parent) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
