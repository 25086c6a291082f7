"""``gmeta plan calibrate``: measure PS step cost on real local PS processes, fit the cost model.

Why measured and not assumed: on TFRA a PS's step cost is not proportional to lookups x dim.
Each table costs a fixed amount per step (its lookup, the Adam update of the value and two slot
tables, each a separate remote op), and the update scales with the *distinct* ids a step
touches, which the access skew decides. The greedy baselines see neither; the fitted model does.

``measure_sets`` is the one measurement path (calibration and ``bench/sharding`` both use it):
it starts one PS process (``gmeta ps serve`` via ``launch.local_cluster``), runs the client of
``measure.py`` against it in its own process, and tears both down (process groups) even on
failure. Chunks of work get a fresh PS each, one at a time, so the two cores are never shared
by two PS and a PS never accumulates tables.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from gmeta_tf.errors import UserError
from gmeta_tf.plan.access import expected_distinct, lookups_per_step
from gmeta_tf.plan.spec import Shard
from gmeta_tf.plan.synthetic_tables import synthetic_table

CALIB_DIMS = (2, 4, 8, 16, 32, 64, 128)  # 2: column halves of dim-4 tables
CALIB_DIM_P = (0.04, 0.16, 0.16, 0.16, 0.16, 0.16, 0.16)
SAMPLES_PER_STEP = (256, 512, 1024)
MIN_SECONDS = 0.3  # timed wall time per measured set, at least (resolves the PS's CPU time)
MAX_STEPS = 40
PASSES = 2  # every set is measured twice, a minute apart; the lower cost counts
PS_BYTES = 4 * 2**30  # pre-sized table memory one PS process may accumulate before a restart
COST = "ps_cpu_ms"  # what a PS set costs: the PS process's CPU ms per step (see measure.py)


class CalibrationError(UserError):
    """The microbenchmark could not run (a PS or the client failed or timed out)."""


@dataclass(frozen=True)
class Settings:
    configs: int  # table sets with their own dims (each traced once)
    variants: int  # rows / pooling / skew / samples-per-step draws per config
    max_tables: int
    warmup: int
    steps: int


FULL = Settings(configs=30, variants=3, max_tables=40, warmup=2, steps=5)
QUICK = Settings(configs=3, variants=2, max_tables=4, warmup=1, steps=3)


def shard_json(shard: Shard) -> Dict:
    return {"rows": shard.rows, "pooling": shard.pooling, "skew": list(shard.skew)}


# -- random table sets --------------------------------------------------------------------------
def random_configs(settings: Settings, seed: int) -> Tuple[List[Dict], List[Dict]]:
    """Random table sets for calibration. Returns (job configs, one record per variant)."""
    rng = np.random.default_rng(seed)
    configs, records = [], []
    for c in range(settings.configs):
        k = int(np.clip(round(np.exp(rng.uniform(0.0, np.log(settings.max_tables + 0.5)))), 1, settings.max_tables))
        dims = [int(d) for d in rng.choice(CALIB_DIMS, size=k, p=CALIB_DIM_P)]
        variants = []
        for _ in range(settings.variants):
            shards = []
            for i, d in enumerate(dims):
                t = synthetic_table(f"c{c}t{i}", rng, dims=(d,), pooling_range=(0.25, 30.0)).stats
                shards.append(Shard(t.name, "table", 0, 1, t.rows, d, t.pooling, t.skew))
            sps = int(rng.choice(SAMPLES_PER_STEP))
            index = len(records)
            records.append({"index": index, "group": c, "samples_per_step": sps, "shards": shards})
            variants.append({"index": index, "samples_per_step": sps, "seed": index,
                             "shards": [shard_json(s) for s in shards]})
        configs.append({"dims": dims, "variants": variants})
    return configs, records


# -- running the measurement --------------------------------------------------------------------
def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


@contextlib.contextmanager
def _ps_host(network: Optional[str]):
    """Where the chunk's PS and client run: ``(cluster, client argv wrapper, client env)``. Loopback, or with
    ``network`` (a ``--network`` profile: ``rate=100mbit``, ...) two emulated hosts, the PS on
    ``ps0`` and the client on ``worker0``, every request crossing their shaped links
    (launch/network/). The PS's CPU per step (``COST``) is what is fitted either way; the link
    shows in ``wall_ms``."""
    if network is None:
        from launch.local_cluster import LocalCluster

        yield LocalCluster(log=lambda m: None, grace_s=3.0), list, {}
        return
    from gmeta_tf.cluster.worker import WORKER_ADDRESS_ENV
    from launch.emulated_cluster import EmulatedCluster
    from launch.emulated_hosts import host_names, worker_host
    from launch.network.netns import EmulatedNetwork
    from launch.network.profile import parse_profile

    with EmulatedNetwork(host_names(1, 1), parse_profile(network)) as net:
        # the PS pulls the client's tensors from it: it must know an address it can route to
        client = worker_host(0)
        yield (EmulatedCluster(net, log=lambda m: None, grace_s=3.0), lambda argv: net.exec_argv(client, argv),
               {WORKER_ADDRESS_ENV: net.address(client)})


def _run_chunk(configs: List[Dict], warmup: int, steps: int, timeout_s: float,
               log: Callable[[str], None], network: Optional[str] = None) -> Dict[int, Dict]:
    with _ps_host(network) as (cluster, on_client_host, client_env), tempfile.TemporaryDirectory(prefix="gmeta-calib-") as tmp:
        job_path, out_path = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.jsonl")
        client = None
        try:
            try:
                address = cluster.start_ps(1, timeout_s=120.0)[0]
            except UserError as e:
                raise CalibrationError(f"calibration PS: {e}") from None
            with open(job_path, "w") as f:
                json.dump({"ps": address, "ps_pid": cluster.ps_children()[0].proc.pid, "warmup": warmup,
                           "steps": steps, "min_seconds": MIN_SECONDS, "max_steps": MAX_STEPS, "passes": PASSES,
                           "configs": configs}, f)
            client = subprocess.Popen(on_client_host([sys.executable, "-m", "gmeta_tf.calibration.measure", job_path,
                                                      out_path]),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **client_env})
            try:
                output, _ = client.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise CalibrationError(f"microbenchmark client timed out after {timeout_s:.0f} s") from None
            if client.returncode != 0:
                tail = " | ".join(line for line in output.strip().splitlines()[-3:])
                ps_dead = [c.name for c in cluster.ps_children() if c.proc.poll() is not None]
                raise CalibrationError(f"microbenchmark client failed (exit {client.returncode})"
                                       + (f"; {ps_dead[0]} died" if ps_dead else "") + f": {tail}")
            out: Dict[int, Dict] = {}
            with open(out_path) as f:
                for line in f:
                    rec = json.loads(line)
                    i = int(rec["index"])
                    if i in out:  # another pass: keep the lowest cost (load only ever adds)
                        rec = {**rec, COST: min(rec[COST], out[i][COST]),
                               "wall_ms": min(rec["wall_ms"], out[i]["wall_ms"]),
                               "passes": out[i].get("passes", 1) + 1}
                    out[i] = rec
            return out
        finally:
            if client is not None:
                _kill_group(client)
            cluster.teardown()


def with_capacity(config: Dict, warmup: int, steps: int) -> Dict:
    """Pre-size each table for the ids its variants will insert (bounded: ~2 GiB per set)."""
    draws = warmup + steps + 3
    need = [0] * len(config["dims"])
    for v in config["variants"]:
        for k, sh in enumerate(v["shards"]):
            n = lookups_per_step(float(sh["pooling"]), int(v["samples_per_step"])) * draws
            need[k] = max(need[k], int(expected_distinct(int(sh["rows"]), tuple(sh["skew"]), n)))
    sized = {**config, "capacity": need}
    scale = min(1.0, 2 * 2**30 / max(_capacity_bytes(sized), 1.0))
    return {**config, "capacity": [max(1024, int(r * scale)) for r in need]}


def _capacity_bytes(config: Dict) -> float:
    """What pre-sizing a config's tables (value + 2 slot tables, 1.5x headroom) holds on a PS."""
    return sum(r * 1.5 * 3 * (4 * d + 8) for r, d in zip(config["capacity"], config["dims"]))


