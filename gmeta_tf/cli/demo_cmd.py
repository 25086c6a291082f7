"""``gmeta demo``: the whole embedded slice on generated data (``gmeta_tf/demo.py``)."""
import click

from gmeta_tf.cli.common import friendly_errors


@click.command()
@click.option("--config", "config_path", default="configs/quickstart.yaml", show_default=True)
@click.option("--out", default="runs/demo", show_default=True)
@click.option("--tasks", default=10000, show_default=True, type=int, help="Synthetic users.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE")
def demo(config_path, out, tasks, overrides):
    """Generate data, meta-train and ERM-train a DLRM, compare them on unseen users."""
    from gmeta_tf.demo import run_demo

    friendly_errors(run_demo)(config_path, out, overrides, tasks=tasks)
