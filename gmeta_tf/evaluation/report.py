"""Side-by-side tables of ``eval.json`` results (plain text: no plotting dependency needed)."""
from __future__ import annotations

from typing import Dict, List

CLICK_ROWS = ["tasks", "auc", "auc_no_adapt", "auc_finetune", "auc_pooled", "auc_pooled_no_adapt",
              "logloss", "logloss_no_adapt", "logloss_finetune"]
RATING_ROWS = ["tasks", "mae", "mae_no_adapt", "mae_finetune", "rmse", "rmse_no_adapt", "rmse_finetune"]


def format_table(results: List[Dict]) -> str:
    rows = CLICK_ROWS if any("auc" in r for r in results) else RATING_ROWS
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
