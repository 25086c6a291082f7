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
@click.option("--timeout", "timeout_s", type=float, default=None, help="Stop everything after this many seconds.")
@train_options(with_ps=False)
@friendly_errors
def local(workers, ps_count, timeout_s, config_path, overrides, data, run_dir, algo, steps, resume, warm_start):
    """Run `gmeta train` as N workers with M PS on this host; every train option passes through."""
    from launch.local_cluster import launch_local

    train_config(config_path, overrides, data, algo, steps)  # fail fast on a bad config, here
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
        launch_local(workers, ps_count, argv, log=lambda m: click.echo(m), timeout_s=timeout_s)
    except KeyboardInterrupt:
        sys.exit(130)
    click.echo(f"[launch] done: {workers} worker(s), {ps_count} PS; run directory {run_dir}")
