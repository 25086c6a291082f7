"""The quality guard of ``make bench`` (section ``wire_quality``, issue 41 item 5): does a bf16
wire or a stale hot tier cost validation quality?

``cluster.wire_dtype: bfloat16`` and ``model.hot_sync_every: 4`` change the math, and only where
there is a wire (two or more workers and PS), so every run here is ``gmeta launch local --workers 2
--ps 2``. For each dataset the same data, seed and steps train five runs:

* ``exact``: fp32 on the wire, the hot tier (``hot.budget`` 2MiB) synced every step;
* ``bf16``: ``exact`` + ``cluster.wire_dtype=bfloat16``;
* ``stale``: ``exact`` with ``model.hot_sync_every=4``;
* ``lean``: both;
* ``exact_repeat``: ``exact`` again. Two workers need not be bit-deterministic run to run (the
  sparse updates reach the PS in whatever order the ranks send them), so exact against exact is
  the floor of run-to-run noise (on this box it has come out bit-identical: 0);
* ``exact_seed1``: ``exact`` with seed 1 for the model, the data order and the training draws:
  how far another seed alone moves the metric, the yardstick an option's difference is read
  against (it is not what the rule reads: the interval over users is).

Each run's last checkpoint is scored on the **validation users only** with the project's
evaluation (``evaluate_tasks``: adapt on each user's support, score its query), and each option
is paired with ``exact`` over the same users (``paired.paired_difference``: a seeded percentile
bootstrap over users, 95%). The issue's rule: an option may become a default only where its
interval contains 0 or favours it (verdict ``better`` or ``can't tell``); otherwise it stays
opt-in and ``diff`` says what it costs.

Datasets: the bench's synthetic click data (``bench.data.prepared_data``, quickstart config,
MAML, AUC) and MovieLens fold 0 (the example's config and fold preparation, FOMAML, MAE at the
config's support of 50; its early stopping is off here: every run trains the same fixed steps).
Validation users: the synthetic set's 300 and fold 0's 61.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Mapping, Sequence

from gmeta_tf.evaluation.paired import BETTER, CANT_TELL, Bootstrap, paired_difference
from gmeta_tf.evaluation.per_task import TaskScores

REPO = Path(__file__).resolve().parents[1]
MOVIELENS = REPO / "examples" / "movielens"
SPLIT = "valid"
BUDGET = "2MiB"  # as bench/hot_split.py: the hot tier holds the head, a cold tail stays on the PS
# What each run adds to the dataset's own settings; ``exact`` twice (its repeat: the noise floor).
F32 = "cluster.wire_dtype=float32"
OPTIONS: Dict[str, List[str]] = {
    "exact": [],
    "bf16": ["cluster.wire_dtype=bfloat16"],
    "stale": ["model.hot_sync_every=4"],
    "int8": ["cluster.dense_compression=int8"],
    "lean": ["cluster.wire_dtype=bfloat16", "model.hot_sync_every=4", "cluster.dense_compression=int8"],
}
COMPARED = ("bf16", "stale", "int8", "lean")
REPEAT = "exact_repeat"
SEED = "exact_seed1"
FLOORS = {REPEAT: [], SEED: ["model.seed=1", "data.seed=1", "train.seed=1"]}  # rows without a verdict
TIMEOUT_S = 240


@dataclass(frozen=True)
class Dataset:
    """One dataset of the guard: how it is trained and which metric is read."""

    name: str
    config: str
    algo: str
    metric: str
    steps: int
    sets: List[str] = field(default_factory=list)


# Step counts (global batch 2 x 16 = 32 tasks, as the quickstart and the example train in one
# process): 200 on the synthetic set, as bench/hot_split.py; 150 on MovieLens, where the example's
# early stopping on fold 0's valid users stopped FOMAML (step 140, bench/quality.json). On a
# 2-core box a run is ~27 s of start-up (four TF processes), ~15 s of steps and ~7 s of scoring:
# one dataset's six runs take ~5 min, the section ~10 (GMETA_BENCH_WIRE_QUALITY runs one).
DATASETS = (
    Dataset("synthetic", "configs/quickstart.yaml", "maml", "auc", 200,
            ["data.tasks_per_batch=16"]),
    # hot.min_count=2: the example reads every movie id as the one rare row (data.min_id_count),
    # an id the raw-id profile does not hold; with every profiled movie id hot the table would be
    # served wholly by hot rows and that row would be refused. Movies seen once stay cold, so the
    # rare row lives on the PS (as a cold row), the hot tier holds the year and genre rows.
    Dataset("movielens", str(MOVIELENS / "config.yaml"), "fomaml", "mae", 150,
            ["data.tasks_per_batch=16", "train.eval_every=0", "train.early_stop_patience=0", "hot.min_count=2"]),
)


# ``smoke`` (bench/run.py --smoke): the synthetic set (MovieLens needs its download), ``exact``,
# one option and one floor (every kind of row the summary writes), a few steps each; the option
# and the floor are ``exact``'s own run and scores: the same summary code, two jobs fewer
# (``bf16`` differs from ``exact`` by the wire dtype only, and the bfloat16 wire is today's
# default, which the smoke's other jobs run)
SMOKE_DATASETS, SMOKE_RUNS, SMOKE_STEPS = ("synthetic",), ("exact", "bf16", REPEAT), 6
# workers, PS of every run; the smoke's on 1 + 1 (still a wire: the PS's), half the processes
HOSTS, SMOKE_HOSTS = (2, 2), (1, 1)


def may_default(verdict: str) -> bool:
    """The issue's rule: a default changes only where the interval contains 0 or favours the option."""
    return verdict in (BETTER, CANT_TELL)


