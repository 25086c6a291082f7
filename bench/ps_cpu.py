"""PS CPU per step of the same tables fused or one TFRA table each, on one real PS process.

``python -m bench.ps_cpu [DATA]`` (default: the bench's synthetic data): the data's tables with
their statistics (rows, pooling, skew from ``schema.json``), copied 1, 2 and 4 times (7, 14, 28
tables on the bench's data), 1,024 samples a step (2 workers x 16 tasks x 32 samples), measured
by the calibration client (``calibration/measure.py``: the worker's lookup and Adam update through
one request per PS, the PS process's CPU ms per step), both layouts in each of its two passes
(the lower counts: outside load only adds). A load-robust figure where the throughput of a
4-process job on a shared 2-core box is not.
"""
from __future__ import annotations

import json
import sys
from typing import Dict, Sequence

SAMPLES_PER_STEP = 2 * 16 * 32


def measure(data: str, copies: Sequence[int] = (1, 2, 4), log=print, smoke: bool = False) -> Dict[str, Dict]:
    """``smoke``: the data's tables once (both layouts), one warm-up step and two measured."""
    from gmeta_tf.calibration.calibrate import measure_configs, shard_json
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.plan.spec import Shard
    from gmeta_tf.plan.tables_from_data import tables_from_data

    tables = tables_from_data(data, load_config("configs/quickstart.yaml", [f"data.path={data}"]))
    configs, keys = [], {}
    for k in (1,) if smoke else copies:
        shards = [Shard(f"{t.name}_{c}", "table", 0, 1, t.rows, t.dim, t.pooling, t.skew)
                  for c in range(k) for t in tables]
        for fuse in (True, False):
            keys[len(configs)] = (str(len(shards)), "fused" if fuse else "per_table")
            configs.append({"dims": [s.dim for s in shards], "fuse": fuse, "variants": [
                {"index": len(configs), "samples_per_step": SAMPLES_PER_STEP, "seed": k,
                 "shards": [shard_json(s) for s in shards]}]})
    got = measure_configs(configs, warmup=1 if smoke else 2, steps=2 if smoke else 10, log=log)
    out: Dict[str, Dict] = {}
    for i, (n, label) in keys.items():
        out.setdefault(n, {})[f"ps_cpu_ms_{label}"] = got[i]["ps_cpu_ms"]
        out[n][f"wall_ms_{label}"] = got[i]["wall_ms"]
    for row in out.values():
        row["ps_cpu_per_table_over_fused"] = row["ps_cpu_ms_per_table"] / row["ps_cpu_ms_fused"]
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from bench.data import prepared_data as _prepared_data

        path = _prepared_data()[0]
    print(json.dumps(measure(path), indent=1))
