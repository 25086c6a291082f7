"""``gmeta tune``: the Optuna study on planted objectives, the strict space file, one real tune.

The planted objectives have a known answer, so the search is checked on values: the minimum of
(log10 x - log10 0.03)^2 over [1e-3, 1] must be found within a factor 1.5 in 30 seeded trials,
and trials that report bad values while running must be pruned (and good ones not).
"""
import json
import math
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.main import cli
from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.tune.space import SpaceError, config_builder, load_space, parse_space, validate_against_config
from gmeta_tf.tune.study import StudyMismatchError, make_pruner, open_study, run_study, trial_records

TARGET = 0.03


def _lr_space():
    return parse_space({"space": {"meta.inner_lr": {"low": 1e-3, "high": 1.0, "log": True}}})


def _distance(params):
    return (math.log10(params["meta.inner_lr"]) - math.log10(TARGET)) ** 2


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_run_study_finds_planted_optimum(direction):
    sign = 1.0 if direction == "minimize" else -1.0
    studies = [run_study(lambda trial, p: sign * _distance(p), _lr_space(), n_trials=30, seed=7,
                         direction=direction) for _ in range(2)]
    best = studies[0].best_params["meta.inner_lr"]
    assert TARGET / 1.5 <= best <= TARGET * 1.5, best
    assert len(studies[0].trials) == 30
    assert studies[1].best_params == studies[0].best_params  # seeded: the same search twice


