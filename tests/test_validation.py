"""Validation while training: the best step is kept, early stopping stops, eval uses the best.

The early-stopping run uses a learning rate ten times the quickstart's on the 2,500-user
synthetic set, so the valid split's AUC peaks early and then falls: the run must stop exactly
``patience`` validations after its best step, and ``gmeta eval`` must score the best step's
weights (the valid AUC it recomputes equals the logged best to float precision).
"""
import json

import pytest
from click.testing import CliRunner

from gmeta_tf.cli.main import cli
from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.evaluation.evaluate import evaluate
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.trained_run import load_trained
from gmeta_tf.train.trainer import train
from gmeta_tf.train.validation import BestTracker

EVAL_EVERY, PATIENCE = 10, 2


def test_tracker_counts_validations_since_the_best():
    t = BestTracker(metric="mae", patience=2)
    assert t.update(10, 0.9) and t.update(20, 0.8)
    assert not t.update(30, 0.85) and not t.should_stop
    assert not t.update(40, float("nan")) and t.should_stop  # NaN is never a best
    assert (t.best_step, t.best_value) == (20, 0.8)
    auc = BestTracker(metric="auc_finetune", patience=1)
    assert auc.update(5, 0.6) and auc.update(10, 0.7) and not auc.update(15, 0.65)
    assert auc.should_stop and auc.summary() == {"step": 10, "metric": "auc_finetune", "value": 0.7}
    again = BestTracker.from_state(t.state(), "mae", 2)
    assert (again.best_step, again.since_best, again.should_stop) == (20, 2, True)
    assert BestTracker.from_state(t.state(), "rmse", 2).best_value is None  # another metric: afresh


@pytest.mark.parametrize("bad", ["train.best_metric=accuracy", "train.eval_every=-1"])
def test_bad_validation_keys_name_the_key(bad):
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        load_config("configs/quickstart.yaml", [bad])
    with pytest.raises(ConfigError, match="train.early_stop_patience"):
        load_config("configs/quickstart.yaml", ["train.early_stop_patience=3"])  # needs eval_every


@pytest.mark.parametrize("metric, named", [("mae", "mae is a metric of rating data"),
                                           ("auc_finetune", "reported for ERM runs")])
