"""``gmeta data synth`` and ``gmeta data prepare``.

``prepare``'s options are shortcuts for ``--set prepare.<key>=...``: they are turned into
overrides and go through the one config loader, so the YAML ``prepare:`` section, ``--set`` and
these flags share one schema, one validation and one error format (flags win over the file).
Values are JSON-encoded before being handed over, so a column named ``yes`` or ``123`` stays a
string instead of being read as a YAML bool/int.
"""
from __future__ import annotations

import json

import click

from gmeta_tf.cli.common import build_config, config_options, friendly_errors


@click.group()
def data():
    """Make synthetic data and prepare sample-level tables for meta-learning."""


@data.command("synth")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--tasks", default=3000, show_default=True, type=click.IntRange(min=1), help="Number of users (tasks).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--kind", default="click", show_default=True, type=click.Choice(["click", "rating"]))
@click.option("--zipf", default=1.15, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Zipf exponent of item popularity.")
@click.option("--day", default=0, show_default=True, type=click.IntRange(min=0),
              help="A later day of the same world (same seed): TASKS new users after every earlier day's events, "
                   "some item ids no earlier day had (for gmeta train --warm-start).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@friendly_errors
def synth_cmd(out, tasks, seed, kind, zipf, day, overwrite):
    """Write synthetic sample-level Parquet + columns.json to OUT (streamed: memory does not grow with
    the rows; a progress line on stderr when it is a terminal)."""
    from gmeta_tf.data.synth import format_summary, synth

    click.echo(format_summary(synth(out, tasks=tasks, seed=seed, kind=kind, zipf=zipf, overwrite=overwrite, day=day,
                                    progress=True)))


def _csv_list(value):
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


_PREPARE_OPTIONS = [
    # (click option, config key, click type, is comma list)
    ("--task-col", "task_col", str, False),
    ("--label-col", "label_col", str, False),
    ("--label-kind", "label_kind", click.Choice(["click", "rating"]), False),
    ("--categorical", "categorical", str, True),
    ("--multi-hot", "multi_hot", str, True),
    ("--dense", "dense", str, True),
    ("--time-col", "time_col", str, False),
    ("--query", "query", int, False),
    ("--max-support", "max_support", int, False),
    ("--min-task-size", "min_task_size", int, False),
    ("--max-task-size", "max_task_size", int, False),
    ("--split-by", "split_by", click.Choice(["time", "random"]), False),
    ("--valid-frac", "valid_frac", float, False),
    ("--test-frac", "test_frac", float, False),
    ("--seed", "seed", int, False),
    ("--shards", "shards", int, False),
    ("--rows-per-group", "rows_per_group", int, False),
    ("--on-bad-rows", "on_bad_rows", click.Choice(["error", "skip"]), False),
    # I/N: only the shards s with s % N == I, tasks assigned by a hash of (task id, seed), so N
    # machines prepare one log and their outputs add up (gmeta_tf/data/parts.py)
    ("--part", "part", str, False),
]


def _prepare_options(f):
    for opt, key, typ, is_list in reversed(_PREPARE_OPTIONS):
        help_ = f"prepare.{key}" + (" (comma-separated)" if is_list else "")
        f = click.option(opt, key, type=typ, default=None, help=help_)(f)
    return f


@data.command("prepare")
@click.option("--input", "-i", "inputs", multiple=True, required=True, type=click.Path(),
              help="Parquet/CSV file or directory (repeatable).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--overwrite", is_flag=True, help="Replace OUT (only once the new one is complete).")
@click.option("--profile", "run_profile", is_flag=True,
              help="Also write the id frequency profile (as 'gmeta data profile OUT').")
@_prepare_options
@config_options
@friendly_errors
def prepare_cmd(inputs, out, overwrite, config_path, overrides, run_profile=False, **opts):
    """Turn sample-level tables into task-major support/query shards (Meta-IO format)."""
    from gmeta_tf.data.prepare import format_summary, prepare

    list_keys = {key for _, key, _, is_list in _PREPARE_OPTIONS if is_list}
    extra = {}
    for key, value in opts.items():
        if value is None:
            continue
        if key in list_keys:
            value = _csv_list(value)
        extra[f"prepare.{key}"] = json.dumps(value)
    cfg = build_config(config_path, overrides, extra)
    click.echo(format_summary(prepare(list(inputs), out, cfg.prepare, overwrite=overwrite, progress=True)))
    if run_profile:
        _profile(out, 1.0, 1 << 16, 1 << 17, cfg)


@data.command("stats")
@click.argument("data_dir", type=click.Path(file_okay=False))
@config_options
@friendly_errors
def stats_cmd(data_dir, config_path, overrides):
    """(Re)compute the per-table statistics the sharding planner uses; store them in schema.json."""
    from gmeta_tf.data.table_stats import update_schema
    from gmeta_tf.plan.spec import SKEW_EDGES

    cfg = build_config(config_path, overrides)
    table = update_schema(data_dir)
    once, hot = SKEW_EDGES.index(1.0), SKEW_EDGES.index(8.0) + 1
    click.echo(f"{'table':<20} {'rows':>12} {'dim':>5} {'pooling':>8} {'lookups':>12} {'used once':>10} {'used >8x':>9}")
    for name, st in table.items():
        skew = st["skew"]
        click.echo(f"{name:<20} {st['rows']:>12,} {cfg.model.embedding_dim:>5} {st['pooling']:>8.2f} "
                   f"{st['lookups']:>12,} {skew[once]:>10.1%} {sum(skew[hot:]):>9.1%}")
    click.echo(f"updated {data_dir}/schema.json (table_stats, train split)")


@data.command("profile")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.option("--sample", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Fraction of the train split's tasks to count (seeded).")
@click.option("--exact-max-ids", default=1 << 16, show_default=True, type=click.IntRange(min=1),
              help="Tables with more distinct ids than this are counted with a count-min sketch + heap.")
@click.option("--top-k", default=1 << 17, show_default=True, type=click.IntRange(min=1),
              help="Top ids recorded per table (the candidates for the hot set).")
@config_options
@friendly_errors
def profile_cmd(directory, sample, exact_max_ids, top_k, config_path, overrides):
    """Count embedding-id frequencies of a prepared DIRECTORY's train split (hot/cold split input).

    Writes DIRECTORY/id_profile.npz and id_profile.json; with --config/--set hot.budget=...
    also prints the rows and lookup coverage that budget buys.
    """
    _profile(directory, sample, exact_max_ids, top_k, build_config(config_path, overrides))


def _profile(directory, sample, exact_max_ids, top_k, cfg):
    from gmeta_tf.data.id_profile import format_profile, profile_ids, write_profile
    from gmeta_tf.embedding.hot.select import select_hot

    profiles = profile_ids(directory, sample=sample, exact_max_ids=exact_max_ids, top_k=top_k)
    path = write_profile(directory, profiles, {"sample": sample, "exact_max_ids": exact_max_ids, "top_k": top_k})
    click.echo(format_profile(profiles))
    if cfg.hot.budget_bytes:
        from gmeta_tf.data.task_format import load_schema
        from gmeta_tf.metaio.rare_ids import pooled_profiles

        # The file keeps the raw ids; the hot set is chosen over the ids training reads
        # (data.min_id_count pools rare ones, see hot/rows.hot_profiles).
        seen = pooled_profiles(profiles, directory, load_schema(directory), cfg.data.min_id_count)
        dims = {t: cfg.model.embedding_dim for t in seen}
        click.echo(select_hot(seen, dims, cfg.train.embedding_optimizer, cfg.hot.budget_bytes,
                              cfg.hot.min_count).format())
    click.echo(f"wrote {path}")


@data.command("combine")
@click.argument("part_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory (one prepared data set).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@friendly_errors
def combine_cmd(part_dirs, out, overwrite):
    """Combine the PART_DIRS of 'gmeta data prepare --part I/N' (all N of them) into OUT.

    Shard files are hard-linked (copied across filesystems); schema.json's statistics are
    combined (see gmeta_tf/data/combine.py for how each one is).
    """
    from gmeta_tf.data.combine import combine, format_summary

    click.echo(format_summary(combine(list(part_dirs), out, overwrite=overwrite)))
