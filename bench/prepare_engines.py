"""Measure the out-of-core prepare (issue 51): which engine sorts the spool, and old vs new prepare.

Two measurements, each engine or prepare run in its own subprocess under ``/usr/bin/time -v`` (its
peak RSS is the process's own, its rows/s the wall clock of the subprocess):

``engines`` (default): the core of ``gmeta_tf/data/ooc.py`` on a synthetic spool of ``--rows``
rows shaped like ``spool2`` (rank, time, row, label, 6 ids, a multi-hot list, 3 dense): one
``ORDER BY rank, ts, r`` streamed out as Arrow batches, plus a ``GROUP BY`` of an id column with
its counts, in DuckDB (``memory_limit`` 1 GiB, spilling to a temp dir) and in Polars' streaming
engine (``sort`` + ``sink_parquet``, ``group_by`` collected with the streaming engine). Polars is
not a dependency of the project: pass ``--polars-python`` an interpreter that has it (the line
says "polars not installed" otherwise).

``prepare --tasks N``: ``gmeta data synth --tasks N`` once, then ``gmeta data prepare`` with the
quickstart config under ``prepare.engine=memory`` (the old engine) and ``duckdb`` (the new one).

Run alone (one heavy run at a time on a small box), e.g.::

    python bench/prepare_engines.py engines --rows 2000000 \\
        --polars-python /path/to/venv-with-polars/bin/python
    python bench/prepare_engines.py prepare --tasks 15000 --tasks 150000

Measured once (2026-11-29, the 2-core box, duckdb 2.0.1, polars 2.1.0 in a side venv, highest
load 4.35 while it ran):

=========================  ==========  ==============  ============
run                        seconds     rows/s          peak RSS
=========================  ==========  ==============  ============
engines 2M: DuckDB          1.54       1,298,701        517 MiB
engines 2M: Polars          1.77       1,129,944        657 MiB
prepare 1.02M: memory       4.14         246,993        539 MiB
prepare 1.02M: duckdb       3.00         340,850        528 MiB
prepare 10.1M: memory      56.58         178,395      3,922 MiB
prepare 10.1M: duckdb      32.66         309,051      1,361 MiB
=========================  ==========  ==============  ============

(``prepare.memory_limit`` was 1GiB then. Once more by hand, ``/usr/bin/time -v gmeta data prepare``
of the same 10.1M rows with ``--set prepare.memory_limit=512MiB``, load 1.31: 30.07 s, 335,663
rows/s, 832 MiB: DuckDB's limit is most of the peak, so the default became 512MiB.)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")

_DUCKDB = r"""
import sys, duckdb
spool, tmp = sys.argv[1], sys.argv[2]
con = duckdb.connect(tmp + "/db.duckdb", config={"memory_limit": "1GiB", "temp_directory": tmp + "/spill",
                                                  "preserve_insertion_order": False})
n = 0
reader = con.sql(f"SELECT * FROM read_parquet('{spool}') ORDER BY rank, ts, r").to_arrow_reader(65536)
for b in reader:
    n += b.num_rows
