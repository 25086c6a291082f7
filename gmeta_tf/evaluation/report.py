"""Side-by-side tables of ``eval.json`` results (plain text: no plotting dependency needed)."""
from __future__ import annotations

from typing import Dict, List

RANKING_ROWS = ["p_at_5", "p_at_5_no_adapt", "p_at_5_finetune", "ndcg_at_5", "ndcg_at_5_no_adapt",
                "ndcg_at_5_finetune"]
CLICK_ROWS = ["tasks", "auc", "auc_no_adapt", "auc_finetune", "auc_pooled", "auc_pooled_no_adapt",
              "logloss", "logloss_no_adapt", "logloss_finetune", *RANKING_ROWS]
RATING_ROWS = ["tasks", "mae", "mae_no_adapt", "mae_finetune", "rmse", "rmse_no_adapt", "rmse_finetune",
               *RANKING_ROWS]


def _baseline_columns(results: List[Dict]) -> List[Dict]:
    """One column per baseline, shaped like a result (its metrics plus the scored users).

    Results on the same split share their baselines (same users, same training statistics),
    so they are shown once, not once per model.
    """
    columns, seen = [], set()
    for r in results:
        for name, scores in (r.get("baselines") or {}).items():
            if (name, r["split"], r.get("tasks")) not in seen:
                seen.add((name, r["split"], r.get("tasks")))
                columns.append({"algo": name, "split": r["split"], "tasks": r.get("tasks"), **scores})
    return columns


def format_table(results: List[Dict]) -> str:
    """Models side by side, then the baselines scored on the same users (``-`` = not defined)."""
    rows = CLICK_ROWS if any("auc" in r for r in results) else RATING_ROWS
    results = list(results) + _baseline_columns(results)
    header = ["metric"] + [f"{r['algo']} ({r['split']})" for r in results]
    lines = [header]
    for key in rows:
        if not any(key in r for r in results):
            continue
        vals = []
        for r in results:
            v = r.get(key)
            vals.append("-" if v is None else (f"{v:d}" if isinstance(v, int) else f"{v:.4f}"))
        lines.append([key, *vals])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)


def format_paired(paired: Dict) -> str:
    """``eval.json``'s ``paired`` section as one table: a row per comparison and metric with the
    difference, its interval and the verdict (``better`` / ``worse`` / ``can't tell``)."""
    lines = [["comparison", "metric", "diff", f"{paired['confidence']:.0%} interval", "verdict"]]
    for name, metrics in paired["comparisons"].items():
        for m, r in metrics.items():
            lines.append([name, m, f"{r['diff']:+.4f}", f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]", r["verdict"]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    head = (f"paired differences (model - other) over {paired['users']} users: {paired['method']}, "
            f"{paired['resamples']} resamples, seed {paired['seed']}")
    return head + "\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
