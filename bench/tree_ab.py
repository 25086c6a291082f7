"""``bench.distributed``'s 2 workers + 2 PS job, the default path, in two checkouts side by side.

``python -m bench.tree_ab OLD_TREE NEW_TREE [--steps N] [--rounds R]``: a target such as "no
slower than before issue N" is a comparison between two trees, which separate runs on this
shared box cannot answer (one run's tasks/s moves by a quarter with other load). Make the old
tree with ``git worktree add --detach ../wt-old COMMIT``. Rounds alternate the trees; each tree
runs its own code, config and bench data (its ``bench.data.prepared_data``: the same synthetic
seed), with this interpreter. Prints each run and the medians as JSON."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List

from gmeta_tf import exit_codes

_RUN = r'''
import json, sys
import bench.distributed as bd
from bench.data import WORK, prepared_data
from launch.supervisor import launch_local
bd.STEPS = int(sys.argv[2])
data, _ = prepared_data()
out = WORK / ("tree-ab-" + sys.argv[1])
launch_local(2, 2, bd._train_argv(data, out, 16), log=lambda m: None, timeout_s=900)
print("RESULT " + json.dumps(bd._aggregate(out)))
'''


def run_tree(tree: str, tag: str, steps: int) -> float:
    """One 2w2ps job in ``tree``: its aggregate tasks/s."""
    p = subprocess.run([sys.executable, "-c", _RUN, tag, str(steps)], cwd=tree, env=dict(os.environ, PYTHONPATH=tree),
                       capture_output=True, text=True, timeout=1500)
    got = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode or not got:
        raise RuntimeError(f"{tree}: the 2w2ps job failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return float(json.loads(got[0][7:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args(argv)
    runs: Dict[str, List[float]] = {"old": [], "new": []}
    for r in range(a.rounds):
        for name, tree in (("old", a.old), ("new", a.new)):
            runs[name].append(run_tree(tree, f"{name}-{r}", a.steps))
            print(f"round {r} {name}: {runs[name][-1]:.1f} tasks/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({"runs": runs, "median": med, "new_over_old": med["new"] / med["old"],
                      "by_round": [n / o for n, o in zip(runs["new"], runs["old"])]}))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