groups = con.execute(f"SELECT c0, count(*) FROM read_parquet('{spool}') GROUP BY c0 ORDER BY c0").fetchall()
print("ROWS", n, "GROUPS", len(groups))
"""

_POLARS = r"""
import sys, polars as pl
spool, tmp = sys.argv[1], sys.argv[2]
pl.scan_parquet(spool).sort(["rank", "ts", "r"]).sink_parquet(tmp + "/sorted.parquet")
n = pl.scan_parquet(tmp + "/sorted.parquet").select(pl.len()).collect().item()
groups = pl.scan_parquet(spool).group_by("c0").agg(pl.len()).sort("c0").collect(engine="streaming")
print("ROWS", n, "GROUPS", groups.height)
"""


def timed(argv: List[str], env: Optional[Dict[str, str]] = None) -> Dict:
    """Run ``argv`` under ``/usr/bin/time -v``; wall seconds, peak RSS (MiB), its stdout."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, cwd=ROOT)
    wall = time.perf_counter() - t0
    m = _RSS.search(p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return {"seconds": round(wall, 2), "peak_rss_mib": round(int(m.group(1)) / 1024, 1) if m else None,
            "stdout": p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""}


def make_spool(path: Path, rows: int, seed: int = 0) -> None:
    """A spool like ``ooc.py``'s ``spool2``: tasks of ~67 rows in random order, Zipf-ish item ids."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    tasks = max(rows // 67, 1)
    writer = None
    step = 1 << 18
    for lo in range(0, rows, step):
        n = min(step, rows - lo)
        lens = rng.integers(1, 5, n)
        cols = {
            "rank": pa.array(rng.integers(0, tasks, n)),
            "r": pa.array(np.arange(lo, lo + n, dtype=np.int64)),
            "y": pa.array((rng.random(n) < 0.3).astype(np.float32)),
            "ts": pa.array(rng.integers(0, 10**9, n)),
            **{f"c{i}": pa.array(np.minimum(rng.zipf(1.2, n), 10**6).astype(np.int64)) for i in range(6)},
            "m0": pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)),
                                           pa.array(rng.integers(0, 5000, int(lens.sum())))),
            **{f"d{j}": pa.array(rng.normal(size=n).astype(np.float32)) for j in range(3)},
        }
        t = pa.table(cols)
        writer = writer or pq.ParquetWriter(path, t.schema, compression="lz4")
        writer.write_table(t)
    writer.close()


def engines(rows: int, polars_python: Optional[str]) -> Dict:
    out: Dict = {"rows": rows}
    with tempfile.TemporaryDirectory(prefix="prep-engines-") as d:
        spool = Path(d) / "spool.parquet"
        make_spool(spool, rows)
        out["spool_mib"] = round(spool.stat().st_size / 2**20, 1)
        for name, code, python in (("duckdb", _DUCKDB, sys.executable), ("polars", _POLARS, polars_python)):
            if python is None or subprocess.run([python, "-c", "import polars" if name == "polars" else "import duckdb"],
                                                capture_output=True).returncode != 0:
                out[name] = f"{name} not installed" + ("" if python else " (pass --polars-python)")
                continue
            work = Path(d) / name
            work.mkdir()
            r = timed([python, "-c", code, str(spool), str(work)])
            r["rows_per_s"] = round(rows / r["seconds"])
            out[name] = r
    return out


def prepare_runs(task_counts: List[int], config: str) -> Dict:
    out: Dict = {}
    py = [sys.executable, "-m", "gmeta_tf.cli.main", "data"]
    env = {"PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="prep-scale-", dir=os.environ.get("GMETA_BENCH_TMP")) as d:
        for tasks in task_counts:
            raw = Path(d) / f"raw-{tasks}"
            s = timed(py + ["synth", "--out", str(raw), "--tasks", str(tasks)], env)
            rows = int(re.search(r"wrote ([\d,]+) samples", s["stdout"]).group(1).replace(",", ""))
            res = {"rows": rows}
            for engine in ("memory", "duckdb"):
                r = timed(py + ["prepare", "-i", str(raw), "--out", str(Path(d) / f"out-{tasks}-{engine}"),
                                "--config", config, "--set", f"prepare.engine={engine}"], env)
                r["rows_per_s"] = round(rows / r["seconds"])
                res[engine] = r
                subprocess.run(["rm", "-rf", str(Path(d) / f"out-{tasks}-{engine}")])
            subprocess.run(["rm", "-rf", str(raw)])
            out[str(tasks)] = res
    return out


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what")
    e = sub.add_parser("engines")
    e.add_argument("--rows", type=int, default=2_000_000)
    e.add_argument("--polars-python", default=None)
    p = sub.add_parser("prepare")
    p.add_argument("--tasks", type=int, action="append")
    p.add_argument("--config", default="configs/quickstart.yaml")
    a = ap.parse_args(argv)
    if a.what == "prepare":
        print(json.dumps(prepare_runs(a.tasks or [15000], a.config), indent=2))
    else:
        print(json.dumps(engines(getattr(a, "rows", 2_000_000), getattr(a, "polars_python", None)), indent=2))


if __name__ == "__main__":
    main()
