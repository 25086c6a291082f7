"""The data the benchmarks read, prepared once per size, and where benchmark outputs go.

Why its own module: ``bench/run.py`` (the runner) and the benchmarks it runs
(``distributed.py``, ``ps_cpu.py``, ``profile_step.py``) all need the same prepared data; when
it lived in the runner, the benchmarks imported their own runner back and the modules formed a
circle. Now every benchmark and the runner import this, and nothing imports the runner.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Tuple

BENCH_DIR = Path(__file__).resolve().parent
WORK = BENCH_DIR / "out"
# ``python -m bench.run --smoke`` (``make bench-smoke``, tests/test_bench_smoke.py): every
# section's code on tiny sizes, in its own directory, so a smoke run never touches the real
# run's data, runs or results.
# ``GMETA_BENCH_SMOKE_WORK`` puts it elsewhere (tests/test_bench_smoke.py: the test's own tmp dir).
SMOKE_WORK = Path(os.environ.get("GMETA_BENCH_SMOKE_WORK") or WORK / "smoke")
# Users of the smoke's synthetic data: enough for 8 shards of a few users (the start-up section
# reads one shard per rank) and a valid and a test split; small enough to prepare in a second.
SMOKE_TASKS = 400


def work_dir(smoke: bool = False) -> Path:
    """Where a section writes its runs: ``WORK``, or ``SMOKE_WORK`` for a smoke run."""
    return SMOKE_WORK if smoke else WORK


def prepared_data(tasks: int = 3000, shards: int = 0, smoke: bool = False):
    """Synthetic click data prepared with the quickstart config (``shards`` > 0 overrides its
    shards); ``smoke``: ``SMOKE_TASKS`` users under ``SMOKE_WORK``."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    if smoke:
        tasks = min(tasks, SMOKE_TASKS)
    prepared = work_dir(smoke) / (f"data-{tasks}" + (f"-{shards}shards" if shards else "")) / "prepared"
    t0 = time.perf_counter()
    s = synth(str(prepared.parent / "raw"), tasks=tasks, seed=0, overwrite=True)
    t1 = time.perf_counter()
    prepare([str(prepared.parent / "raw")], str(prepared),
            load_config("configs/quickstart.yaml", [f"prepare.shards={shards}"] if shards else []).prepare,
            overwrite=True)
    t2 = time.perf_counter()
    return str(prepared), {"rows": s["rows"], "synth_rows_per_s": s["rows"] / (t1 - t0),
                           "prepare_rows_per_s": s["rows"] / (t2 - t1)}


def sizes_from_argv(argv: List[str], default: List[int]) -> Tuple[bool, List[int]]:
    """A size bench's command line, ``[--smoke] [SIZE ...]``: (smoke, the sizes or ``default``)."""
    return "--smoke" in argv, [int(a) for a in argv if a.isdigit()] or list(default)
