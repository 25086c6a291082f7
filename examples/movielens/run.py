"""One command for the cross-validated MovieLens cold-start comparison: convert → prepare → train → eval.

The 610 users are dealt into 5 folds (``prepare.folds``). For each fold: that fold's users are
the test users, 61 users of the next fold the valid users, the rest train. MAML, first-order MAML
and ERM train with early stopping on the fold's valid users; ERM fine-tuned on the support set is
its own row, its fine-tuning chosen on the same valid users (separately for each support size).
Every model and baseline is then scored on the fold's test users with each user's last 5, 10, 20
and 50 support ratings (same query: its last 10 ratings). The test users of all folds are pooled
(every user is a test user exactly once) and every model is paired with every baseline over those
users, with a bootstrap interval (``gmeta_tf/evaluation/paired.py``).

    python examples/movielens/run.py --out runs/movielens [--json bench/quality.json]
    python examples/movielens/run.py --out runs/search --folds 0,1 --split valid --models fomaml \\
        --supports 10,50 --set meta.irls_steps=1      # a quick, valid-only look at a change

``make quality`` runs the first line and writes ``bench/quality.json`` and ``bench/quality.png``
(``plot.py``; ``--plot``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
import weakref
from pathlib import Path
from typing import Callable, Dict, List, Sequence

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "config.yaml"
sys.path.insert(0, str(HERE))

# (name in the table, algo, extra overrides for training)
MODELS = [
    ("maml", "maml", []),
    ("fomaml", "fomaml", []),
    ("erm", "erm", []),
    ("erm_finetune", "erm", ["train.best_metric=mae_finetune"]),
]
META_LEARNERS = ("maml", "fomaml")
BASELINES = ["global_mean", "item_mean", "item_mean_user_bias"]
# What each meta-learner is paired with: ERM as trained and fine-tuned, and every baseline.
REFERENCES = ["erm", "erm_finetune", *BASELINES]
METRICS = ["mae", "rmse", "p_at_5", "ndcg_at_5"]
FOLDS = 5
SUPPORTS = (5, 10, 20, 50)
# ERM fine-tuning settings tried on the valid split; the best is used on test: SGD on the top
# MLP (steps × learning rate), and the ridge fit of a per-user head (the MAML model's own
# adaptation, so the comparison isolates what meta-training adds), with or without the support
# recency weights the meta-learner uses (a fixed half-life here: ERM learns none), fitted by least
# squares or, like the meta-learner, by least absolute deviations (meta.support_loss).
FINETUNE_CANDIDATES = (
    [{"adapt": "top", "inner_solver": "sgd", "support_half_life": 0.0, "support_loss": "squared",
      "finetune_steps": s, "finetune_lr": lr}
     for s in (1, 3, 5, 10) for lr in (0.02, 0.05, 0.1, 0.2)]
    + [{"adapt": "head", "inner_solver": "newton", "ridge_lambda": lam, "support_half_life": h,
        "support_loss": loss, "finetune_steps": 1}
       for lam in (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0) for h in (0.0, 5.0) for loss in ("squared", "absolute")])

PROTOCOL = ("MovieLens latest-small (610 users, 100,836 ratings); a task is one user; 5-fold cross-validation "
            "over users: in each fold one fifth of the users are test users, 61 users of the next fold valid "
            "users, the rest train, so valid and test users are never seen in training (cold start); every "
            "user is a test user exactly once; each user's last 10 ratings by time are its query and its "
            "last n ratings before them its support (n = 5, 10, 20, 50); models adapt on the support and "
            "are scored on the query; every choice (steps via early stopping, ERM fine-tuning per n) is made "
            "on the fold's valid users; the numbers pool the test users of all folds, and every model-vs-"
            "baseline difference is paired over those users with a {confidence} bootstrap interval.")
# Keys this script sets itself for every fold: a --set of one of them would be silently replaced, so
# it is refused, naming the option that does set it.
OWNED_KEYS = {"data.path": "the prepared fold is written under --out",
              "prepare.fold": "--folds picks which folds run",
              "prepare.folds": f"the comparison is defined over {FOLDS} folds; --folds picks which of them run"}


def _apply(cfg, choice: Dict, model) -> None:
    """Set one fine-tuning choice on the ERM run's config and model. The ridge λ and the support
    half-life go into the model's own variables, as a meta-learned head holds them (absent
    half-life = unweighted fit), and are assigned, not baked into the graph: candidates that
    differ only in them share one compiled evaluation (``evaluate._prediction_fn``)."""
    import numpy as np

    from gmeta_tf.meta.inner_loop import RIDGE_PRIOR, SUPPORT_HALF_LIFE, add_ridge_prior, add_support_recency

    for key, value in choice.items():
        if key not in ("ridge_lambda", "support_half_life"):
            setattr(cfg.eval if key.startswith("finetune") else cfg.meta, key, value)
    cfg.meta.support_half_life = 0.0  # the config key only adds the variable at build time
    variables = model.dense_variables
    if "ridge_lambda" in choice:
        if RIDGE_PRIOR in variables:
            variables[RIDGE_PRIOR].assign(np.full(variables[RIDGE_PRIOR].shape, np.log(choice["ridge_lambda"]), np.float32))
        else:
            add_ridge_prior(model, choice["ridge_lambda"])
    h = choice.get("support_half_life")
    held = variables.pop(SUPPORT_HALF_LIFE, None) or _STASH.get(model)
    if h:
        if held is None:
            add_support_recency(model, h)
            held = variables[SUPPORT_HALF_LIFE]
        held.assign([np.log(h)])
        variables[SUPPORT_HALF_LIFE] = held  # the same variable object again: the same compiled graph
    if held is not None:
        _STASH[model] = held


_STASH = weakref.WeakKeyDictionary()  # model → its half-life variable, kept while a candidate fits without it


def _pick_finetune(model, cfg, support: int, log) -> Dict:
    """ERM's fine-tuning at ``support`` ratings per user, chosen on the fold's valid users."""
    from gmeta_tf.evaluation.evaluate import evaluate

    cfg.data.support = support
    scored = []
    for i, choice in enumerate(FINETUNE_CANDIDATES):
        _apply(cfg, choice, model)
        scored.append((evaluate(model, cfg, "erm", "valid", with_baselines=False)["mae_finetune"], i))
    value, best = min(scored)
    log(f"  ERM fine-tuning at support <= {support}, chosen on valid: {FINETUNE_CANDIDATES[best]} "
        f"(valid mae {value:.4f})")
    return {**FINETUNE_CANDIDATES[best], "valid_mae": value}


def fold_overrides(overrides: Sequence[str], prepared: Path, fold: int) -> List[str]:
    """The config overrides of one fold: the user's ``--set`` plus the keys this script owns
    (``OWNED_KEYS``); a ``ConfigError`` naming the key when the user sets one of those."""
    from gmeta_tf.config.schema import ConfigError

    for o in overrides:
        key = o.split("=", 1)[0].strip()
        if key in OWNED_KEYS:
            raise ConfigError(f"--set {o}: run.py sets {key} itself ({OWNED_KEYS[key]})")
    return [*overrides, f"data.path={prepared.resolve()}", f"prepare.folds={FOLDS}", f"prepare.fold={fold}"]


def bootstrap(overrides: Sequence[str] = ()):
    """The paired intervals' settings: ``eval.bootstrap_*`` of the example's config (and ``--set``)."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.evaluation.paired import Bootstrap

    return Bootstrap.from_eval(load_config(str(CONFIG), list(overrides)).eval)


