"""The fixed sharding benchmark suite: seeded tasks of 10-80 synthetic tables on 2, 4 and 8 PS.

Tables follow the Meta DLRM dataset's skew (``gmeta_tf.plan.synthetic_tables``). Memory per PS
is a multiple of the tables' total bytes / PS: ``tight`` tasks (1.15x) force the search to
respect memory (and row-split the biggest tables), ``roomy`` ones (1.5x) leave some freedom,
``ample`` ones (20x) none of it matters. The suite never changes with the code: same seed, same
tasks, so results are comparable across commits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from gmeta_tf.plan.spec import TableStats
from gmeta_tf.plan.synthetic_tables import synthetic_tables

SEED = 20_21
SAMPLES_PER_STEP = 512
OPTIMIZER_SLOTS = 2  # Adam
PS_COUNTS = (2, 4, 8)
TASKS_PER_PS_COUNT = 12
MEMORY = (("tight", 1.15), ("roomy", 1.5), ("ample", 20.0))
# Measured on real PS processes: the first tasks of these PS counts (bench time bound).
MEASURED_PER_PS_COUNT = {2: 3, 4: 3}
MEASURED_MAX_TABLES = 30


@dataclass(frozen=True)
class Task:
    name: str
    tables: Tuple[TableStats, ...]
    ps: int
    mem_per_ps: int
    memory: str  # tight | roomy | ample
    samples_per_step: int
    measured: bool


def tasks() -> List[Task]:
    rng = np.random.default_rng(SEED)
    out: List[Task] = []
    for ps in PS_COUNTS:
        n_measured = 0
        for i in range(TASKS_PER_PS_COUNT):
            want_measured = n_measured < MEASURED_PER_PS_COUNT.get(ps, 0)
            hi = MEASURED_MAX_TABLES if want_measured else 80
            n_tables = int(rng.integers(10, hi + 1))
            tables = tuple(t.stats for t in synthetic_tables(n_tables, seed=int(rng.integers(2**31)),
                                                                prefix=f"p{ps}t{i}_"))
            label, factor = MEMORY[i % len(MEMORY)]
            total = sum(t.bytes(OPTIMIZER_SLOTS) for t in tables)
            mem = int(factor * total / ps)
            out.append(Task(f"ps{ps}-{i:02d}-{n_tables}t-{label}", tables, ps, mem, label, SAMPLES_PER_STEP,
                            want_measured))
            n_measured += want_measured
    return out