def _reporting_objective(trial, params):
    """Reports the same value at every step: a bad x is bad from its first report on."""
    x = params["x"]
    for step in range(1, 11):
        trial.report(x, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return x


def test_trials_reporting_bad_values_are_pruned():
    space = parse_space({"space": {"x": {"low": 0.0, "high": 1.0}}})
    study = run_study(_reporting_objective, space, n_trials=30, seed=3, direction="minimize",
                      pruner=make_pruner(warmup_steps=2, startup_trials=3))
    rows = trial_records(study)
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    assert len(pruned) >= 5, rows
    assert all(2 <= r["last_step"] < 10 for r in pruned)  # stopped while running, after warm-up
    # pruned only when worse than earlier trials: never one better than the best finished trial
    assert min(r["params"]["x"] for r in pruned) > min(r["value"] for r in complete)
    assert study.best_trial.state == optuna.trial.TrialState.COMPLETE

    unpruned = run_study(_reporting_objective, space, n_trials=10, seed=3, direction="minimize")
    assert {t.state for t in unpruned.trials} == {optuna.trial.TrialState.COMPLETE}


def test_sqlite_study_resumes_and_reruns_an_abandoned_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = parse_space({"space": {"x": {"low": 0.0, "high": 1.0}}})
    study = open_study("minimize", 0, storage=url, fingerprint={"space": 1})
    run_study(lambda trial, p: p["x"], space, 2, 0, "minimize", study=study)
    study.ask()  # a trial cut off while running, as by a killed process

    study = open_study("minimize", 0, storage=url, fingerprint={"space": 1})
    first = [(t.number, t.value) for t in study.trials[:2]]
    run_study(lambda trial, p: p["x"], space, 3, 0, "minimize", study=study)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE"]  # the cut-off trial is re-run
    assert [(t.number, t.value) for t in study.trials[:2]] == first
    with pytest.raises(StudyMismatchError, match="different space"):
        open_study("minimize", 0, storage=url, fingerprint={"space": 2})
    with pytest.raises(StudyMismatchError, match="maximize"):
        open_study("maximize", 0, storage=url, fingerprint={"space": 1})


# ------------------------------------------------------------------ the space file


_build = config_builder(None, [])


def _space_file(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def test_space_parses_ranges_and_choices(tmp_path):
    space = load_space(_space_file(tmp_path, """
metric: mae
space:
  meta.inner_lr: {low: 0.01, high: 1.0, log: true}
  meta.inner_steps: {low: 1, high: 5, type: int}
  meta.adapt: {choices: [top, dense]}
  model.top_mlp: {choices: [[64, 32], [32]]}
"""))
    validate_against_config(space, _build)
    assert space.metric == "mae" and [p.key for p in space.params] == [
        "meta.inner_lr", "meta.inner_steps", "meta.adapt", "model.top_mlp"]
    trial = optuna.create_study().ask()
    values = space.sample(trial)
    cfg = _build(values)
    assert cfg.meta.inner_lr == values["meta.inner_lr"] and 0.01 <= values["meta.inner_lr"] <= 1.0
    assert cfg.meta.inner_steps == values["meta.inner_steps"] in range(1, 6)
    assert cfg.model.top_mlp in ([64, 32], [32]) and cfg.model.top_mlp == values["model.top_mlp"]
    assert space.values(trial.params) == values
    assert _build({"meta.inner_lr": 1e-05}).meta.inner_lr == 1e-05  # YAML 1.1 reads "1e-05" as a string


@pytest.mark.parametrize("text, named", [
    ("space:\n  meta.inner_lrr: {low: 0.01, high: 1.0}\n", ["meta.inner_lrr", "space.yaml"]),
    ("space:\n  trian.steps: {low: 10, high: 20, type: int}\n", ["trian.steps", "space.yaml"]),
    ("space:\n  meta.adapt: {choices: [top, everything]}\n", ["meta.adapt", "everything"]),
    ("space:\n  meta.inner_steps: {low: 1, high: 5}\n", ["meta.inner_steps", "expected int"]),
])
def test_space_rejects_keys_and_values_the_config_rejects(tmp_path, text, named):
    space = load_space(_space_file(tmp_path, text))  # the file itself is well-formed
    with pytest.raises(SpaceError) as e:
        validate_against_config(space, _build)
    for word in named:
        assert word in str(e.value), str(e.value)


@pytest.mark.parametrize("text, named", [
    ("space:\n  meta.inner_lr: {low: 1.0, high: 0.01}\n", ["meta.inner_lr", "bad range", "low (1.0)"]),
    ("space:\n  meta.inner_lr: {low: 0, high: 1, log: true}\n", ["meta.inner_lr", "log range"]),
    ("space:\n  meta.inner_lr: {low: 0.1, hgh: 1}\n", ["meta.inner_lr", "hgh"]),
    ("space:\n  meta.inner_steps: {low: 1, high: 4.5, type: int}\n", ["meta.inner_steps", "whole high"]),
    ("space:\n  meta.adapt: {choices: []}\n", ["meta.adapt", "non-empty"]),
    ("metric: accuracy\nspace:\n  meta.inner_lr: {low: 0.1, high: 1}\n", ["metric", "accuracy"]),
    ("spaces:\n  meta.inner_lr: {low: 0.1, high: 1}\n", ["spaces"]),
])
def test_space_file_errors_name_the_key(tmp_path, text, named):
    with pytest.raises(SpaceError) as e:
        load_space(_space_file(tmp_path, text))
    for word in named + ["space.yaml"]:
        assert word in str(e.value), str(e.value)


# ------------------------------------------------------------------ gmeta tune, end to end


@pytest.fixture(scope="module")
def tiny_data(synth_dir, tmp_path_factory):
    """The 200-user synthetic set of conftest, prepared small (30 valid users)."""
    from gmeta_tf.data.prepare import prepare

    out = tmp_path_factory.mktemp("tune") / "prepared"
    prepare([str(synth_dir)], str(out), PrepareConfig(
        query=4, max_support=8, min_task_size=30, max_task_size=150, valid_frac=0.15, test_frac=0.25,
        shards=2, seed=5))
    return out


TINY_RUN = ["train.steps=10", "train.eval_every=5", "train.log_every=5", "train.checkpoint_every=10",
            "data.tasks_per_batch=8", "data.support=8", "data.query=4", "data.shuffle_buffer=64"]
SPACE = """
space:
  meta.inner_lr: {low: 0.05, high: 1.0, log: true}
  meta.adapt: {choices: [top, dense]}
"""


def _tune_args(tiny_data, tmp_path, out, trials, space=SPACE, sets=TINY_RUN):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(space)
    args = ["tune", "--config", "configs/quickstart.yaml", "--data", str(tiny_data), "--space", str(space_file),
            "--trials", str(trials), "--out", str(out), "--seed", "1"]
    for item in sets:
        args += ["--set", item]
    return args


def _tune(tiny_data, tmp_path, out, trials, space=SPACE, sets=TINY_RUN):
    return CliRunner().invoke(cli, _tune_args(tiny_data, tmp_path, out, trials, space, sets))


def _kill_during_trial(args, trial_dir, log_path) -> None:
    """Run ``gmeta <args>`` in a real process and kill it (-9) once ``trial_dir`` appears."""
    import os
    import signal
    import subprocess
    import sys
    import time

    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gmeta_tf.cli.main", *args], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not trial_dir.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trial_dir.exists(), Path(log_path).read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


@pytest.mark.integration
def test_cli_tune_writes_best_config_and_resumes_after_a_kill(tiny_data, tmp_path):
    out = tmp_path / "tune"
    r = _tune(tiny_data, tmp_path, out, trials=2)
    assert r.exit_code == 0, r.output
    record = json.loads((out / "trials.json").read_text())
    assert record["metric"] == "auc" and record["direction"] == "maximize"  # auto on click data
    trials = record["trials"]
    assert [t["number"] for t in trials] == [0, 1] and {t["state"] for t in trials} == {"COMPLETE"}
    for t in trials:  # a trial is worth its run's best validation, at the step it names
        best = json.loads((out / "trials" / f"trial-{t['number']:03d}" / "train_summary.json").read_text())["best"]
        assert best == {"step": t["best_step"], "metric": "auc", "value": t["value"]}
        run_cfg = load_config(out / "trials" / f"trial-{t['number']:03d}" / "config.yaml")
        assert run_cfg.meta.inner_lr == t["params"]["meta.inner_lr"] and run_cfg.meta.adapt == t["params"]["meta.adapt"]
    winner = max(trials, key=lambda t: t["value"])
    assert record["best"] == winner["number"]
    assert len({(t["params"]["meta.inner_lr"]) for t in trials}) == 2  # sampled, not one point

    best = load_config(out / "best.yaml")  # the full config, trainable as is
    assert best.meta.inner_lr == winner["params"]["meta.inner_lr"]
    assert best.meta.adapt == winner["params"]["meta.adapt"]
    assert best.data.path == str(tiny_data) and best.train.steps == 10 and best.train.eval_every == 5
    assert best.model.interaction == "concat"  # from --config
    assert f"best: trial {winner['number']}" in r.output and "meta.inner_lr" in r.output

    # the same OUT resumes the study, here after `gmeta tune --trials 3` was killed (-9) while
    # trial 2 trained (case 9): trial 2 fails, trial 3 makes three finished, and no parameters
    # are scored twice (trial 3 re-drew trial 0's: the sampler restarted from the same seed)
    _kill_during_trial(_tune_args(tiny_data, tmp_path, out, 3), out / "trials" / "trial-002", tmp_path / "killed.log")
    r = _tune(tiny_data, tmp_path, out, trials=3)
    assert r.exit_code == 0, r.output
    again = json.loads((out / "trials.json").read_text())["trials"]
    assert [(t["number"], t["state"]) for t in again] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "FAIL"),
                                                           (3, "COMPLETE")] and again[:2] == trials
    assert "trial 0:" not in r.output and "trial 3:" in r.output
    scored = [tuple(sorted(t["params"].items())) for t in again if t["state"] == "COMPLETE"]
    assert len(set(scored)) == len(scored), again

    # another search in the same OUT is refused, and nothing there changes
    before = (out / "trials.json").read_text(), (out / "best.yaml").read_text()
    r = _tune(tiny_data, tmp_path, out, trials=5, space="space:\n  meta.inner_lr: {low: 0.05, high: 0.5}\n")
    assert r.exit_code == 2 and "different space" in r.output, r.output
    assert ((out / "trials.json").read_text(), (out / "best.yaml").read_text()) == before


