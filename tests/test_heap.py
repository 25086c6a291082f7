"""``heap.large_buffers_from_kernel``: freed megabyte buffers leave the process, even when small
long-lived objects were allocated between them (what kept ``gmeta eval``'s freed space resident)."""
from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
from gmeta_tf import heap
if sys.argv[1] == "fixed":
    assert heap.large_buffers_from_kernel()
import numpy as np
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
np.ones(1 << 19).sum()  # a 4 MiB buffer, freed: glibc's dynamic threshold rises past 1 MiB
kept, big = [], []
for i in range(200):
    b = np.ones(1 << 17)          # 1 MiB, freed below
    b2 = np.ones(1 << 17)
    big += [b, b2]
    kept.append(np.ones(64))      # small and long-lived, between them
del big, b, b2
print(rss())
"""


def test_freed_megabyte_buffers_are_returned_once_the_threshold_is_fixed():
    def retained(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    dynamic, fixed = retained("dynamic"), retained("fixed")
    assert dynamic - fixed > 200, (dynamic, fixed)  # ~400 MiB were freed: glibc's default keeps most of it