def protocol(boot) -> str:
    """``PROTOCOL`` with the interval's confidence level."""
    return PROTOCOL.format(confidence=f"{boot.confidence:.0%}")


def pick_models(names: str | None):
    """The ``MODELS`` rows named in ``--models`` (comma-separated; all when ``None``), in table
    order; a ``ConfigError`` naming an unknown one and the known names."""
    from gmeta_tf.config.schema import ConfigError

    if names is None:
        return list(MODELS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = [m[0] for m in MODELS]
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise ConfigError(f"--models {names}: unknown model {', '.join(unknown) or '(none named)'}; "
                          f"choose from {', '.join(known)}")
    return [m for m in MODELS if m[0] in wanted]


def run_fold(out: Path, raw: Path, fold: int, overrides: Sequence[str] = (), *, models=MODELS,
             supports=SUPPORTS, split: str = "test", log: Callable[[str], None] = print) -> Dict:
    """Prepare fold ``fold`` of the converted ratings ``raw``, train ``models``, score ``split``'s
    users at each support size.

    Returns ``{"scores": {n: TaskScores}, "info": {...}}``: every model's and baseline's per-user
    parts on the fold's users (scorer names as in the table)."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.evaluation.evaluate import evaluate_tasks
    from gmeta_tf.train.runtime import Runtime
    from gmeta_tf.train.trained_run import load_trained
    from gmeta_tf.train.trainer import train

    t0 = time.perf_counter()
    prepared = out / "data" / "prepared"
    base = fold_overrides(overrides, prepared, fold)
    cfg = load_config(str(CONFIG), base)
    summary = prepare([str(raw)], str(prepared), cfg.prepare, overwrite=True)
    info: Dict = {"fold": fold, **{f"{k}_users": v["tasks"] for k, v in summary["splits"].items()}, "models": {}}
    scores: Dict[int, object] = {}
    for name, algo, extra in models:
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        run_cfg = load_config(str(CONFIG), [*base, f"meta.algo={algo}", *extra])
        with open(run_dir / "train.log", "w") as fh:  # the per-step lines; the terminal gets one per model
            result = train(run_cfg, run_dir, Runtime(log=lambda m: print(m, file=fh, flush=True)), resume=False)
        cfg_run, model, _ = load_trained(run_dir)  # the best validation step
        best = result.get("best") or {}
        info["models"][name] = {"best_step": best.get("step"), "valid_mae": best.get("value")}
        log(f"  fold {fold} {name}: best valid MAE {best.get('value', float('nan')):.4f} at step {best.get('step')}")
        for n in supports:
            if name == "erm_finetune":
                choice = _pick_finetune(model, cfg_run, n, log)
                _apply(cfg_run, {k: v for k, v in choice.items() if k != "valid_mae"}, model)
                info["models"][name].setdefault("finetune_choice", {})[n] = choice
            cfg_run.data.support = n
            _, tasks = evaluate_tasks(model, cfg_run, algo, split, with_baselines=n not in scores)
            scorer = "erm_finetune" if name == "erm_finetune" else algo
            own = scores[n].aligned(tasks) if n in scores else tasks
            if n not in scores:  # the first model's pass brings the baselines
                scores[n] = dataclasses.replace(tasks, scorers={s: p for s, p in tasks.scorers.items()
                                                                if tasks.roles[s] == "baseline"})
            scores[n].scorers[name] = own.scorers[scorer]
            if name in META_LEARNERS:
                scores[n].scorers[f"{name}_no_adapt"] = own.scorers[f"{algo}_no_adapt"]
    for s in scores.values():
        s.setup = {"split": split, "query": s.setup["query"], "support": s.setup["support"]}
    info["seconds"] = round(time.perf_counter() - t0, 1)
    return {"scores": scores, "info": info}


def summarize(pooled: Dict[int, object], boot, names: Sequence[str]) -> Dict:
    """``by_support``: per support size, every scorer's pooled metrics and the paired differences
    of each meta-learner against each reference (and against itself before adapting)."""
    from gmeta_tf.evaluation import paired

    out: Dict = {}
    for n, scores in pooled.items():
        row: Dict = {name: {m: scores.metric(name, m) for m in METRICS} for name in names if name in scores.scorers}
        comparisons: Dict = {}
        for a in (a for a in META_LEARNERS if a in scores.scorers):
            refs = [b for b in [*REFERENCES, f"{a}_no_adapt"] if b in scores.scorers]
            comparisons.update(paired.report(scores, [a], refs, boot, metrics=METRICS)["comparisons"])
        row["paired"] = comparisons
        out[str(n)] = row
    return out


# What ``bench/quality.png`` draws (``plot.py``): the shipped meta-learner and these, per metric.
PLOTTED = ["erm_finetune", "item_mean_user_bias", "item_mean"]
PLOT_METRICS = ["mae", "ndcg_at_5"]


def bands(pooled: Dict[int, object], boot, learner: str | None) -> Dict:
    """``{metric: {n: {best, best_value, rows: {name: {diff, ci_low, ci_high}}}}}``: at each support
    size, the best of ``PLOTTED`` (the baselines, ERM fine-tuned among them) and every plotted
    scorer's paired difference from it, with its interval (0 for the best itself)."""
    from gmeta_tf.config.schema import metric_direction
    from gmeta_tf.evaluation import paired

    out: Dict = {}
    for metric in PLOT_METRICS:
        per_n: Dict = {}
        for n, scores in pooled.items():
            names = [m for m in [learner, *PLOTTED] if m and m in scores.scorers]
            refs = [b for b in PLOTTED if b in scores.scorers]
            if not refs:
                continue
            sign = metric_direction(metric) or -1  # +1: higher is better
            best = max(refs, key=lambda b: sign * scores.metric(b, metric))
            rows = {}
            for name in names:
                if name == best:
                    rows[name] = {"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0}
                else:
                    d = paired.compare(scores, name, best, boot, [metric])[metric]
                    rows[name] = {k: d[k] for k in ("diff", "ci_low", "ci_high")}
            per_n[str(n)] = {"best": best, "best_value": scores.metric(best, metric), "rows": rows}
        out[metric] = per_n
    return out


def targets(by_support: Dict, learner: str) -> Dict:
    """The issue's targets, read off ``by_support`` for the shipped meta-learner: MAE at least 3%
    below the better (on these users) of ERM fine-tuned and item mean + user bias at support <= 50
    and <= 10, the paired interval below 0; nDCG@5 at least item mean's + 0.01, interval above 0."""
    out = {}
    for n in ("50", "10"):
        row = by_support.get(n)
        if not row or learner not in row or "erm_finetune" not in row:
            continue
        ref = min(("erm_finetune", "item_mean_user_bias"), key=lambda b: row[b]["mae"])
        d = row["paired"][f"{learner}_vs_{ref}"]["mae"]
        gain = 1.0 - row[learner]["mae"] / row[ref]["mae"]
        out[f"mae_support_{n}"] = {"reference": ref, "gain": gain, "ci": [d["ci_low"], d["ci_high"]],
                                   "met": gain >= 0.03 and d["ci_high"] < 0}
    for n in ("50", "10"):
        row = by_support.get(n)
        if not row or learner not in row:
            continue
        d = row["paired"][f"{learner}_vs_item_mean"]["ndcg_at_5"]
        out[f"ndcg_support_{n}"] = {"diff": d["diff"], "ci": [d["ci_low"], d["ci_high"]],
                                    "met": d["diff"] >= 0.01 and d["ci_low"] > 0}
    return out


def run(out: Path, overrides: Sequence[str] = (), *, folds: Sequence[int] = tuple(range(FOLDS)),
        models=MODELS, supports=SUPPORTS, split: str = "test", log: Callable[[str], None] = print) -> Dict:
    from convert import convert
    from tqdm import tqdm

    from gmeta_tf.evaluation.per_task import concat

    fold_overrides(overrides, Path(out), 0)  # refused before the conversion, not after a fold's training
    boot = bootstrap(overrides)
    t0 = time.perf_counter()
    out = Path(out)
    raw = out / "data" / "raw"
    convert(out=raw)
    results = []
    bar = tqdm(folds, desc="folds", unit="fold", file=sys.stderr, mininterval=0)
    for fold in bar:
        r = run_fold(out / f"fold-{fold}", raw, fold, overrides, models=models, supports=supports, split=split,
                     log=bar.write)
        results.append(r)
        first = [n for n, _, _ in models][0]
        top = r["scores"][max(supports)]
        bar.write(f"fold {fold} done in {r['info']['seconds']:.0f} s: {split} users {len(top.task_ids)}, "
                  + ", ".join(f"{s} {top.metric(s, 'mae'):.4f}" for s in (first, "item_mean_user_bias"))
                  + f" (MAE at support <= {max(supports)})")
    pooled = {n: concat([r["scores"][n] for r in results]) for n in supports}
    for n, scores in pooled.items():  # every user's numbers, for paired comparisons between runs
        (out / f"{split}-support-{n}.parquet").write_bytes(scores.to_parquet())
    names = [n for n, _, _ in models] + [f"{m}_no_adapt" for m in META_LEARNERS] + BASELINES
    by_support = summarize(pooled, boot, names)
    infos = [r["info"] for r in results]
    learners = [m for m in META_LEARNERS if m in by_support[str(max(supports))]]
    valid = {m: sum(i["models"][m]["valid_mae"] * i["valid_users"] for i in infos)
             / sum(i["valid_users"] for i in infos) for m in learners}
    learner = min(valid, key=valid.get) if valid else None  # chosen on the valid users, pooled over folds
    report = {"protocol": protocol(boot), "split": split, "folds": len(folds), "fold_ids": list(folds),
              "users": len(pooled[max(supports)].task_ids), "supports": list(supports),
              "bootstrap": boot.to_json(), "meta_learner": learner, "valid_mae": valid,
              "by_support": by_support, "per_fold": infos,
              "seconds": round(time.perf_counter() - t0, 1)}
    if learner:
        report["targets"] = targets(by_support, learner)
    report["bands"] = bands(pooled, boot, learner)
    log("")
    log(format_quality(report))
    return report


def format_quality(report: Dict) -> str:
    """One table per support size: the pooled metrics, then the meta-learner's paired differences."""
    out = [f"{report['split']} users: {report['users']} over {report['folds']} folds; "
           f"intervals: {report['bootstrap']['method']}, {report['bootstrap']['resamples']} resamples"]
    learner = report.get("meta_learner")
    for n, row in report["by_support"].items():
        lines = [["model", *METRICS]]
        for name, vals in row.items():
            if name != "paired":
                lines.append([name, *(f"{vals[m]:.4f}" for m in METRICS)])
        widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
        out.append(f"\nsupport <= {n} ratings")
        out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines)
        for name, comp in row["paired"].items():
            if learner and name.startswith(f"{learner}_vs_"):
                cells = [f"{m} {d['diff']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] {d['verdict']}"
                         for m, d in comp.items() if m in ("mae", "ndcg_at_5")]
                out.append(f"  {name}: " + "; ".join(cells))
    for key, t in (report.get("targets") or {}).items():
        what = (f"gain {t['gain']:+.1%} vs {t['reference']}" if "gain" in t else f"diff {t['diff']:+.4f} vs item_mean")
        out.append(f"target {key}: {what}, interval [{t['ci'][0]:+.4f}, {t['ci'][1]:+.4f}]: "
                   f"{'met' if t['met'] else 'not met'}")
    return "\n".join(out)


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/movielens", type=Path)
    p.add_argument("--json", default=None, type=Path, help="also write the comparison here (bench/quality.json)")
    p.add_argument("--plot", default=None, type=Path,
                   help="also draw MAE and nDCG@5 against the support size here (bench/quality.png)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--folds", default=None, metavar="0,1",
                   help=f"run only these of the {FOLDS} folds (a quick look; the headline runs all)")
    p.add_argument("--split", default="test", choices=["test", "valid"],
                   help="score the folds' valid users instead of the test users (for choosing a change)")
    p.add_argument("--models", default=None, metavar="fomaml,erm_finetune", help="train only these rows")
    p.add_argument("--supports", default=None, metavar="10,50", help="support sizes to score (default 5,10,20,50)")
    a = p.parse_args(argv)
    from gmeta_tf.config.schema import ConfigError

    folds = [int(x) for x in a.folds.split(",")] if a.folds else list(range(FOLDS))
    supports = tuple(int(x) for x in a.supports.split(",")) if a.supports else SUPPORTS
    try:
        models = pick_models(a.models)
        fold_overrides(a.overrides, a.out, 0)
        bootstrap(a.overrides)
    except ConfigError as e:  # before converting or training anything
        p.error(str(e))
    report = run(a.out, a.overrides, folds=folds, models=models, supports=supports, split=a.split)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}")
    if a.plot:
        from plot import draw

        draw(report, a.plot)
        print(f"wrote {a.plot}")


if __name__ == "__main__":
    main()
