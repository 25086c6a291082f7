"""``gmeta eval``'s metric computation alone, old per-user code against the streamed one (issue 51).

Synthetic click users (16 query and 16 support samples each, the quickstart's shape) scored the
way a MAML eval scores them: the model before and after adapting plus the three baselines, every
metric, the per-user parts of ``eval_tasks.parquet``. No model runs: predictions are drawn.

* ``old``: the per-user implementation that ``tests/test_eval_vectorized.py`` checks against
  (``tests/eval_reference.py``'s ``_old_evaluate``), fed what the old ``_collect`` held: one small array per user,
  per quantity, for the whole split, then scored user by user (sklearn per user).
* ``new``: ``evaluate.score_chunks`` + ``task_scores`` over chunks of ``CHUNK_USERS`` users,
  generated as they are consumed (as the dataset streams them in ``gmeta eval``).

Each (implementation, users) runs in its own process under ``/usr/bin/time -v`` (peak RSS is a
per-process number); ``users_per_s`` excludes generating the synthetic data (timed in a
separate pass and subtracted for ``new``; done before the clock for ``old``). ``imports_rss_mb``
is what the process holds before scoring (numpy, sklearn, pyarrow): the floor under both peaks.
The old code runs only up to ``--old-max-users`` (30k by default: at ~100 users/s, 270k users
would hold the box for 45 minutes).

``python -m bench.eval_metrics [USERS ...]`` prints a side-by-side table and the JSON;
``measure_eval_metrics(users)`` is the entry point for ``bench/run.py``.
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Q = S = 16
SEED = 0


def _stats():
    from gmeta_tf.evaluation.baselines import ItemStats

    rng = np.random.default_rng(SEED)
    ids = np.arange(0, 20000, 2, dtype=np.int64)
    counts = rng.integers(1, 200, ids.size)
    sums = rng.binomial(counts, 0.2).astype(np.float64)
    return ItemStats(float(sums.sum() / counts.sum()), int(counts.sum()), ids, sums, counts.astype(np.int64))


def _chunks(users: int, chunk_users: int) -> Iterator:
    """The users in chunks, each drawn from its own seed (the same data whatever consumes it)."""
    from gmeta_tf.evaluation import segments
    from gmeta_tf.evaluation.baselines import FlatItems
    from gmeta_tf.evaluation.evaluate import QueryChunk

    for c, first in enumerate(range(0, users, chunk_users)):
        n = min(chunk_users, users - first)
        rng = np.random.default_rng(SEED + 1 + c)
        q_offsets = segments.offsets_from_counts(np.full(n, Q))
        s_offsets = segments.offsets_from_counts(np.full(n, S))
        ctr = np.repeat(rng.beta(1, 4, n), Q)
        labels = (rng.random(n * Q) < ctr).astype(np.float32)
        after = np.clip(ctr + rng.normal(0, 0.1, n * Q), 0, 1).astype(np.float32)
        before = np.clip(after + rng.normal(0, 0.05, n * Q), 0, 1).astype(np.float32)
        items = FlatItems(s_offsets, rng.integers(0, 20000, n * S), (rng.random(n * S) < 0.2).astype(np.float64),
                          q_offsets, rng.integers(0, 20000, n * Q))
        yield QueryChunk(np.array([f"u{first + i}" for i in range(n)], dtype=object), q_offsets, labels,
                         before, after, items)


def _config():
    from gmeta_tf.config.schema import Config

    return Config()


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * resource.getpagesize() / 2 ** 20, 1)


def run_one(impl: str, users: int) -> Dict:
    """Score ``users`` synthetic users with ``impl`` (``old`` or ``new``) in this process."""
    from gmeta_tf.evaluation import segments
    from gmeta_tf.evaluation.baselines import TaskItems
    from gmeta_tf.evaluation.evaluate import CHUNK_USERS, score_chunks, task_scores

    cfg, stats = _config(), _stats()
    imported_mb = _rss_mb()  # what the imports alone hold: the floor under both peaks
    if impl == "new":
        t0 = time.perf_counter()
        for _ in _chunks(users, CHUNK_USERS):
            pass
        generate = time.perf_counter() - t0
        t0 = time.perf_counter()
        result, stream, scorers = score_chunks(_chunks(users, CHUNK_USERS), cfg, "maml", "click", "test", 3, 0.1,
                                               "item", stats)
        scores = task_scores(stream, scorers, "test", cfg)
        seconds = time.perf_counter() - t0 - generate
    else:
        from tests.eval_reference import _old_evaluate  # the reference: not part of the package

        task_ids, labels, before, after, tasks = [], [], [], [], []
        for c in _chunks(users, CHUNK_USERS):  # what the old _collect held: small arrays per user
            task_ids += c.task_ids.tolist()
            labels += [a.copy() for a in segments.split(c.labels, c.offsets)]
            before += [a.copy() for a in segments.split(c.before, c.offsets)]
            after += [a.copy() for a in segments.split(c.after, c.offsets)]
            it = c.items
            tasks += [TaskItems(si.copy(), sl.copy(), qi.copy()) for si, sl, qi in zip(
                segments.split(it.support_items, it.support_offsets),
                segments.split(it.support_labels, it.support_offsets),
                segments.split(it.query_items, it.query_offsets))]
        t0 = time.perf_counter()
        result, parts, _, _ = _old_evaluate(cfg, "maml", "click", "test", 3, 0.1, "item", stats, task_ids,
                                            labels, before, after, tasks)
        seconds = time.perf_counter() - t0
        scores = parts
    assert result["tasks"] == users and scores is not None
    return {"impl": impl, "users": users, "seconds": round(seconds, 3), "users_per_s": round(users / seconds, 1),
            "auc": result["auc"], "auc_pooled": result["auc_pooled"], "imports_rss_mb": imported_mb,
            "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _timed(impl: str, users: int) -> Dict:
    """``run_one`` in a fresh process under ``/usr/bin/time -v`` (its peak RSS)."""
    cmd = [sys.executable, "-m", "bench.eval_metrics", "--one", impl, str(users)]
    timer = Path("/usr/bin/time")
    if timer.exists():
        cmd = [str(timer), "-v", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), check=True)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    out["peak_rss_mb"] = round(int(m.group(1)) / 1024, 1) if m else out["ru_maxrss_mb"]
    return out


OLD_MAX_USERS = 30_000  # the old code scores ~100 users/s on a 2-core box: 270k users would take 45 min


def measure_eval_metrics(users: int, old_max_users: int = OLD_MAX_USERS) -> Dict:
    """Old and new side by side on ``users`` users: users/s, peak RSS, and that both agree
    (AUC and pooled AUC to 1e-9). Above ``old_max_users`` only the new code runs (``old`` None)."""
    new = _timed("new", users)
    out = {"users": users, "query_samples_per_user": Q, "old": None, "new": new}
    if users > old_max_users:
        return out
    old = _timed("old", users)
    for key in ("auc", "auc_pooled"):
        if abs(old[key] - new[key]) > 1e-9:
            raise AssertionError(f"old and new disagree on {key}: {old[key]} vs {new[key]}")
    out.update(old=old, speedup=round(new["users_per_s"] / old["users_per_s"], 1),
               rss_ratio=round(old["peak_rss_mb"] / new["peak_rss_mb"], 2))
    return out


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("users", nargs="*", type=int, default=[27_000, 270_000])
    parser.add_argument("--old-max-users", type=int, default=OLD_MAX_USERS,
                        help="run the old code only up to this many users (default %(default)s)")
    parser.add_argument("--one", choices=["old", "new"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.users[0])))
        return
    rows = [measure_eval_metrics(n, args.old_max_users) for n in args.users]
    print(f"{'users':>8} {'old users/s':>12} {'new users/s':>12} {'speedup':>8} {'old peak MB':>12} "
          f"{'new peak MB':>12} {'imports MB':>11}")
    for r in rows:
        old = r["old"] or {}
        print(f"{r['users']:>8} {old.get('users_per_s', '-'):>12} {r['new']['users_per_s']:>12} "
              f"{r.get('speedup', '-'):>8} {old.get('peak_rss_mb', '-'):>12} {r['new']['peak_rss_mb']:>12} "
              f"{r['new']['imports_rss_mb']:>11}")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
