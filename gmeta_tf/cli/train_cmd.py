"""``gmeta train`` and ``gmeta eval``."""
from __future__ import annotations

import importlib
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import click

from gmeta_tf.cli.common import build_config, config_options, friendly_errors


def train_options(f=None, *, with_ps: bool = True):
    """The options of ``gmeta train``; ``gmeta launch local`` reuses them (minus ``--ps``,
    which there is the number of PS processes to start)."""
    if f is None:
        return lambda g: train_options(g, with_ps=with_ps)
    f = click.option("--steps", type=int, default=None, help="Sets train.steps.")(f)
    f = click.option("--algo", type=click.Choice(["maml", "fomaml", "erm"]), default=None,
                     help="Sets meta.algo.")(f)
    f = click.option("--out", "run_dir", default="runs/default", show_default=True,
                     help="Run directory: checkpoints, TensorBoard, config.yaml. A path or a URI (gs://, s3://).")(f)
    f = click.option("--data", default=None, help="Prepared data directory (sets data.path).")(f)
    f = click.option("--resume/--no-resume", default=True, show_default=True,
                     help="Continue from the run directory's latest checkpoint, if any.")(f)
    f = click.option("--warm-start", "warm_start", default=None, metavar="RUN[@best|latest|STEP]|CHECKPOINT",
                     help="Start a new run from another run's checkpoint (dense weights, optimizer state, "
                          "tables and slots), e.g. yesterday's model on today's data. Default checkpoint: "
                          "the source's best. Ignored when --out already has checkpoints (it resumes).")(f)
    if with_ps:
        f = click.option("--ps", default=None, metavar="HOST:PORT,...",
                         help="Addresses of running parameter servers (sets cluster.ps; default: the config, or TF_CONFIG). "
                              "Elsewhere (launch local, k8s render, plan) --ps is a count.")(f)
    return config_options(f)


def train_config(config_path, overrides, data, algo, steps, ps=None):
    extra = {"data.path": data, "meta.algo": algo, "train.steps": steps}
    if ps:
        extra["cluster.ps"] = "[" + ",".join(ps.split(",")) + "]"
    return build_config(config_path, overrides, extra)


def run_training(cfg, run_dir, resume, warm_start=None):
    """Embedded (one process, local tables) or worker mode (Horovod rank + PS), same ``train``.
    The rank's status record and stop handling start before Horovod and the PS connections
    (``train/rank_life.py``): a stop during start-up is acted on at the first step."""
    from gmeta_tf.cluster.worker import is_distributed, worker_runtime
    from gmeta_tf.train.rank_life import rank_life
    from gmeta_tf.train.trainer import train as run_train

    with rank_life(cfg, run_dir, log=lambda m: click.echo(m)) as watch:
        rt = (worker_runtime(cfg, log=lambda m: click.echo(m), status_dir=watch.status.directory)
              if is_distributed(cfg) else None)
        return run_train(cfg, run_dir, rt, resume=resume, warm_start=warm_start), rt


@click.command()
@train_options
@friendly_errors
def train(config_path, overrides, data, run_dir, algo, steps, resume, warm_start, ps):
    """Meta-train (or ERM-train) a DLRM.

    With no PS configured: the embedded default (local tables, one process). Under horovodrun
    or with --ps: a worker of the hybrid trainer (dense all-reduce, tables on the PS).
    """
    cfg = train_config(config_path, overrides, data, algo, steps, ps)
    summary, rt = run_training(cfg, run_dir, resume, warm_start)
    if rt is None or rt.rank == 0:
        agg = f", {summary['aggregate_tasks_per_s']:,.0f} tasks/s over {summary['ranks']} ranks" if summary["ranks"] > 1 else ""
        best = summary.get("best")
        stop = " (stopped early)" if summary.get("stopped_early") else ""
        click.echo(f"trained {cfg.meta.algo} to step {summary['last_step']}{stop} "
                   f"({summary['tasks_per_s']:,.0f} tasks/s{agg}); run directory {run_dir}")
        if best:
            click.echo(f"best valid {best['metric']} {best['value']:.4f} at step {best['step']} "
                       f"(the checkpoint gmeta eval uses)")


