"""Real processes for the distributed tests: PS servers, Horovod ranks, orphan checks.

Everything binds to loopback on free ports, every wait is bounded, and every process started
here is killed in ``finally`` blocks by the callers (``LocalCluster.teardown``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from launch.gloo_rendezvous import GlooRendezvous, rank_env
from launch.local_cluster import LAUNCH_ID_ENV, LocalCluster, free_ports

REPO = Path(__file__).resolve().parents[1]

# The session's uninterrupted 2-worker + 2-PS quickstart run (conftest's ``launch_local_2w2ps``),
# which test_distributed, test_tfjob_emulation and test_hot_split_distributed compare against: its
# settings. The fewest steps that still cross a fault and learn: checkpoints at 20 and 40 for a
# kill to fall between, and a test AUC well above chance at the end.
LAUNCH_LOCAL_SETS = ["data.tasks_per_batch=16", "train.log_every=20", "train.checkpoint_every=20"]
LAUNCH_LOCAL_STEPS = 60
GMETA = [sys.executable, "-m", "gmeta_tf.cli.main"]


def processes_with_env(key: str, value: str) -> List[int]:
    """PIDs whose environment has ``key=value`` (the orphan check)."""
    needle = f"{key}={value}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def rank_summaries(run_dir: Path) -> Dict[int, dict]:
    out = {}
    for f in sorted((run_dir / "ranks").glob("rank*.json")):
        out[int(f.stem[4:])] = json.loads(f.read_text())
    return out


def run_gmeta(args: List[str], timeout: float, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GMETA, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def start_ranks_manually(cluster: LocalCluster, train_args: List[str], workers: int,
                         delays: List[float], iface: str = "lo") -> List[subprocess.Popen]:
    """Start ranks like TFJob pods would (no horovodrun): own Gloo rendezvous, any order.

    ``delays[r]`` is how long after the first start rank ``r`` starts.
    """
    port = free_ports(1)[0]
    hosts = [f"worker-{r}" for r in range(workers)]
    rdv = GlooRendezvous(hosts, port, bind="127.0.0.1").start()
    cluster._rendezvous = rdv  # stopped by stop_manual_ranks
    procs: Dict[int, object] = {}
    t0 = time.monotonic()
    for r in sorted(range(workers), key=lambda r: delays[r]):
        time.sleep(max(0.0, t0 + delays[r] - time.monotonic()))
        env = rank_env(r, hosts, "127.0.0.1", port, iface)
        cluster.env.update(env)
        procs[r] = cluster.spawn(f"rank {r}", [*GMETA, "train", *train_args,
                                               "--ps", ",".join(cluster.ps_addresses)], prefix=f"rank{r}")
    for key in rank_env(0, hosts, "127.0.0.1", port, iface):
        cluster.env.pop(key, None)
    return [procs[r].proc for r in range(workers)]


def stop_manual_ranks(cluster: LocalCluster) -> None:
    rdv = getattr(cluster, "_rendezvous", None)
    if rdv is not None:
        rdv.stop()


__all__ = ["LAUNCH_ID_ENV", "LAUNCH_LOCAL_SETS", "LAUNCH_LOCAL_STEPS", "LocalCluster", "processes_with_env", "rank_summaries", "run_gmeta",
           "start_ranks_manually", "stop_manual_ranks", "free_ports", "REPO", "GMETA"]
