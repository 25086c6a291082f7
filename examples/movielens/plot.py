"""``bench/quality.png``: MAE and nDCG@5 against the support size, each line with its paired band.

Why a band against the best baseline rather than each line's own interval: the users are shared,
so two lines' own intervals overlap even where every user's difference has one sign. Each line is
drawn at the best baseline's value plus its paired difference, its band at the best baseline plus
the difference's interval (``report["bands"]``, ``run.bands``): where a band stays clear of the best
baseline's line, the difference is real over these users; where it crosses it, it cannot be told.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict

LABELS = {"maml": "MAML", "fomaml": "first-order MAML", "erm_finetune": "ERM fine-tuned",
          "item_mean_user_bias": "item mean + user bias", "item_mean": "item mean"}
TITLES = {"mae": "MAE (lower is better)", "ndcg_at_5": "nDCG@5 (higher is better)"}


def draw(report: Dict, path: Path) -> None:
    """Two panels (MAE, nDCG@5) of ``report["bands"]`` written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: make quality runs headless
    import matplotlib.pyplot as plt

    bands = report["bands"]
    fig, axes = plt.subplots(1, len(bands), figsize=(5.5 * len(bands), 4.2))
    for ax, (metric, per_n) in zip(axes, bands.items()):
        ns = sorted(int(n) for n in per_n)
        names = list(per_n[str(ns[0])]["rows"])
        for name in names:
            rows = [per_n[str(n)]["rows"][name] for n in ns]
            base = [per_n[str(n)]["best_value"] for n in ns]
            line = ax.plot(ns, [b + r["diff"] for b, r in zip(base, rows)], marker="o", label=LABELS.get(name, name))
            ax.fill_between(ns, [b + r["ci_low"] for b, r in zip(base, rows)],
                            [b + r["ci_high"] for b, r in zip(base, rows)], color=line[0].get_color(), alpha=0.15)
        ax.set_xscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("support size (a user's last n ratings)")
        ax.set_title(TITLES.get(metric, metric))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    conf = report["bootstrap"].get("confidence", 0.95)
    fig.suptitle(f"MovieLens cold start, {report['users']} {report['split']} users; bands: {conf:.0%} paired "
                 "interval against the best baseline at each n", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