def split_tasks(schema: dict, split: str, max_tasks: int = 0) -> Optional[int]:
    """How many users ``gmeta eval`` will score: the split's tasks in ``schema.json``
    (``splits.<split>.tasks``), capped by ``eval.max_tasks``; None when the schema does not say."""
    total = (((schema or {}).get("splits") or {}).get(split) or {}).get("tasks")
    if total is None:
        return max_tasks or None
    return min(int(total), max_tasks) if max_tasks else int(total)


@contextmanager
def users_progress(total: Optional[int], desc: str, stream=None) -> Iterator[Callable[[int], None]]:
    """A tqdm line on stderr counting users scored against ``total``: live on a terminal; when
    stderr is not one (a log file, a pod's log), no carriage-return updates but one final line
    with the same count and rate, so a log still says how many users were scored how fast."""
    from tqdm import tqdm

    stream = stream if stream is not None else sys.stderr
    live = bool(getattr(stream, "isatty", lambda: False)())
    bar = tqdm(total=total, desc=desc, unit=" users", file=stream, disable=not live, mininterval=0.5)
    scored = 0
    start = time.monotonic()

    def step(users: int) -> None:
        nonlocal scored
        scored += users
        bar.update(users)

    yield step
    bar.close()
    if not live:
        print(tqdm.format_meter(scored, total, time.monotonic() - start, prefix=desc, unit=" users"),
              file=stream, flush=True)


@click.command("eval")
@click.option("--run", "run_dir", required=True, help="Run directory written by gmeta train.")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default=None,
              help="Split to evaluate (default eval.split, i.e. test).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a key of the run's config (e.g. eval.adapt_steps=3).")
@click.option("--checkpoint", "which", default="best", show_default=True, metavar="best|latest|STEP",
              help="Which checkpoint: the best validation step (the latest if the run did not validate), "
                   "the latest, or a step number.")
@click.option("--compare", "compare_runs", multiple=True, metavar="RUN",
              help="Also pair this run's users with another run's (its eval_tasks.parquet, written by its own "
                   "gmeta eval on the same split): the per-user difference with a bootstrap interval at "
                   "eval.bootstrap_confidence (default 0.95). Repeatable.")
@friendly_errors
def eval_cmd(run_dir, split, overrides, which, compare_runs):
    """Adapt to each unseen task on its support set, score its query set.

    Next to the table: every metric's paired difference against each baseline (and each --compare
    run) over the same users, with a bootstrap interval and a verdict: better, worse or can't tell.
    """
    from gmeta_tf import heap
    from gmeta_tf.evaluation.evaluate import evaluate_tasks, write_eval
    from gmeta_tf.evaluation.per_task import load_for_comparison
    from gmeta_tf.evaluation.report import format_paired, format_table
    from gmeta_tf.export.frozen_run import pick_run
    from gmeta_tf.train.run_files import data_record

    heap.large_buffers_from_kernel()  # freed batches leave the process (heap.py: −140 MiB at 270k users)
    # the frozen model (static tables, no optimizer slots): scoring only reads rows (frozen_run.py)
    run = pick_run(run_dir, which, overrides)
    cfg, model = run.cfg, run.model()
    scored = split or cfg.eval.split
    total = split_tasks(run.schema, scored, cfg.eval.max_tasks)
    # SciPy (the paired bootstrap, after scoring) takes ~1.5 s to import: it loads while the
    # model scores, which leaves the GIL to it inside every TensorFlow call.
    scipy_loader = threading.Thread(target=importlib.import_module, args=("gmeta_tf.evaluation.paired",),
                                    name="import-scipy", daemon=True)
    scipy_loader.start()
    with users_progress(total, f"eval {scored}") as progress:
        result, tasks = evaluate_tasks(model, cfg, cfg.meta.algo, split, progress=progress)
    scipy_loader.join()
    from gmeta_tf.evaluation import paired
    result["checkpoint"] = {"step": run.step, "which": which}
    # which data was scored, and with which checkpoint
    result["data"] = {**data_record(cfg.data.path, run.schema), "checkpoint": run.checkpoint}
    # all read (and refused) before anything is written
    others = {other_run: load_for_comparison(other_run, tasks) for other_run in compare_runs}
    result["paired"] = paired.eval_report(tasks, paired.Bootstrap.from_eval(cfg.eval), others)
    path = write_eval(run_dir, result, tasks)
    click.echo(format_table([result]))
    click.echo(format_paired(result["paired"]))
    click.echo(f"wrote {path}")