def test_a_metric_validation_cannot_report_fails_before_training(prepared_2500, tmp_path, metric, named):
    """Clicks have no MAE and a MAML run no fine-tuned AUC: the key is named before any step,
    and the run directory is not created."""
    cfg = load_config("configs/quickstart.yaml", [f"data.path={prepared_2500}", "train.eval_every=5",
                                                  f"train.best_metric={metric}"])
    with pytest.raises(ConfigError, match=f"train.best_metric.*{named}"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def stopped(prepared_2500, tmp_path_factory):
    run = tmp_path_factory.mktemp("early") / "run"
    cfg = load_config("configs/quickstart.yaml", [
        f"data.path={prepared_2500}", "train.steps=400", "train.learning_rate=0.03",
        "train.embedding_learning_rate=0.1", f"train.eval_every={EVAL_EVERY}",
        f"train.early_stop_patience={PATIENCE}", "train.checkpoint_every=1000", "eval.max_tasks=200"])
    seen = []
    summary = train(cfg, run, on_validation=lambda step, m: seen.append((step, m["auc"])))
    return cfg, run, summary, seen


@pytest.mark.integration
def test_early_stopping_stops_and_keeps_the_best_step(stopped):
    cfg, run, summary, seen = stopped
    best = summary["best"]
    assert summary["stopped_early"] and summary["last_step"] < cfg.train.steps, summary["last_step"]
    assert best["metric"] == "auc"
    assert summary["last_step"] == best["step"] + PATIENCE * EVAL_EVERY
    values = dict(seen)
    assert [s for s, _ in seen] == list(range(EVAL_EVERY, summary["last_step"] + 1, EVAL_EVERY))
    assert values[best["step"]] == best["value"] == max(values.values())
    assert all(v <= best["value"] for s, v in seen if s > best["step"])
    # The run kept both: the best step's checkpoint and the one it stopped at.
    ckpt_dir = run / "checkpoints"
    assert json.loads((ckpt_dir / "best").read_text())["step"] == best["step"]
    assert (ckpt_dir / "latest").read_text().strip() == f"ckpt-{summary['last_step']:08d}"


@pytest.mark.integration
def test_eval_uses_the_best_checkpoint(stopped):
    cfg, run, summary, _ = stopped
    run_cfg, model, ckpt = load_trained(run)
    assert int(ckpt.step.numpy()) == summary["best"]["step"]
    assert evaluate(model, run_cfg, "maml", "valid")["auc"] == pytest.approx(summary["best"]["value"], abs=1e-6)
    r = CliRunner().invoke(cli, ["eval", "--run", str(run), "--checkpoint", "latest", "--split", "valid"])
    assert r.exit_code == 0, r.output
    assert json.loads((run / "eval.json").read_text())["checkpoint"] == {"step": summary["last_step"], "which": "latest"}
    r = CliRunner().invoke(cli, ["eval", "--run", str(run), "--checkpoint", "7"])
    assert r.exit_code == 2 and "no complete checkpoint for step 7" in r.output


@pytest.mark.integration
def test_resuming_a_stopped_run_trains_nothing_more(stopped):
    cfg, run, summary, _ = stopped
    again = train(cfg, run)
    assert again["start_step"] == again["last_step"] == summary["last_step"]
    assert again["best"] == summary["best"]


@pytest.mark.integration
def test_pruning_keeps_the_best_checkpoint(stopped):
    cfg, run, summary, _ = stopped
    _, model, ckpt = load_trained(run)
    keep = CheckpointManager(run / "checkpoints", model, *_optimizers(cfg), keep=1)
    keep.save(summary["last_step"] + 1)
    names = sorted(p.name for p in (run / "checkpoints").glob("ckpt-*"))
    assert names == [f"ckpt-{summary['best']['step']:08d}", f"ckpt-{summary['last_step'] + 1:08d}"]


def _optimizers(cfg):
    from gmeta_tf.meta.optimizers import make_optimizers

    return make_optimizers(cfg.train)


@pytest.mark.integration
def test_two_workers_and_two_ps_stop_early_at_the_same_step(prepared_2500, tmp_path):
    """Rank 0 validates against the PS tables; every rank learns the verdict by broadcast, so
    all ranks leave the loop after the same step and no rank waits forever at a barrier."""
    import uuid

    from cluster_helpers import LAUNCH_ID_ENV, processes_with_env, rank_summaries, run_gmeta

    launch_id = uuid.uuid4().hex
    run = tmp_path / "dist"
    args = ["launch", "local", "--workers", "2", "--ps", "2", "--timeout", "600",
            "--config", "configs/quickstart.yaml", "--data", str(prepared_2500), "--out", str(run),
            "--steps", "400"]
    for s in ("data.tasks_per_batch=16", "train.learning_rate=0.03", "train.embedding_learning_rate=0.1",
              f"train.eval_every={EVAL_EVERY}", "train.early_stop_patience=1", "train.checkpoint_every=1000",
              "eval.max_tasks=150"):
        args += ["--set", s]
    r = run_gmeta(args, timeout=700, env={LAUNCH_ID_ENV: launch_id})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert processes_with_env(LAUNCH_ID_ENV, launch_id) == []
    ranks = rank_summaries(run)
    summary = json.loads((run / "train_summary.json").read_text())
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["stopped_early"] and ranks[1]["stopped_early"]
    assert ranks[0]["last_step"] == ranks[1]["last_step"] == summary["best"]["step"] + EVAL_EVERY < 400
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]
    assert "early stop at step" in r.stdout


@pytest.mark.integration
def test_a_damaged_best_checkpoint_falls_back_to_the_newest_intact(stopped, tmp_path):
    import shutil

    cfg, run, summary, _ = stopped
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    best_dir = copy / "checkpoints" / f"ckpt-{summary['best']['step']:08d}"
    table = sorted((best_dir / "tables").glob("*.npz"))[0]
    table.write_bytes(table.read_bytes()[:20])
    logs = []
    from gmeta_tf.train.checkpoint import CheckpointManager as Manager

    _, model, _ = load_trained(run)  # a model of the same shape to restore into
    manager = Manager(copy / "checkpoints", model, *_optimizers(cfg), log=logs.append)
    step = manager.restore_which("best")
    newest = max(int(p.name[5:]) for p in (copy / "checkpoints").glob("ckpt-*"))
    assert step == newest != summary["best"]["step"]
    assert any("best checkpoint" in line and table.name in line for line in logs), logs
    with pytest.raises(Exception, match=table.name):
        manager.restore_which(str(summary["best"]["step"]))