def summarize(metric: str, scorer: str, scores: Mapping[str, TaskScores], boot: Bootstrap) -> Dict[str, Dict]:
    """Each of ``COMPARED`` (and ``FLOORS``) present in ``scores`` against ``exact``: the
    paired difference (option − exact) of ``metric`` for ``scorer`` over the same users, its
    interval, the verdict, whether the rule lets it become a default, and both pooled values."""
    exact = scores["exact"]
    out: Dict[str, Dict] = {"exact": {"value": exact.metric(scorer, metric), "users": len(exact.task_ids)}}
    for name in (*COMPARED, *FLOORS):
        if name not in scores:
            continue
        other = exact.aligned(scores[name])  # the same users in the same order, or ValueError
        d = paired_difference(metric, other.scorers[scorer][metric], exact.scorers[scorer][metric], boot)
        row = {"value": other.metric(scorer, metric), "diff": d["diff"], "low": d["ci_low"], "high": d["ci_high"]}
        if name not in FLOORS:
            row.update(verdict=d["verdict"], may_default=may_default(d["verdict"]))
        out[name] = row
    return out


def format_table(results: Mapping[str, Dict], datasets: Sequence[Dataset] = DATASETS) -> str:
    """The validation table of docs/network.md, one row per dataset and option."""
    lines = ["| dataset (metric) | option | value | option − exact | 95% interval | verdict | may default |",
             "|---|---|---|---|---|---|---|"]
    for ds in datasets:
        res = results.get(ds.name)
        if not res:
            continue
        lines.append(f"| {ds.name} ({ds.metric}, {res['exact']['users']} users) | exact | "
                     f"{res['exact']['value']:.4f} | | | | |")
        for name in (*COMPARED, *FLOORS):
            r = res.get(name)
            if r is None:
                continue
            verdict = r.get("verdict", "(yardstick)")
            default = "" if name in FLOORS else ("yes" if r["may_default"] else "no")
            lines.append(f"| | {name} | {r['value']:.4f} | {r['diff']:+.4f} | [{r['low']:+.4f}, {r['high']:+.4f}] | "
                         f"{verdict} | {default} |")
    return "\n".join(lines)


def _prepare_movielens(work: Path) -> str:
    """Fold 0 of the example, prepared as ``examples/movielens/run.py`` prepares it."""
    sys.path.insert(0, str(MOVIELENS))
    from convert import convert
    from run import fold_overrides

    from gmeta_tf.config.loader import load_config
    from gmeta_tf.data.prepare import prepare

    raw = convert(out=work / "movielens" / "raw")
    prepared = work / "movielens" / "prepared"
    cfg = load_config(str(MOVIELENS / "config.yaml"), fold_overrides([], prepared, 0))
    prepare([str(raw)], str(prepared), cfg.prepare, overwrite=True)
    return str(prepared)


