"""``gmeta plan``: place embedding tables on PS tasks; writes ``placement.yaml`` for the trainer.

A group that also runs on its own (``invoke_without_command``) so ``gmeta plan calibrate`` can
live under it; the planning options are therefore checked here rather than by click's
``required``, which would demand them for ``calibrate`` too.
"""
from __future__ import annotations

import click

from gmeta_tf.cli.common import build_config, config_options, friendly_errors
from gmeta_tf.cli.plan_calibrate_cmd import calibrate
from gmeta_tf.config.schema import byte_size, wire_dtype_for


def parse_size(text: str) -> int:
    """``8GiB``, ``512MiB``, ``1.5GB``, ``1000000`` -> bytes (``config.schema.byte_size``)."""
    n = byte_size(text)
    if n is None:
        raise ValueError(f"{text!r} is not a size (e.g. 8GiB, 512MiB, 2GB, 1000000)")
    return n


class Size(click.ParamType):
    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _fmt_bytes(b: float) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div:
            return f"{b / div:,.1f} {unit}"
    return f"{int(b)} B"


def _shard_label(s) -> str:
    if s.kind == "table":
        return s.table
    return f"{s.table}[{'row' if s.kind == 'row' else 'col'} {s.index + 1}/{s.of}]"


def format_plan(plan) -> str:
    lines = [f"{'PS':>3}  {'memory':>10}  {'pred. ms':>9}  tables"]
    for p in range(plan.ps):
        names = ", ".join(_shard_label(s) for s in plan.shards[p]) or "-"
        lines.append(f"{p:>3}  {_fmt_bytes(plan.memory[p]):>10}  {plan.costs[p]:>9.3f}  {names}")
    lines.append(f"max predicted cost {plan.max_cost:.3f} ms/step ({plan.algo}); memory limit "
                 f"{_fmt_bytes(plan.mem_per_ps)} per PS incl. {plan.optimizer_slots} optimizer slot(s)")
    return "\n".join(lines)


def _link_rate(network, cfg):
    """The PS links' bit rate: ``--network`` (a launch profile), else ``cluster.link_rate``."""
    if network is None:
        return cfg.cluster.link_rate_bit_s
    from launch.network.profile import parse_profile

    return parse_profile(network).rate_bit_s


@click.group("plan", invoke_without_command=True)
@click.option("--data", "data_dir", type=click.Path(file_okay=False), help="Prepared directory (schema.json).")
@click.option("--ps", "ps_count", type=int, help="Number of parameter servers.")
@click.option("--mem-per-ps", type=Size(), default="8GiB", show_default=True,
              help="Memory per PS for tables and optimizer slots (8GiB, 512MiB, ...).")
@click.option("--algo", type=click.Choice(["planner", "random", "size-greedy", "dim-greedy", "lookup-greedy",
                                           "size-lookup-greedy"]), default="planner", show_default=True,
              help="Placement algorithm: the planner's search or a baseline (not meta.algo, the training objective).")
@click.option("--cost-model", "cost_model_path", default=None, help="Fitted cost model (default: the shipped one).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Workers that will train (samples per step reaching the PS scale with them).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), help="placement.yaml to write.")
@click.option("--network", default=None,
              help="Each PS host's link (a --network profile of `gmeta launch local`: 1gbe, rate=100mbit): each PS's "
                   "predicted cost adds its rows' bytes over the link rate (default: cluster.link_rate, else "
                   "loopback: bytes are free).")
@config_options
@click.pass_context
@friendly_errors
def plan_group(ctx, data_dir, ps_count, mem_per_ps, algo, cost_model_path, workers, seed, out, network, config_path,
               overrides):
    """Place embedding tables on PS tasks (table-, row- or column-wise) to minimise the slowest PS."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [o for o, v in (("--data", data_dir), ("--ps", ps_count), ("--out", out)) if v is None]
    if missing:
        raise click.UsageError(f"missing option(s) {', '.join(missing)}")
    from gmeta_tf.embedding.wire import Wire
    from gmeta_tf.plan.cost_model import load_cost_model
    from gmeta_tf.plan.network import with_network
    from gmeta_tf.plan.placement_file import write_placement
    from gmeta_tf.plan.planner import baseline_plans, make_plan, optimizer_slots_for, step_samples
    from gmeta_tf.plan.tables_from_data import tables_from_data

    cfg = build_config(config_path, overrides)
    tables = tables_from_data(data_dir, cfg)
    slots = optimizer_slots_for(cfg.train.embedding_optimizer)
    rate = _link_rate(network, cfg)
    model = with_network(load_cost_model(cost_model_path), rate, workers=workers, optimizer_slots=slots,
                         value_bytes=Wire(wire_dtype_for(cfg.cluster.wire_dtype, rate)).value_bytes)
    kw = dict(cost_model=model, samples_per_step=step_samples(cfg.data, workers), optimizer_slots=slots, seed=seed)
    plan = make_plan(tables, ps_count, mem_per_ps, algo, **kw)
    baselines = dict(plan.baselines) or {b: p.max_cost for b, p in baseline_plans(tables, ps_count, mem_per_ps,
                                                                                  **kw).items()}
    click.echo(format_plan(plan))
    if baselines:
        best = min(baselines, key=baselines.get)
        gain = 1 - plan.max_cost / baselines[best] if baselines[best] > 0 else 0.0
        click.echo(f"best baseline {best}: {baselines[best]:.3f} ms/step; {plan.algo} is {gain:.1%} lower")
    write_placement(out, plan.placement, header=(
        f"written by: gmeta plan --algo {plan.algo} --ps {ps_count} --mem-per-ps {mem_per_ps} (bytes) "
        f"--workers {workers} --seed {seed}" + (f" --network {network}" if network else "") + "\n"
        f"predicted max PS cost {plan.max_cost:.3f} ms/step; split tables: "
        + (", ".join(f"{n}={lay}" for n, lay in plan.layouts.items() if lay != "whole") or "none")))
    click.echo(f"wrote {out} (set cluster.placement: {out})")


plan_group.add_command(calibrate)
