"""Where embedding tables live: the one place that spells a TensorFlow device string.

Embedded mode keeps every table on the local CPU; distributed mode places table shards on the
parameter servers (``job:ps``, one task per ``gmeta ps serve`` process). The worker's
connection code, the PS microbenchmark, the per-shard row report and the lost-PS error all
speak about the same devices, so they build and parse them here.
"""
from __future__ import annotations

import re
from typing import List, Optional

LOCAL_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
_PS_TASK = re.compile(r"/job:ps/replica:\d+/task:(\d+)")


def ps_device(task: int) -> str:
    """The CPU of PS task ``task``: where its table shards and slot tables live."""
    return f"/job:ps/replica:0/task:{int(task)}/device:CPU:0"


def table_devices(ps_tasks: int, placement: Optional[List[int]] = None) -> List[str]:
    """Devices for one table: every PS task (row-sharded) or the ``placement`` subset."""
    if ps_tasks == 0:
        return [LOCAL_DEVICE]
    tasks = placement if placement is not None else list(range(ps_tasks))
    return [ps_device(t) for t in tasks]


def ps_task_of(device: str) -> Optional[int]:
    """The PS task a device string names; None for a local device."""
    m = _PS_TASK.search(device)
    return int(m.group(1)) if m else None
