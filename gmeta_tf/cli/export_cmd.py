"""``gmeta export``: a trained run → a SavedModel for stock TensorFlow (docs/export.md)."""
from __future__ import annotations

import click

from gmeta_tf.cli.common import friendly_errors


@click.command("export")
@click.option("--run", "run_dir", required=True, help="Run directory written by gmeta train.")
@click.option("--out", required=True, help="Directory to write the SavedModel to (created; must not exist "
                                          "or be empty, unless --overwrite).")
@click.option("--checkpoint", "which", default="best", show_default=True, metavar="best|latest|STEP",
              help="Which checkpoint: the best validation step (the latest if the run did not validate), "
                   "the latest, or a step number.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out once the new export is complete.")
@friendly_errors
def export_cmd(run_dir, out, which, overwrite):
    """Export a run's checkpoint as a SavedModel with stock TensorFlow ops only.

    Signatures: predict (samples -> score), adapt_and_predict (a new user's support samples with
    labels + query samples -> query scores after the trained inner loop), serving_default = predict.
    """
    from gmeta_tf.export.export_run import export_run

    manifest = export_run(run_dir, out, which, overwrite, log=click.echo)
    rows = sum(t["rows"] for t in manifest["tables"].values())
    click.echo(f"exported step {manifest['source']['step']} of {run_dir} to {out} "
               f"({len(manifest['tables'])} tables, {rows:,} rows; signatures predict, adapt_and_predict)")
