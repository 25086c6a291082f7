"""Facts about processes: is one still there (clean-up after killed runs, a dead launcher), and
when did this one start (a restart's timeline)."""
from __future__ import annotations

import os
import time


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


def process_start_unix() -> float:
    """When this process started, wall clock, to about 10 ms: now minus its age, the age being the
    time since boot (``/proc/uptime``) less its start since boot (``/proc/self/stat``, clock ticks).

    Not ``psutil.Process().create_time()``: that adds the start to the boot time ``/proc/stat``
    gives in whole seconds, so it is up to a second early or late, enough to put a restarted
    rank's start before the relaunch that started it (CI, stop 46)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        import psutil  # not Linux: a second's precision is what there is

        return psutil.Process().create_time()
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
