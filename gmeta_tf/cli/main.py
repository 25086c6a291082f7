"""The ``gmeta`` command: one click group; each sub-command lives in its own module."""
import click

import gmeta_tf
from gmeta_tf.cli.data_cmd import data
from gmeta_tf.cli.demo_cmd import demo
from gmeta_tf.cli.export_cmd import export_cmd
from gmeta_tf.cli.job_cmd import job_group
from gmeta_tf.cli.k8s_cmd import k8s_group
from gmeta_tf.cli.k8s_entrypoint_cmd import entrypoint_cmd
from gmeta_tf.cli.k8s_serve_cmd import render_serving_cmd
from gmeta_tf.cli.launch_cmd import launch
from gmeta_tf.cli.plan_cmd import plan_group
from gmeta_tf.cli.ps_cmd import ps_group
from gmeta_tf.cli.serve_cmd import serve_cmd
from gmeta_tf.cli.train_cmd import eval_cmd, train
from gmeta_tf.cli.tune_cmd import tune


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(gmeta_tf.__version__, prog_name="gmeta")
def cli():
    """gmeta-tf: distributed meta-learning for deep recommendation models."""


cli.add_command(data)
cli.add_command(train)
cli.add_command(eval_cmd)
cli.add_command(export_cmd)
cli.add_command(tune)
cli.add_command(demo)
cli.add_command(ps_group)
cli.add_command(launch)
k8s_group.add_command(entrypoint_cmd)
k8s_group.add_command(render_serving_cmd)
cli.add_command(k8s_group)
cli.add_command(job_group)
cli.add_command(plan_group)
cli.add_command(serve_cmd)

if __name__ == "__main__":
    cli()