def measure_configs(configs: List[Dict], warmup: int, steps: int, log: Callable[[str], None] = print,
                    tables_per_ps: int = 160, network: Optional[str] = None) -> Dict[int, Dict]:
    """Run ``configs`` (``measure.py`` job format); ``{variant index: record}`` where a record
    has ``ps_cpu_ms`` and ``wall_ms`` per step.

    Configs are grouped into chunks of at most ``tables_per_ps`` tables and ``PS_BYTES`` of
    pre-sized tables (a PS keeps a cleared table's memory); each chunk runs on a fresh PS, one
    chunk at a time.
    """
    configs = [with_capacity(c, warmup, steps) for c in configs]
    chunks, cur, n, held = [], [], 0, 0.0
    for c in configs:
        b = _capacity_bytes(c)
        if cur and (n + len(c["dims"]) > tables_per_ps or held + b > PS_BYTES):
            chunks.append(cur)
            cur, n, held = [], 0, 0.0
        cur.append(c)
        n += len(c["dims"])
        held += b
    if cur:
        chunks.append(cur)
    out: Dict[int, Dict] = {}
    for i, chunk in enumerate(chunks):
        tables = sum(len(c["dims"]) for c in chunk)
        variants = sum(len(c["variants"]) for c in chunk)
        timeout = 120.0 + 4.0 * tables + PASSES * variants * (5.0 + 3.0 * (warmup + steps))
        t0 = time.perf_counter()
        out.update(_run_chunk(chunk, warmup, steps, timeout, log, network))
        log(f"[measure] PS run {i + 1}/{len(chunks)}: {len(chunk)} table sets, {tables} tables, "
            f"{time.perf_counter() - t0:.0f} s")
    return out