@pytest.mark.integration
@pytest.mark.parametrize("space, sets, named", [
    ("space:\n  meta.inner_lrr: {low: 0.1, high: 1}\n", TINY_RUN, "meta.inner_lrr"),
    (SPACE, [s for s in TINY_RUN if s != "train.eval_every=5"], "train.eval_every"),
])
def test_cli_tune_refuses_before_writing_anything(tiny_data, tmp_path, space, sets, named):
    out = tmp_path / "tune"
    r = _tune(tiny_data, tmp_path, out, trials=2, space=space, sets=sets)
    assert r.exit_code == 2 and named in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not out.exists()


def test_shipped_space_fits_the_shipped_config():
    space = load_space("configs/tune_space.yaml")
    validate_against_config(space, config_builder("configs/quickstart.yaml", []))
    assert space.metric is None and "meta.inner_lr" in [p.key for p in space.params]


class _PruneAtOnce(optuna.pruners.BasePruner):
    def prune(self, study, trial):
        return True


@pytest.mark.integration
def test_training_trial_is_pruned_at_its_first_validation(tiny_data, tmp_path):
    """The trainer's validation hook reports to the trial; a prune stops training there."""
    from gmeta_tf.tune.objective import TrainingObjective

    build = config_builder("configs/quickstart.yaml", [f"data.path={tiny_data}", *TINY_RUN])
    objective = TrainingObjective(build, str(tmp_path), "auc", log=lambda m: None)
    space = parse_space({"space": {"meta.inner_lr": {"low": 0.1, "high": 0.5}}})
    study = run_study(objective, space, n_trials=1, seed=0, direction="maximize", pruner=_PruneAtOnce())
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert list(trial.intermediate_values) == [5] and trial.user_attrs["best_step"] == 5
    run = tmp_path / "trials" / "trial-000"
    assert load_config(run / "config.yaml").meta.inner_lr == trial.params["meta.inner_lr"]
    saved = [p.name for p in (run / "checkpoints").glob("ckpt-*")]
    assert "ckpt-00000010" not in saved  # stopped at step 5 of 10


def test_metric_must_fit_the_labels():
    from gmeta_tf.tune.objective import TuneConfigError, resolve_metric

    cfg = _build({})
    assert resolve_metric(None, cfg, "rating") == "mae" and resolve_metric(None, cfg, "click") == "auc"
    assert resolve_metric("ndcg_at_5", cfg, "click") == "ndcg_at_5"
    with pytest.raises(TuneConfigError, match="mae is a metric of rating data"):
        resolve_metric("mae", cfg, "click")
    assert resolve_metric("auc_pooled", cfg, "click") == "auc_pooled"  # every eval metric with a direction
    assert resolve_metric("mae_finetune", _build({"meta.algo": "erm"}), "rating") == "mae_finetune"
    with pytest.raises(TuneConfigError, match="reported for ERM runs"):  # MAML runs are not fine-tuned
        resolve_metric("mae_finetune", cfg, "rating")
    cfg.train.best_metric = "auc_tasks"  # a result key with no direction (a count of users)
    with pytest.raises(TuneConfigError, match="train.best_metric"):
        resolve_metric(None, cfg, "click")
