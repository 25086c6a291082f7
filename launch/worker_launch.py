"""How one cluster's workers start: ``gmeta train`` as Horovod ranks under ``horovodrun``, each
behind ``launch/rank_agent.py``, as a fixed ring on ``localhost`` or a Horovod Elastic ring
(``--elastic``; its hosts and discovery script are ``launch/elastic_hosts.py``'s).

What the launcher says of an elastic ring lives here too (``ElasticRing``): under Horovod Elastic
a lost rank is the ring's to absorb, not a failure, and a worker started on a returned host joins
the running ring; the launcher reads both from the processes' status records and says each once.
Watching the workers, stop requests and restarts are ``local_cluster.py``'s and ``supervisor.py``'s.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import RankStatus
from launch.elastic_hosts import horovodrun_args, this_machine_names, worker_hosts, write_discovery
from launch.horovodrun import argv as hvd_launch_argv
from launch.rank_agent import RANK_ARGV_ENV, agent_argv

__all__ = ["ElasticRing", "agent_argv", "agent_env", "horovodrun_command", "ring_args", "train_argv"]


@dataclass
class ElasticRing:
    """A Horovod Elastic ring's launch settings and what the launcher said of it. ``directory``
    holds the ring's host discovery script and host file; ``cooldown_s`` is
    ``cluster.elastic_cooldown_s``, ``reset_limit`` ``cluster.elastic_reset_limit`` (horovodrun's
    ``--reset-limit``)."""

    directory: Optional[str] = None
    cooldown_s: Optional[List[int]] = None
    reset_limit: Optional[int] = None
    lost: List[Tuple[int, int]] = field(default_factory=list)  # (rank, pid) of each lost rank said
    joined: List[int] = field(default_factory=list)  # pids of the workers said to have joined the ring

    def horovodrun_args(self, workers: int, status_dir: Optional[str]) -> List[str]:
        """One local host name per worker, written as the discovery script's host file."""
        hosts = worker_hosts(workers, this_machine_names())
        directory = self.directory or os.path.join(status_dir or ".", "elastic")
        return horovodrun_args(workers, write_discovery(directory, hosts), self.cooldown_s,
                               reset_limit=self.reset_limit)

    def note_lost(self, lost: List[RankStatus], log: Callable[[str], None]) -> None:
        """The survivors roll back to their last commit and go on as a smaller ring: each lost
        rank (process) is said once, and nobody is ended."""
        for r in lost:
            if (r.rank, r.pid) not in self.lost:
                self.lost.append((r.rank, r.pid))
                log(f"[launch] worker rank {r.rank} {r.exit.message}: elastic, the other ranks go on "
                    f"without it from their last commit")

    def note_joined(self, records: List[RankStatus], log: Callable[[str], None]) -> None:
        """A worker horovodrun started on a returned host (``cluster.elastic_cooldown_s``) says in its
        record the commit it joined the running ring at (``joined_step``, ``ring``); said once."""
        for r in records:
            if r.joined_step is not None and r.ring and r.pid not in self.joined:
                self.joined.append(r.pid)
                _, rank, size = r.ring[0]
                log(f"[launch] a new worker (pid {r.pid}) joined the elastic ring as rank {rank} of {size} "
                    f"at the commit of step {r.joined_step}: the ring grew back")

    def outcome(self, records: List[RankStatus], log: Callable[[str], None]) -> str:
        """How a ring that finished ended: its size at the end (the ranks that finished) and the
        workers lost and joined on the way."""
        self.note_joined(records, log)
        done = [r for r in records if r.exit is not None and r.exit.reason is rank_status.ExitReason.DONE]
        sizes = {r.ring[-1][2] for r in done if r.ring}
        size = max(sizes) if sizes else len(done)
        return (f"[launch] elastic: the ring finished with {size} rank(s); {len(self.lost)} worker(s) lost, "
                f"{len(self.joined)} joined on a returned host")


def ring_args(workers: int, elastic: Optional[ElasticRing], status_dir: Optional[str]) -> List[str]:
    """``horovodrun``'s arguments for ``workers`` ranks: one elastic host each, or all on localhost."""
    if elastic is not None:
        return elastic.horovodrun_args(workers, status_dir)
    return ["-np", str(workers), "-H", f"localhost:{workers}", "--gloo"]


def horovodrun_command(args: List[str], worker_argv: List[str],
                       shown: Optional[List[str]] = None) -> Tuple[List[str], str]:
    """The command that runs ``worker_argv`` under horovodrun (without its per-launch Gloo probe,
    ``launch/horovodrun.py``), and the log line naming the same run as plain ``horovodrun``
    (``shown``: the command to name instead, when ``worker_argv`` wraps it)."""
    horovodrun = str(Path(sys.executable).with_name("horovodrun"))
    line = f"[launch] {shlex.join([horovodrun, *args, *(shown or worker_argv)])}"
    return [*hvd_launch_argv(), *args, *worker_argv], line


def train_argv(train_args: List[str], ps_addresses: List[str]) -> List[str]:
    """``gmeta train train_args`` against ``ps_addresses``."""
    argv = [sys.executable, "-m", "gmeta_tf.cli.main", "train", *train_args]
    if ps_addresses:
        argv += ["--ps", ",".join(ps_addresses)]
    return argv


def agent_env(rank_env: Dict[str, str], argv: List[str]) -> Dict[str, str]:
    """What each ``rank_agent`` gets: the ranks' status directory and stop file, and the rank's command."""
    return {**rank_env, RANK_ARGV_ENV: json.dumps(argv)}
