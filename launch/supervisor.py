"""``gmeta launch local``'s job as a whole: one cluster after another until the training ends.

``local_cluster.py`` starts and stops one cluster (PS processes plus ``horovodrun``); this
module decides what happens around it, the way ``torchrun --max-restarts`` does:

* **A member dies** (a PS, a rank, ``horovodrun``): the rest are stopped as before. With
  ``max_restarts`` left, a fresh cluster is started after a back-off (new, empty PS on new
  ports) and the trainer resumes from the newest complete checkpoint, refilling the new PS's
  tables from it. One log line per restart names the process that died and its exit code; the
  restarted trainer logs the step it resumed from and the seconds it took
  (``gmeta_tf/train/restarts.py``), and writes every restart into ``train_summary.json``. With
  none left, the last failure is raised as before (``ClusterError``, one line).
* **The launcher is told to stop** (SIGTERM, SIGINT, SIGHUP): the signal goes to every rank,
  which checkpoint at one agreed step and exit (``gmeta_tf/train/preemption.py``); the
  launcher waits for them up to the grace period, stops the PS and returns the signal's exit
  code (143 for SIGTERM). A second signal stops everything at once.
* **A timeout** (``--timeout``) is the whole job's, restarts included, and is never restarted.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from gmeta_tf.errors import ClusterError
from gmeta_tf.train.restarts import RESTARTS_ENV, Restart, encode
from launch.local_cluster import LocalCluster, signal_name
from launch.network.faults import parse_fault
from launch.network.profile import format_rate, parse_profile

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PREEMPTED_CODES = {128 + int(signal.SIGTERM), 128 + int(signal.SIGINT)}


class LaunchStopped(KeyboardInterrupt):
    """The launcher was stopped by ``signum`` before (or without) a preemption checkpoint:
    Ctrl-C or SIGTERM while the PS start, a second signal, or one during a restart's back-off."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@dataclass(frozen=True)
