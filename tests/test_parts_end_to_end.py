"""Three machines prepare one log (``prepare --part I/3``), ``gmeta data combine`` joins them, and
the result trains and evaluates to the same numbers as the one-machine output (``--part 0/1``).

Why end to end: the parts' files adding up (tests/test_prepare_out_of_core.py) and the combined
statistics equalling one prepare's (tests/test_combine.py) are each checked on their own; what a
user relies on is that ``gmeta train`` and ``gmeta eval`` cannot tell the two data sets apart.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gmeta_tf.cli.main import cli

PARTS, SHARDS = 3, 6
PREP = ["--config", "configs/quickstart.yaml", "--shards", str(SHARDS)]
TRAIN = ["--set", "train.log_every=10", "--set", "train.checkpoint_every=20", "--set", "data.tasks_per_batch=8"]


def _ok(runner: CliRunner, args):
    r = runner.invoke(cli, [str(a) for a in args])
    assert r.exit_code == 0, (args, r.output)
    return r


def _train_eval(runner: CliRunner, data: Path, run: Path) -> dict:
    _ok(runner, ["train", "--config", "configs/quickstart.yaml", "--data", data, "--out", run, "--steps", "20", *TRAIN])
    _ok(runner, ["eval", "--run", run, "--set", "eval.max_tasks=60"])
    return {"train": json.loads((run / "train_summary.json").read_text())["history"],
            "eval": json.loads((run / "eval.json").read_text())}


@pytest.mark.integration  # prepares four times, trains and evaluates twice
def test_three_parts_train_and_evaluate_as_one_machine(tmp_path):
    runner = CliRunner()
    raw = tmp_path / "raw"
    _ok(runner, ["data", "synth", "--out", raw, "--tasks", "600", "--seed", "5"])
    one = tmp_path / "one"
    _ok(runner, ["data", "prepare", "-i", raw, "--out", one, "--part", "0/1", *PREP])
    parts = [tmp_path / f"part-{i}" for i in range(PARTS)]
    for i, p in enumerate(parts):
        _ok(runner, ["data", "prepare", "-i", raw, "--out", p, "--part", f"{i}/{PARTS}", *PREP])
    combined = tmp_path / "combined"
    _ok(runner, ["data", "combine", *reversed(parts), "--out", combined])

    # The same shard files, byte for byte.
    files = sorted(str(f.relative_to(one)) for f in one.rglob("*.parquet"))
    assert files and files == sorted(str(f.relative_to(combined)) for f in combined.rglob("*.parquet"))
    for f in files:
        assert (one / f).read_bytes() == (combined / f).read_bytes(), f

    a = _train_eval(runner, one, tmp_path / "run-one")
    b = _train_eval(runner, combined, tmp_path / "run-combined")
    assert [h["step"] for h in a["train"]] == [10, 20]
    assert [h["loss"] for h in a["train"]] == pytest.approx([h["loss"] for h in b["train"]], rel=1e-6)
    for key in ("tasks", "query_samples", "auc", "auc_pooled", "logloss", "auc_no_adapt", "p_at_5", "ndcg_at_5"):
        assert a["eval"][key] == pytest.approx(b["eval"][key], rel=1e-6, abs=1e-9), key
    assert a["eval"]["tasks"] == 60
