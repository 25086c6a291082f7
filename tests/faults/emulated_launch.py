"""A launcher for the emulated-host tests, and the shape of ``gmeta launch local --network``:
``LocalCluster`` owns the processes, ``EmulatedNetwork`` the hosts, ``run_job`` the order.

    python tests/faults/emulated_launch.py PROFILE WORKERS PS TIMEOUT_S -- ENTRYPOINT_ARGS...

Prints every process's lines with a prefix, exits 0 when every worker finished and every PS
still served. A kill -9 of this process is what tests/faults/test_emulated_hosts.py injects.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launch.emulated_hosts import EmulatedJob, host_names, run_job  # noqa: E402
from launch.local_cluster import LocalCluster  # noqa: E402
from launch.network.netns import EmulatedNetwork, sweep_stale  # noqa: E402
from launch.network.profile import parse_profile  # noqa: E402


def spawn_with(cluster: LocalCluster):
    """``run_job``'s spawn on today's ``LocalCluster`` (whose ``spawn`` takes no env)."""
    def spawn(name, argv, env, prefix):
        base = cluster.env
        cluster.env = {**base, **env}
        try:
            return cluster.spawn(name, argv, prefix=prefix).proc
        finally:
            cluster.env = base
    return spawn


def main(argv) -> int:
    sep = argv.index("--")
    profile, workers, ps, timeout_s = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    job = EmulatedJob(workers=workers, ps=ps, entrypoint_args=argv[sep + 1:])
    sweep_stale(print)
    cluster = LocalCluster(log=print)
    try:
        with EmulatedNetwork(host_names(workers, ps), parse_profile(profile), log=print) as net:
            try:
                result = run_job(net, job, spawn_with(cluster), timeout_s=timeout_s)
            finally:
                cluster.teardown()  # processes out of the namespaces before they go
        print(f"[launch] workers {result.worker_codes}, ps {result.ps_codes}", flush=True)
        return 0 if result.ok else 1
    finally:
        cluster.teardown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
