"""``gmeta plan calibrate``: fit the PS cost model on real local PS processes (stub)."""
from __future__ import annotations

import click


@click.command("calibrate")
@click.option("--ps", "ps_count", type=int, default=1, show_default=True)
@click.option("--out", default=None)
def calibrate(ps_count: int, out):
    """Measure PS lookup+update cost over random table sets and fit the cost model."""
    raise click.ClickException("not implemented yet")
