"""``gmeta demo`` / ``make demo``: the whole embedded slice on generated data, side by side.

The command line lives in ``cli/demo_cmd.py``; this is the library call it makes.

synth → prepare → train MAML → train ERM (same model, same samples, no inner loop) → evaluate
both on test users never seen in training → one table. Every step is the same library call the
individual commands make, so the demo is also a smoke test of the public path.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, Sequence

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import Config


def run_demo(config_path: str, out: str | Path, overrides: Sequence[str] = (), tasks: int = 10000,
             seed: int = 0, log: Callable[[str], None] = print) -> Dict[str, dict]:
    from gmeta_tf.data.prepare import format_summary as prep_summary
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import format_summary as synth_summary
    from gmeta_tf.data.synth import synth
    from gmeta_tf.evaluation.evaluate import evaluate, write_eval
    from gmeta_tf.evaluation.report import format_table
    from gmeta_tf.train.trained_run import load_trained
    from gmeta_tf.train.trainer import train

    out = Path(out)
    raw, prepared = out / "data" / "raw", out / "data" / "prepared"
    cfg: Config = load_config(config_path, [*overrides, f"data.path={prepared}"])
    t0 = time.perf_counter()
    log(synth_summary(synth(str(raw), tasks=tasks, seed=seed, kind="click", overwrite=True)))
    log(prep_summary(prepare([str(raw)], str(prepared), cfg.prepare, overwrite=True)))
    results = {}
    for algo in ("maml", "erm"):
        run_dir = out / algo
        shutil.rmtree(run_dir, ignore_errors=True)  # the demo always starts from scratch
        algo_cfg = load_config(config_path, [*overrides, f"data.path={prepared}", f"meta.algo={algo}"])
        log(f"--- training {algo} ({algo_cfg.train.steps} steps)")
        train(algo_cfg, run_dir, resume=False)
        run_cfg, model, _ = load_trained(run_dir)
        results[algo] = evaluate(model, run_cfg, algo)
        write_eval(run_dir, results[algo])
    log("")
    log("test users never seen in training (cold start): adapt on 16 support samples, score 16 query")
    log(format_table([results["maml"], results["erm"]]))
    gain = results["maml"].get("auc", float("nan")) - results["erm"].get("auc", float("nan"))
    log(f"MAML per-task AUC − ERM per-task AUC: {gain:+.4f}   ({time.perf_counter() - t0:.0f} s in all)")
    (out / "demo_summary.json").write_text(json.dumps(results, indent=1))
    return results
