"""``gmeta ps serve``: run one parameter-server task (see ``ps/server.py``)."""
from __future__ import annotations

import logging

import click

from gmeta_tf.cli.common import friendly_errors
from gmeta_tf.errors import ClusterError


@click.group("ps")
def ps_group():
    """Parameter-server processes that hold the TFRA embedding tables."""


@ps_group.command("serve")
@click.option("--ps-hosts", default=None, help="Every PS task, host:port,... (default: TF_CONFIG's cluster.ps).")
@click.option("--index", type=int, default=None, help="This task's index in --ps-hosts (default: TF_CONFIG's task.index).")
@click.option("--health-port", type=int, default=None,
              help="HTTP readiness probe port (/ready answers 200 once serving).")
@click.option("--ready-file", default=None, help="Also write this file once serving.")
@friendly_errors
def serve_cmd(ps_hosts, index, health_port, ready_file):
    """Serve TFRA tables for job 'ps' until SIGTERM."""
    from gmeta_tf.cluster.tf_config import tf_config_from_env
    from ps.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    hosts = [h for h in (ps_hosts or "").split(",") if h]
    if not hosts or index is None:
        tfc = tf_config_from_env()
        if tfc is None:
            raise ClusterError("gmeta ps serve needs --ps-hosts and --index, or TF_CONFIG")
        if tfc.task_type != "ps":
            raise ClusterError(f"TF_CONFIG says this task is a {tfc.task_type}, not a ps")
        hosts = hosts or tfc.ps
        index = tfc.task_index if index is None else index
    if not 0 <= index < len(hosts):
        raise ClusterError(f"--index {index} is out of range for {len(hosts)} PS host(s)")
    serve(hosts, index, health_port=health_port, ready_file=ready_file)
