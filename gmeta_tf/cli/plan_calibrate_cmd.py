"""``gmeta plan calibrate``: fit the PS cost model on real local PS processes.

The shipped default (``gmeta_tf/resources/ps_cost_model.json``) was calibrated on the
project's 2-core machine kind; on another cluster, re-calibrate on a PS host and pass the file
to ``gmeta plan --cost-model``.
"""
from __future__ import annotations

import click

from gmeta_tf.cli.common import friendly_errors


@click.command("calibrate")
@click.option("--ps", "ps_count", type=click.IntRange(min=1), default=1, show_default=True,
              help="Local PS processes to measure on, one after another (the table sets are split among them).")
@click.option("--out", default=None, type=click.Path(dir_okay=False),
              help="Model file to write (default: the package's shipped default model).")
@click.option("--quick", is_flag=True, help="A few tiny table sets (~30 s): checks the path, not a usable model.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--network", default=None, metavar="PROFILE",
              help="Run the PS and the client on two emulated hosts joined by this profile's links "
                   "(as 'gmeta launch local --network': rate=100mbit, a named profile). Needs root or CAP_NET_ADMIN.")
@friendly_errors
def calibrate(ps_count: int, out, quick: bool, seed: int, network):
    """Measure PS lookup+update cost over random table sets and fit the cost model."""
    from gmeta_tf.calibration.calibrate import calibrate as run_calibration
    from gmeta_tf.plan.cost_model import DEFAULT_MODEL, load_cost_model, save_model

    if network is not None:
        from launch.network.netns import require_privilege
        from launch.network.profile import parse_profile

        parse_profile(network)  # a bad profile is named before anything starts
        require_privilege()
    doc = run_calibration(ps_count, quick=quick, seed=seed, log=click.echo, network=network)
    path = out or str(DEFAULT_MODEL)
    save_model(doc, path)
    model = load_cost_model(path)  # proves the file loads
    by_algo = ", ".join(f"{a} {e:.1%}" for a, e in doc["held_out_error_by_algo"].items())
    click.echo(f"cost model: {model.algo} on {len(doc['rows'])} measured table sets "
               f"({doc['calibration']['seconds']:.0f} s); held-out error {model.error:.1%} "
               f"(geometric mean; {by_algo})")
    click.echo(f"wrote {path}")
