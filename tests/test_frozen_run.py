"""``gmeta eval`` scores with the frozen model (``export/frozen_run.py``): the numbers are the
trainer's model's, to the last bit, and the checkpoint is picked as before.

Why it matters: the frozen model holds each table's rows once (no TFRA table pre-sized for every
id of the data, no optimizer slot tables), which halved the model's memory at 100M rows; a
scoring path that changed a single prediction would change what every report says.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gmeta_tf.errors import CheckpointError

SETS = ["data.tasks_per_batch=8", "data.support=8", "data.query=6", "train.log_every=2",
        "train.checkpoint_every=2", "train.eval_every=0"]


def _train(data, out, *extra):
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli

    r = CliRunner().invoke(cli, ["train", "--config", "configs/quickstart.yaml", "--data", str(data),
                                 "--out", str(out), "--steps", "4", "--no-resume"]
                           + [a for kv in [*SETS, *extra] for a in ("--set", kv)])
    assert r.exit_code == 0, r.output


@pytest.mark.integration
@pytest.mark.parametrize("kind,algo", [("click", "maml"), ("rating", "maml"), ("click", "erm")])
def test_frozen_model_scores_exactly_as_the_trained_model(kind, algo, prepared_kinds, tmp_path):
    """Every prediction before and after adapting (or fine-tuning, ERM) equal bit for bit, so
    every number of the result (metrics, baselines, ranking) equal."""
    from gmeta_tf.evaluation import evaluate as ev
    from gmeta_tf.export.frozen_run import pick_run
    from gmeta_tf.train.trained_run import load_trained

    _train(prepared_kinds[kind], tmp_path / "run", f"meta.algo={algo}")
    cfg, trained, _ = load_trained(tmp_path / "run")
    run = pick_run(str(tmp_path / "run"))
    frozen = run.model()
    assert run.step == 4
    want, got = ev.query_scores(trained, cfg), ev.query_scores(frozen, run.cfg)
    assert got["task_ids"] == want["task_ids"] and len(got["task_ids"]) > 10
    for key in ("labels", "before", "after"):
        assert all(np.array_equal(a, b) for a, b in zip(got[key], want[key])), key
    assert not all(np.array_equal(a, b) for a, b in zip(got["before"], got["after"]))  # it adapted
    assert ev.evaluate(frozen, run.cfg, algo) == ev.evaluate(trained, cfg, algo)


@pytest.mark.integration
def test_eval_falls_back_past_a_damaged_checkpoint_and_export_refuses_it(prepared_kinds, tmp_path):
    """The newest checkpoint damaged: eval's pick (as ``load_trained`` picks) takes the one
    before, saying so; export's (strict) names the damaged file."""
    from gmeta_tf.export.frozen_run import pick_run

    _train(prepared_kinds["click"], tmp_path / "run")
    newest = tmp_path / "run" / "checkpoints" / "ckpt-00000004"
    table = next((newest / "tables").glob("*.npz"))
    table.write_bytes(table.read_bytes()[:-7])
    said = []
    run = pick_run(str(tmp_path / "run"), "latest", log=said.append)
    assert run.step == 2 and run.checkpoint.endswith("ckpt-00000002")
    assert any("damaged" in line for line in said)
    with pytest.raises(CheckpointError, match=table.name):
        pick_run(str(tmp_path / "run"), "latest", action="export", strict=True)
    with pytest.raises(CheckpointError, match="no complete checkpoint for step 6"):
        pick_run(str(tmp_path / "run"), "6")
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        pick_run(str(tmp_path / "run"))
    with pytest.raises(CheckpointError, match="not a run directory"):
        pick_run(str(tmp_path / "nothing"))
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())  # the run itself untouched