class RestartPolicy:
    """``max_restarts`` (torchrun's flag; 0 = fail on the first death, as before) and the wait
    before each restart, doubling from ``backoff_s`` up to ``max_backoff_s``."""

    max_restarts: int = 0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def backoff(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


@dataclass
class Failure:
    """Why one cluster ended without finishing: the process at fault first, then the rest."""

    problems: List[str]
    exit_code: Optional[int]
    timed_out: bool = False

    @property
    def cause(self) -> str:
        return self.problems[0]


def _failure(cluster: LocalCluster, code: int, timeout_s: Optional[float]) -> Optional[Failure]:
    """None when the workers finished; else the failure, a dead PS first (the ranks' own
    failures follow from it)."""
    problems, first_code = [], None
    for c in cluster.ps_children():
        if c.proc.poll() is not None:
            problems.append(f"{c.name} died ({signal_name(c.proc.returncode)})")
            first_code = first_code if first_code is not None else c.proc.returncode
    for rank, rc in sorted(cluster.failed_ranks().items()):
        what = (f"was stopped by {signal_name(rc)[len('killed by '):]} and checkpointed" if rc in PREEMPTED_CODES
                else f"failed ({signal_name(rc)})")
        problems.append(f"worker rank {rank} {what}")
        first_code = first_code if first_code is not None else rc
    if code == 124:
        problems.append(f"timed out after {timeout_s:.0f} s")
    if code != 0 and not problems:
        problems.append(f"horovodrun failed ({signal_name(code)})")
        first_code = code
    if not problems:
        return None
    return Failure(problems, first_code, timed_out=code == 124)


def _with_resume(train_argv: List[str]) -> List[str]:
    """A restarted cluster always resumes, whatever the first start was asked (--no-resume)."""
    return [("--resume" if a == "--no-resume" else a) for a in train_argv]


def launch_local(workers: int, ps: int, train_argv: List[str], log: Callable[[str], None] = print,
                 timeout_s: Optional[float] = None, ps_ready_timeout_s: float = 120.0,
                 restarts: RestartPolicy = RestartPolicy(), grace_s: float = 25.0,
                 network: Optional[str] = None, network_faults: Sequence[str] = ()) -> int:
    """Start ``ps`` PS tasks and ``workers`` workers running ``gmeta train train_argv``,
    restarting the whole cluster up to ``restarts.max_restarts`` times. ``network`` (a
    ``--network`` profile) other than loopback puts every process on an emulated host
    (``launch/emulated_cluster.py``), and ``network_faults`` schedules faults on their links.

    Returns 0 on success, or the exit code of the stop signal the launcher was sent (the
    ranks checkpointed first); raises ``ClusterError`` naming every failed rank / PS otherwise.
    """
    if workers < 1 or ps < 0:
        raise ClusterError(f"--workers must be >= 1 and --ps >= 0 (got {workers}, {ps})")
    if restarts.max_restarts < 0:
        raise ClusterError(f"--max-restarts must be >= 0 (got {restarts.max_restarts})")
    profile = parse_profile(network)
    faults = [parse_fault(f) for f in network_faults]
    if faults and not profile.emulated:
        raise ClusterError("--network-fault needs an emulated network (--network rate=... or a named profile)")
    if not profile.emulated:
        return _supervise(lambda env: LocalCluster(log=log, env=env), workers, ps, train_argv, log, timeout_s,
                          ps_ready_timeout_s, restarts, grace_s)
    from launch.emulated_cluster import EmulatedCluster
    from launch.emulated_hosts import host_names
    from launch.network.netns import EmulatedNetwork, require_privilege, sweep_stale

    require_privilege()
    if profile.rate_bit_s is not None and not any(a.startswith("cluster.link_rate=") for a in train_argv):
        # the planner's and model.hot_split: auto's network term read the link the job runs on
        train_argv = [*train_argv, "--set", f"cluster.link_rate={format_rate(profile.rate_bit_s)}"]
    sweep_stale(log)  # what a launcher killed with SIGKILL may have left, should its watchdog have failed
    with EmulatedNetwork(host_names(workers, ps), profile, log=log) as net:
        bad = [f.host for f in faults if f.host not in net.hosts]
        if bad:
            raise ClusterError(f"--network-fault names no host of this job: {', '.join(bad)} "
                               f"(hosts: {', '.join(net.hosts)})")
        return _supervise(lambda env: EmulatedCluster(net, workers, ps, log=log, env=env, faults=faults),
                          workers, ps, train_argv, log, timeout_s, ps_ready_timeout_s, restarts, grace_s)


def _supervise(make_cluster: Callable[[Optional[Dict[str, str]]], LocalCluster], workers: int, ps: int,
               train_argv: List[str], log: Callable[[str], None], timeout_s: Optional[float],
               ps_ready_timeout_s: float, restarts: RestartPolicy, grace_s: float) -> int:
    """The restart loop of ``launch_local``, whatever kind of cluster ``make_cluster`` makes."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    history: List[Restart] = []
    state = {"cluster": None, "signum": None}

    def on_first_signal(signum, _frame):
        if state["signum"] is not None or not state.get("workers"):
            raise LaunchStopped(signum)  # a second signal, or no worker to checkpoint yet
        state["signum"] = signum
        state["cluster"].request_stop(signum, grace_s)

    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in previous:
        signal.signal(s, on_first_signal)
    try:
        while True:
            cluster = make_cluster({RESTARTS_ENV: encode(history)} if history else None)
            state["cluster"], state["workers"] = cluster, False
            try:
                if ps:
                    cluster.start_ps(ps, ps_ready_timeout_s)
                left = None if deadline is None else max(deadline - time.monotonic(), 1.0)
                state["workers"] = True
                code = cluster.train(workers, _with_resume(train_argv) if history else train_argv, left)
                failure = _failure(cluster, code, timeout_s)
                failed_at = cluster.first_failure_at or time.time()
                step = cluster.last_step_seen()
            finally:
                cluster.teardown()
                state["workers"] = False
            if state["signum"] is not None:
                log(f"[launch] stopped by {signal.Signals(state['signum']).name}: "
                    + ("the workers checkpointed and exited" if failure is None or all(
                        "checkpointed" in p for p in failure.problems) else "; ".join(failure.problems)))
                return 128 + state["signum"]
            if failure is None:
                return 0
            if failure.timed_out or len(history) >= restarts.max_restarts:
                raise ClusterError("launch failed: " + "; ".join(failure.problems)
                                   + (f" (after {len(history)} restart(s))" if history else ""))
            attempt = len(history) + 1
            wait = restarts.backoff(attempt)
            history.append(Restart(attempt, failure.cause, failure.exit_code, step, failed_at))
            log(f"[launch] restart {attempt}/{restarts.max_restarts}: {failure.cause}"
                + (f" (exit code {failure.exit_code})" if failure.exit_code is not None else "")
                + (f" at step {step}" if step is not None else "")
                + f"; a new cluster in {wait:g} s resumes from the latest complete checkpoint")
            time.sleep(wait)
    except KeyboardInterrupt as e:  # LaunchStopped too; the cluster's teardown has run
        log("[launch] interrupted: stopped every process")
        raise e if isinstance(e, LaunchStopped) else LaunchStopped(int(signal.SIGINT)) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
