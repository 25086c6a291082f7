"""``gmeta launch local``'s job as a whole: one cluster after another until the training ends.

``local_cluster.py`` starts and stops one cluster (PS processes plus ``horovodrun``) and
``failures.py`` says why one ended; this module decides what happens around it, the way
``torchrun --max-restarts`` does:

* **A member dies** (a PS, a rank, ``horovodrun``): the rest are stopped as before. With
  ``max_restarts`` left, a fresh cluster is started after a back-off (new, empty PS on new
  ports) and the trainer resumes from the newest complete checkpoint, refilling the new PS's
  tables from it. One log line per restart names the process that died and its exit code; the
  restarted trainer logs the step it resumed from and the seconds it took
  (``gmeta_tf/train/restarts.py``), and writes every restart into ``train_summary.json``. With
  none left, the last failure is raised as before (``ClusterError``, one line).
* **The launcher is told to stop** (``exit_codes.STOP_SIGNALS``): the request goes to every
  rank through the stop file of the status directory, read by ranks already running and by
  those horovodrun starts later alike; they checkpoint at one agreed step and exit
  (``gmeta_tf/train/preemption.py``). The launcher waits for them up to the grace period, stops
  the PS and returns the signal's exit code (143 for SIGTERM). It says "checkpointed" only
  where a rank's record says so. A signal before any rank started (while the PS start, during a
  back-off) stops the launch at once: there is nothing to checkpoint. A second signal stops
  everything at once.
* **A timeout** (``--timeout``) is the whole job's, restarts included, and is never restarted.

The signal handler only records (``gmeta_tf/stop_signals.py``); the wait loops act on it. What
the launcher reports of a rank (its step, its checkpoint, why it exited) comes from the ranks'
status records (``gmeta_tf/train/rank_status.py``), and a failed job exits with its first
cause's code from ``gmeta_tf/exit_codes.py``: a dead PS is 200 here as in ``gmeta train``.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from gmeta_tf import exit_codes
from gmeta_tf.config.schema import ClusterConfig, check_elastic_cooldown
from gmeta_tf.errors import ClusterError, JobFailed
from gmeta_tf.stop_signals import StopSignals
from gmeta_tf.train.rank_status import STATUS_DIR
from gmeta_tf.train.restarts import RESTARTS_ENV, Restart, encode, mark
from launch.failures import Failure
from launch.failures import failure_of as _failure  # also read by tests under these names
from launch.failures import stop_outcome as _stop_outcome
from launch.failures import workers_only as _workers_only
from launch.local_cluster import LocalCluster
from launch.network.faults import NetworkFault, parse_fault
from launch.network.profile import LinkProfile, format_rate, parse_profile
from launch.outcomes import LaunchStopped, WorkersTimedOut

__all__ = ["LaunchStopped", "RestartPolicy", "launch_local"]

_COOLDOWN = ClusterConfig().elastic_cooldown_s
_DEFAULT_COOLDOWN_S = None if _COOLDOWN is None else tuple(_COOLDOWN)  # cluster.elastic_cooldown_s's default
_DEFAULT_RESET_LIMIT = ClusterConfig().elastic_reset_limit


@dataclass(frozen=True)
class RestartPolicy:
    """``max_restarts`` (torchrun's flag; 0 = fail on the first death, as before) and the wait
    before each restart, doubling from ``backoff_s`` up to ``max_backoff_s``."""

    max_restarts: int = 0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def backoff(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


def _with_resume(train_argv: List[str]) -> List[str]:
    """A restarted cluster always resumes, whatever the first start was asked (--no-resume)."""
    return [("--resume" if a == "--no-resume" else a) for a in train_argv]


def _run_dir_of(train_argv: Sequence[str]) -> str:
    """The run directory ``gmeta train`` will use: its ``--out`` (``runs/default`` when absent)."""
    argv = list(train_argv)
    return argv[argv.index("--out") + 1] if "--out" in argv[:-1] else "runs/default"


@contextmanager
def _status_dir(run_dir: str) -> Iterator[str]:
    """The ranks' status records: ``status/`` of a local run directory (kept, so what the last
    cluster's ranks said can be read afterwards), else a directory of this launch's."""
    if "://" not in run_dir or run_dir.startswith("file://"):
        yield os.path.abspath(os.path.join(run_dir[len("file://"):] if run_dir.startswith("file://") else run_dir,
                                           STATUS_DIR))
        return
    tmp = tempfile.mkdtemp(prefix="gmeta-status-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def launch_local(workers: int, ps: int, train_argv: List[str], log: Callable[[str], None] = print,
                 timeout_s: Optional[float] = None, ps_ready_timeout_s: float = 120.0,
                 restarts: RestartPolicy = RestartPolicy(), grace_s: float = 25.0,
                 network: Optional[str] = None, network_faults: Sequence[str] = (),
                 run_dir: Optional[str] = None, elastic: bool = False,
                 elastic_cooldown_s: Optional[Sequence[int]] = _DEFAULT_COOLDOWN_S,
                 elastic_reset_limit: Optional[int] = _DEFAULT_RESET_LIMIT) -> int:
    """Start ``ps`` PS tasks and ``workers`` workers running ``gmeta train train_argv``,
    restarting the whole cluster up to ``restarts.max_restarts`` times. ``network`` (a
    ``--network`` profile) other than loopback puts every process on an emulated host
    (``launch/emulated_cluster.py``), and ``network_faults`` schedules faults on their links.
    ``run_dir`` is the ranks' ``--out`` (read from ``train_argv`` when not given). ``elastic``:
    the workers run as a Horovod Elastic ring (``cluster.elastic``; ``launch/elastic_hosts.py``):
    a lost worker is absorbed by the others with no restart; a lost PS restarts as without it.
    ``elastic_cooldown_s`` (``cluster.elastic_cooldown_s``): how long a lost worker's host stays
    out of the ring before horovodrun starts a new worker there (None: it never returns).
    ``elastic_reset_limit`` (``cluster.elastic_reset_limit``): horovodrun's ``--reset-limit``, so a
    ring that keeps failing ends instead of resetting forever.

    Returns 0 on success, or the exit code of the stop signal the launcher was sent; raises
    ``JobFailed`` naming every failed rank / PS otherwise, with its first cause's exit code.
    """
    profile, faults = _check_launch(workers, ps, restarts, network, network_faults)
    run_dir = run_dir or _run_dir_of(train_argv)
    if elastic:
        _check_elastic(workers, profile.emulated)
        check_elastic_cooldown(elastic_cooldown_s)
        train_argv = [*train_argv, "--set", "cluster.elastic=true"]
    job = Job(workers, ps, train_argv, log, timeout_s, ps_ready_timeout_s, restarts, grace_s)
    if profile.emulated:
        return _launch_emulated(job, profile, faults, run_dir)
    cooldown = None if elastic_cooldown_s is None else list(elastic_cooldown_s)
    with _status_dir(run_dir) as status:
        def local(env):
            return LocalCluster(log=log, env=env, elastic=elastic, elastic_dir=_elastic_dir(run_dir, status),
                                elastic_cooldown_s=cooldown, elastic_reset_limit=elastic_reset_limit)
        return _supervise(job, local, status)


def _check_launch(workers: int, ps: int, restarts: RestartPolicy, network: Optional[str],
                  network_faults: Sequence[str]) -> Tuple[LinkProfile, List[NetworkFault]]:
    """The counts, the restart policy and the network of a launch, refused before anything starts."""
    if workers < 1 or ps < 0:
        raise ClusterError(f"--workers must be >= 1 and --ps >= 0 (got {workers}, {ps})")
    if restarts.max_restarts < 0:
        raise ClusterError(f"--max-restarts must be >= 0 (got {restarts.max_restarts})")
    profile = parse_profile(network)
    faults = [parse_fault(f) for f in network_faults]
    if faults and not profile.emulated:
        raise ClusterError("--network-fault needs an emulated network (--network rate=... or a named profile)")
    return profile, faults


def _launch_emulated(job: Job, profile: LinkProfile, faults: List[NetworkFault], run_dir: str) -> int:
    """Every PS and worker on an emulated host of its own (``launch/emulated_cluster.py``)."""
    from launch.emulated_cluster import EmulatedCluster
    from launch.emulated_hosts import entrypoint_args, host_names
    from launch.network.netns import EmulatedNetwork, require_privilege, sweep_stale

    entrypoint_args(job.train_argv)  # refuses --no-resume before any host starts
    require_privilege()
    if profile.rate_bit_s is not None and not any(a.startswith("cluster.link_rate=") for a in job.train_argv):
        # the planner's and model.hot_split: auto's network term read the link the job runs on
        job = dataclasses.replace(job, train_argv=[*job.train_argv, "--set",
                                                   f"cluster.link_rate={format_rate(profile.rate_bit_s)}"])
    sweep_stale(job.log)  # what a launcher killed with SIGKILL may have left, should its watchdog have failed
    with EmulatedNetwork(host_names(job.workers, job.ps), profile, log=job.log) as net, _status_dir(run_dir) as status:
        bad = [f.host for f in faults if f.host not in net.hosts]
        if bad:
            raise ClusterError(f"--network-fault names no host of this job: {', '.join(bad)} "
                               f"(hosts: {', '.join(net.hosts)})")
        return _supervise(job, lambda env: EmulatedCluster(net, log=job.log, env=env, faults=faults), status)


def _elastic_dir(run_dir: str, status: str) -> str:
    """Where the elastic ring's host discovery script and host file go: ``elastic/`` of a local run
    directory, else under this launch's own status directory."""
    if "://" not in run_dir or run_dir.startswith("file://"):
        return os.path.join(os.path.dirname(status), "elastic")
    return os.path.join(status, "elastic")


def _check_elastic(workers: int, emulated: bool) -> None:
    """What ``--elastic`` needs of the launch itself (the config's part is ``Config._check_elastic``)."""
    if workers < 2:
        raise ClusterError(f"--elastic needs --workers >= 2 (got {workers}): a ring of one has no worker to lose")
    if emulated:
        raise ClusterError("--elastic runs on loopback only: with --network each emulated host is started as a "
                           "TFJob pod, not by horovodrun's elastic driver")


def _backoff(seconds: float, signals: StopSignals) -> None:
    """The wait before a restart; a stop signal ends the launch instead."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if signals.received:
            raise LaunchStopped(signals.first)
        time.sleep(min(0.1, max(end - time.monotonic(), 0.0)))


@dataclass(frozen=True)
class Job:
    """What the restart loop needs of a launch, whatever kind of cluster it runs on."""

    workers: int
    ps: int
    train_argv: List[str]
    log: Callable[[str], None]
    timeout_s: Optional[float]  # the whole job's, restarts included
    ps_ready_timeout_s: float
    restarts: RestartPolicy
    grace_s: float  # the ranks' preemption grace period


@dataclass
class _Run:
    """How one cluster's run ended: why (None: finished), the newest step a rank reported, when its
    workers exited, what they did with a stop request, whether its PS are kept for the next."""

    failure: Optional[Failure]
    step: Optional[int]
    exited: float
    stop_outcome: str
    keep_ps: bool = False


MakeCluster = Callable[[Optional[Dict[str, str]]], LocalCluster]


def _supervise(job: Job, make_cluster: MakeCluster, status_dir: str) -> int:
    """The restart loop of ``launch_local``, whatever kind of cluster ``make_cluster`` makes."""
    deadline = None if job.timeout_s is None else time.monotonic() + job.timeout_s
    history: List[Restart] = []
    cluster: Optional[LocalCluster] = None  # kept across a restart when only workers were lost
    with StopSignals() as signals:
        try:
            while True:
                mark(history, "relaunched")
                new_ps = cluster is None and bool(job.ps)
                if cluster is None:
                    cluster = make_cluster({RESTARTS_ENV: encode(history)} if history else None)
                    cluster.watch_stops(signals, job.grace_s, status_dir)
                else:
                    cluster.env[RESTARTS_ENV] = encode(history)
                run = _run_cluster(job, cluster, new_ps, history, signals, deadline)
                code = _job_end(job, cluster, run, history, signals)
                if code is not None:
                    return code
                if not run.keep_ps:
                    cluster = None
                _restart(job, run, history, signals)
        except LaunchStopped:
            job.log("[launch] interrupted: stopped every process")
            raise
        finally:
            if cluster is not None:  # the PS kept for a restart the launch did not get to (idempotent)
                cluster.teardown()


def _run_cluster(job: Job, cluster: LocalCluster, new_ps: bool, history: List[Restart], signals: StopSignals,
                 deadline: Optional[float]) -> _Run:
    """One cluster's run, from its PS start (``new_ps``) to its teardown: its workers only when the
    next run keeps its PS (``_workers_only``), else everything."""
    keep_ps = False
    try:
        if new_ps:
            cluster.start_ps(job.ps, job.ps_ready_timeout_s)
            if history:
                mark(history, "ps_ready")
                cluster.env[RESTARTS_ENV] = encode(history)
        if signals.received:  # no rank started yet: nothing to checkpoint
            raise LaunchStopped(signals.first)
        left = None if deadline is None else max(deadline - time.monotonic(), 1.0)
        try:
            code = cluster.train(job.workers, _with_resume(job.train_argv) if history else job.train_argv, left)
        except WorkersTimedOut as e:
            code = e
        exited = time.time()
        failure = _failure(cluster, code, job.timeout_s)
        run = _Run(failure, cluster.last_step_seen(), exited,
                   _stop_outcome(cluster, job.workers) if signals.received else "")
        keep_ps = run.keep_ps = (failure is not None and not signals.received
                                 and len(history) < job.restarts.max_restarts and _workers_only(cluster, failure))
        return run
    finally:
        if keep_ps:
            cluster.teardown_workers()
        else:
            cluster.teardown()


def _job_end(job: Job, cluster: LocalCluster, run: _Run, history: List[Restart], signals: StopSignals) -> Optional[int]:
    """The launch's exit code when this run ends it: a stop signal's, or ``DONE``; raises
    ``JobFailed`` when it failed with no restart left (or timed out); None: restart."""
    if signals.received:
        job.log(f"[launch] stopped by {exit_codes.signal_name(signals.first)}: {run.stop_outcome}")
        return exit_codes.signal_exit(signals.first)
    failure = run.failure
    if failure is None:
        outcome = cluster.elastic_outcome()
        if outcome:
            job.log(outcome)
        return exit_codes.DONE.code
    if failure.timed_out or len(history) >= job.restarts.max_restarts:
        raise JobFailed("launch failed: " + "; ".join(failure.problems)
                        + (f" (after {len(history)} restart(s))" if history else ""), failure.job_code)
    return None


def _restart(job: Job, run: _Run, history: List[Restart], signals: StopSignals) -> None:
    """Record the restart about to happen (``train_summary.json`` gets it), say it, back off."""
    failure = run.failure
    attempt = len(history) + 1
    wait = job.restarts.backoff(attempt)
    history.append(Restart(attempt, failure.cause, failure.exit_code, run.step, failure.failed_at or run.exited))
    mark(history, "workers_exited", run.exited)
    mark(history, "cluster_stopped")
    job.log(f"[launch] restart {attempt}/{job.restarts.max_restarts}: {failure.cause}"
            + (f" (exit code {failure.exit_code})" if failure.exit_code is not None else "")
            + (f" at step {run.step}" if run.step is not None else "")
            + f"; {'new workers' if run.keep_ps else 'a new cluster'} in {wait:g} s, resuming from the "
              "latest complete checkpoint" + (" (the PS kept: a restore replaces all they hold)"
                                              if run.keep_ps else ""))
    _backoff(wait, signals)