def measure_sets(sets: Sequence[Tuple[Sequence[Shard], int]], warmup: int = 1, steps: int = 5,
                 log: Callable[[str], None] = print, seed: int = 0, fuse: bool = True) -> List[Dict]:
    """The measured record (``ps_cpu_ms``, ``wall_ms``) of each ``(shards, samples_per_step)``;
    identical sets are measured once, an empty set costs 0. ``fuse``: the tables of one dim in one
    fused table, as the trainer lays them out (``false``: one TFRA table each, for comparison)."""
    key_of, configs = {}, []
    for shards, sps in sets:
        key = (tuple(sorted(shards, key=lambda s: (s.dim, s.rows, s.pooling, s.table, s.index))), int(sps))
        if key in key_of or not shards:
            continue
        key_of[key] = len(configs)
        ordered = key[0]
        configs.append({"dims": [s.dim for s in ordered], "fuse": fuse, "variants": [{
            "index": len(configs), "samples_per_step": int(sps), "seed": seed + len(configs),
            "shards": [shard_json(s) for s in ordered]}]})
    measured = measure_configs(configs, warmup, steps, log) if configs else {}
    out = []
    for shards, sps in sets:
        if not shards:
            out.append({"ps_cpu_ms": 0.0, "wall_ms": 0.0, "steps": 0})
            continue
        key = (tuple(sorted(shards, key=lambda s: (s.dim, s.rows, s.pooling, s.table, s.index))), int(sps))
        out.append(measured[key_of[key]])
    return out


# -- calibrate = measure + fit ------------------------------------------------------------------
def calibrate(ps_count: int = 1, quick: bool = False, seed: int = 0,
              log: Callable[[str], None] = print, settings: Optional[Settings] = None,
              network: Optional[str] = None) -> Dict:
    """Measure random table sets on ``ps_count`` local PS processes (one at a time) and fit.
    ``network``: on two emulated hosts joined by that profile's links (``_ps_host``), as on a
    cluster whose links cost something; the document records it.

    Returns the cost-model document (``cost_model.save_model`` writes it).
    """
    from gmeta_tf.plan.cost_model import fit_document, shard_record

    if ps_count < 1:
        raise CalibrationError(f"--ps must be >= 1 (got {ps_count})")
    s = settings or (QUICK if quick else FULL)
    configs, records = random_configs(s, seed)
    t0 = time.perf_counter()
    # Split the configs over ps_count PS processes, run one after another.
    per_ps = max(1, -(-len(configs) // ps_count))
    measured: Dict[int, Dict] = {}
    for p in range(ps_count):
        part = configs[p * per_ps:(p + 1) * per_ps]
        if part:
            log(f"[calibrate] PS {p + 1}/{ps_count}: {len(part)} table sets")
            measured.update(measure_configs(part, s.warmup, s.steps, log, network=network))
    rows = []
    for r in records:
        if r["index"] in measured:
            m = measured[r["index"]]
            rows.append({"group": r["group"], "samples_per_step": r["samples_per_step"], "ms": m[COST],
                         "wall_ms": m["wall_ms"],
                         "shards": [shard_record(sh) for sh in r["shards"]]})
    doc = fit_document(rows, seed=seed)
    doc["cost"] = COST
    doc["calibration"] = {"ps": ps_count, "quick": quick, "seed": seed, "sets": len(rows),
                          "seconds": round(time.perf_counter() - t0, 1), "host_cpus": os.cpu_count(),
                          "network": network}
    return doc
