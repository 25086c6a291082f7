"""``gmeta launch local``: the hybrid trainer on one host (see ``launch/local_cluster.py``)."""
from __future__ import annotations

import sys

import click

from gmeta_tf.cli.common import friendly_errors
from gmeta_tf.cli.train_cmd import train_config, train_options


@click.group()
def launch():
    """Start parameter servers and Horovod workers."""


@launch.command("local")
@click.option("--workers", type=int, default=2, show_default=True, help="Horovod ranks (horovodrun -np).")
@click.option("--ps", "ps_count", type=int, default=2, show_default=True, help="Parameter-server processes to start.")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Stop everything after this many seconds (the whole job, restarts included).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="When a PS or a worker dies, start a fresh cluster and resume from the latest complete "
                   "checkpoint, up to this many times (torchrun's flag; 0: stop on the first failure).")
@click.option("--restart-backoff", "backoff_s", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds to wait before the first restart; doubled at each further one (at most 30).")
@click.option("--network", default="loopback", show_default=True, metavar="PROFILE",
              help="loopback, a named profile (docs/network.md) or rate=1gbit[,loss=0.01]: anything but loopback "
                   "runs every PS and worker on an emulated host of its own (network namespaces, tc), "
                   "started as a TFJob's pods are. Needs root (CAP_NET_ADMIN) and iproute2.")
@click.option("--network-fault", "network_faults", multiple=True, metavar="HOST:KIND=VALUE@STEP",
              help="With --network: a fault on one host's link once a worker reaches STEP, e.g. ps0:cut=5@20, "
                   "worker1:loss=0.02@10, worker0:rate=10mbit@30. Repeatable.")
@click.option("--elastic", is_flag=True, default=False,
              help="Run the workers as a Horovod Elastic ring (cluster.elastic): a lost worker rolls the others "
                   "back to their last commit (train.elastic_commit_every) and they go on, with no restart; after "
                   "cluster.elastic_cooldown_s a new worker starts on the lost one's host and the ring grows back; "
                   "a lost PS still restarts from the checkpoint (docs/fault_tolerance.md).")
@train_options(with_ps=False)
@friendly_errors
def local(workers, ps_count, timeout_s, max_restarts, backoff_s, network, network_faults, elastic, config_path,
          overrides, data, run_dir, algo, steps, resume, warm_start):
    """Run `gmeta train` as N workers with M PS on this host; every train option passes through.

    SIGTERM, Ctrl-C or SIGHUP makes every worker checkpoint at one agreed step and exit (143 / 130
    / 129) within train.preemption_grace_s; a second one stops everything at once. A failed job
    exits with its cause's code (gmeta_tf/exit_codes.py: a lost PS or worker 200, as `gmeta train`)."""
    from gmeta_tf.exit_codes import signal_exit
    from launch.supervisor import LaunchStopped, RestartPolicy, launch_local

    # fail fast on a bad config, here (an elastic ring's conflicts with it included)
    cfg = train_config(config_path, (*overrides, "cluster.elastic=true") if elastic else overrides, data, algo, steps)
    argv = []
    if config_path:
        argv += ["--config", config_path]
    for item in overrides:
        argv += ["--set", item]
    for flag, value in (("--data", data), ("--algo", algo), ("--steps", steps), ("--warm-start", warm_start)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--out", run_dir, "--resume" if resume else "--no-resume"]
    try:
        code = launch_local(workers, ps_count, argv, log=lambda m: click.echo(m), timeout_s=timeout_s,
                            restarts=RestartPolicy(max_restarts, backoff_s), grace_s=cfg.train.preemption_grace_s,
                            network=network, network_faults=network_faults, run_dir=run_dir, elastic=elastic,
                            elastic_cooldown_s=cfg.cluster.elastic_cooldown_s,
                            elastic_reset_limit=cfg.cluster.elastic_reset_limit)
    except LaunchStopped as e:
        sys.exit(signal_exit(e.signum))
    if code:
        click.echo(f"[launch] run directory {run_dir}: re-run the same command to resume from its checkpoint")
        sys.exit(code)
    click.echo(f"[launch] done: {workers} worker(s), {ps_count} PS; run directory {run_dir}")
