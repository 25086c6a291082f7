"""``gmeta tune``: search config keys with Optuna on the valid split; write the best config."""
from __future__ import annotations

import click

from gmeta_tf import exit_codes
from gmeta_tf.cli.common import config_options, friendly_errors


@click.command("tune")
@config_options
@click.option("--data", default=None, help="Prepared data directory (sets data.path).")
@click.option("--space", "space_path", required=True, type=click.Path(dir_okay=False),
              help="YAML search space: 'space: {meta.inner_lr: {low: 0.01, high: 1, log: true}, "
                   "meta.adapt: {choices: [top, dense]}}' and an optional 'metric'.")
@click.option("--trials", type=int, required=True, help="Trials in the study (a resumed study counts those it has).")
@click.option("--out", required=True, help="Output directory: study.db, trials/, trials.json, best.yaml.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the TPE sampler.")
@click.option("--timeout", type=float, default=None, metavar="SEC",
              help="Start no new trial after SEC seconds.")
@friendly_errors
def tune(config_path, overrides, data, space_path, trials, out, seed, timeout):
    """Tune any config keys on the valid split with Optuna (seeded TPE, median pruning).

    Each trial trains embedded (one process, local tables; trials run one after another in this
    process) into OUT/trials/trial-NNN, validating every train.eval_every steps (must be > 0);
    train.early_stop_patience applies within a trial. A trial is worth its best validation
    value of the metric (the space's 'metric', else train.best_metric); a trial whose values
    fall behind the median of earlier trials is pruned. OUT/best.yaml is the full config of the
    best trial: train it with 'gmeta train --config OUT/best.yaml'. Re-running with the same
    OUT resumes the study (OUT/study.db).
    """
    from gmeta_tf.tune.run import TuneRequest, format_trials
    from gmeta_tf.tune.run import tune as run_tune
    from gmeta_tf.tune.space import config_builder, load_space

    space = load_space(space_path)
    build = config_builder(config_path, [*overrides, *([f"data.path={data}"] if data else [])])
    req = TuneRequest(build=build, space=space, out=out, trials=trials, seed=seed, timeout=timeout)
    result = run_tune(req, log=lambda m: click.echo(m))
    click.echo(format_trials(result, [p.key for p in space.params]))
    if result.best is None:
        click.echo(f"no trial completed; see {out}/trials.json", err=True)
        raise SystemExit(exit_codes.FAILED.code)
    click.echo(f"best: trial {result.best['number']}, valid {result.metric} {result.best['value']:.4f} "
               f"at step {result.best['best_step']}; wrote {result.best_config} "
               f"(train it: gmeta train --config {result.best_config} --out RUN_DIR)")