def _with_profile(prepared: str) -> str:
    """The id profile the hot tier is chosen from, written where ``hot.profile`` looks by default."""
    from gmeta_tf.data.id_profile import profile_ids, write_profile

    write_profile(Path(prepared), profile_ids(prepared), {"sample": 1.0})
    return prepared


def _train(ds: Dataset, data: str, out: Path, sets: Sequence[str], hosts=HOSTS) -> float:
    """One ``gmeta launch local`` run, ``hosts`` (2 workers + 2 PS); its wall seconds."""
    args = [sys.executable, "-m", "gmeta_tf.cli.main", "launch", "local", "--workers", str(hosts[0]),
            "--ps", str(hosts[1]),
            "--timeout", str(TIMEOUT_S), "--config", ds.config, "--data", data, "--out", str(out), "--no-resume",
            "--steps", str(ds.steps)]
    for s in [*ds.sets, f"meta.algo={ds.algo}", f"train.checkpoint_every={ds.steps}", f"train.log_every={ds.steps}",
              f"hot.budget={BUDGET}", "model.hot_sync_every=1", *sets]:
        args += ["--set", s]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S + 60,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if r.returncode != 0:
        raise RuntimeError(f"{out.name}: gmeta launch local failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def _score(ds: Dataset, run: Path) -> TaskScores:
    """The run's last checkpoint on the validation users (no baselines: only the model is compared)."""
    from gmeta_tf.evaluation.evaluate import evaluate_tasks
    from gmeta_tf.train.trained_run import load_trained

    cfg, model, _ = load_trained(run, checkpoint="latest")
    return evaluate_tasks(model, cfg, ds.algo, SPLIT, with_baselines=False)[1]


def run_sets(name: str) -> List[str]:
    """What run ``name`` (an option or a floor) sets on top of ``exact``'s settings. ``exact`` is
    float32 on the wire whatever the default (bfloat16 since issue 41): it is what the options
    are measured against."""
    return [F32, *(OPTIONS[name] if name in OPTIONS else FLOORS[name])]


def pick(names: str | None) -> List[Dataset]:
    """The ``DATASETS`` named in ``names`` (comma-separated, e.g. ``GMETA_BENCH_WIRE_QUALITY``;
    all when empty); a ``ValueError`` naming an unknown one."""
    wanted = [n.strip() for n in (names or "").split(",") if n.strip()]
    unknown = [n for n in wanted if n not in {d.name for d in DATASETS}]
    if unknown:
        raise ValueError(f"unknown wire_quality dataset(s) {', '.join(unknown)}; known: "
                         f"{', '.join(d.name for d in DATASETS)}")
    return [d for d in DATASETS if not wanted or d.name in wanted]


def measure(work: Path, datasets: Sequence[Dataset] = DATASETS, log=print, smoke: bool = False) -> Dict:
    from bench.data import prepared_data

    boot = Bootstrap()  # 2000 resamples, 95%, seed 0: a rerun prints the same intervals
    hosts = SMOKE_HOSTS if smoke else HOSTS
    results: Dict = {"split": SPLIT, "bootstrap": boot.to_json(), "hot_budget": BUDGET, "workers": hosts[0],
                     "ps": hosts[1]}
    if smoke:
        datasets = [replace(d, steps=SMOKE_STEPS) for d in datasets if d.name in SMOKE_DATASETS]
    for ds in datasets:
        data = _with_profile(prepared_data(smoke=smoke)[0] if ds.name == "synthetic" else _prepare_movielens(work))
        scores: Dict[str, TaskScores] = {}
        seconds: Dict[str, float] = {}
        for name in SMOKE_RUNS if smoke else ("exact", *COMPARED, *FLOORS):
            run = work / "wire_quality" / ds.name / name
            if smoke and name != "exact":  # exact's run and scores (the scoring ran on it once)
                seconds[name], scores[name] = seconds["exact"], scores["exact"]
            else:
                seconds[name] = round(_train(ds, data, run, run_sets(name), hosts), 1)
                scores[name] = _score(ds, run)
            log(f"  wire_quality {ds.name} {name}: {ds.metric} {scores[name].metric(ds.algo, ds.metric):.4f} "
                f"({seconds[name]:.0f} s)")
        results[ds.name] = {**summarize(ds.metric, ds.algo, scores, boot), "metric": ds.metric, "algo": ds.algo,
                            "steps": ds.steps, "train_seconds": seconds}
    log(format_table(results, datasets))
    return results
