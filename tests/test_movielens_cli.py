"""The MovieLens example's command line (examples/movielens/run.py): what the user asks for is
either done or refused before an hour of training, never silently replaced."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

from gmeta_tf.config.schema import ConfigError
from gmeta_tf.evaluation.paired import Bootstrap

RUN_PY = Path(__file__).resolve().parents[1] / "examples" / "movielens" / "run.py"


@pytest.fixture()
def run(monkeypatch):
    """The example's module, with ``run`` (convert, prepare, train) replaced by a recorder."""
    spec = importlib.util.spec_from_file_location("movielens_run", RUN_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.calls = []
    monkeypatch.setattr(mod, "run", lambda *a, **kw: mod.calls.append((a, kw)) or {})
    return mod


@pytest.mark.parametrize("key", ["prepare.folds", "data.path", "prepare.fold"])
def test_a_set_of_a_key_the_script_owns_is_refused_not_dropped(run, key, capsys):
    """run.py sets prepare.folds, prepare.fold and data.path for every fold, after the user's
    --set: the user's value was replaced without a word."""
    with pytest.raises(SystemExit) as e:
        run.main(["--out", "unused", "--set", f"{key}=3"])
    assert e.value.code == 2
    assert key in capsys.readouterr().err
    assert run.calls == []  # nothing converted or trained
    with pytest.raises(ConfigError, match=key):
        run.fold_overrides([f"{key}=3"], Path("unused"), 0)


def test_fold_overrides_keep_the_users_other_settings_and_set_the_fold():
    spec = importlib.util.spec_from_file_location("movielens_run", RUN_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.fold_overrides(["meta.irls_steps=1"], Path("p"), 2)
    assert got == ["meta.irls_steps=1", f"data.path={Path('p').resolve()}", f"prepare.folds={mod.FOLDS}",
                   "prepare.fold=2"]


def test_an_unknown_model_name_is_refused_with_the_known_names(run, capsys):
    """--models mmaml used to train nothing, then end in an IndexError."""
    with pytest.raises(SystemExit) as e:
        run.main(["--out", "unused", "--models", "fomaml,mmaml"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "mmaml" in err and "erm_finetune" in err
    assert run.calls == []


def test_known_model_names_run_in_table_order(run):
    run.main(["--out", "unused", "--models", "erm_finetune,fomaml"])
    (_, kw), = run.calls
    assert [m[0] for m in kw["models"]] == ["fomaml", "erm_finetune"]


def test_the_intervals_follow_eval_bootstrap_confidence(run):
    """The example paired with a fixed 95% interval and said so, whatever eval.bootstrap_confidence."""
    boot = run.bootstrap(["eval.bootstrap_confidence=0.9", "eval.bootstrap_resamples=500"])
    assert (boot.confidence, boot.resamples) == (0.9, 500)
    assert "90% bootstrap interval" in run.protocol(boot)
    assert "95% bootstrap interval" in run.protocol(run.bootstrap())
    assert run.bootstrap() == Bootstrap()  # the example's config keeps the defaults


def test_eval_compare_help_names_the_confidence_setting():
    from gmeta_tf.cli.train_cmd import eval_cmd

    out = CliRunner().invoke(eval_cmd, ["--help"], terminal_width=200).output
    assert "eval.bootstrap_confidence" in out and "95%" not in out


def test_bands_pair_every_plotted_line_with_the_best_baseline_and_the_plot_draws_them(run, tmp_path):
    import numpy as np

    from gmeta_tf.evaluation.per_task import TaskScores

    rng = np.random.default_rng(0)
    users = 40
    err = {"fomaml": 0.6, "erm_finetune": 0.7, "item_mean_user_bias": 0.72, "item_mean": 0.8}
    gain = {"fomaml": 0.76, "erm_finetune": 0.74, "item_mean_user_bias": 0.75, "item_mean": 0.75}

    def scores(shift):
        s = TaskScores("rating", [f"u{i}" for i in range(users)], {}, {})
        for name in err:
            n = np.full(users, 10.0)
            s.scorers[name] = {"mae": (n * (err[name] + shift + rng.normal(0, 0.05, users)), n),
                               "ndcg_at_5": (gain[name] + rng.normal(0, 0.05, users), np.ones(users))}
        return s

    pooled = {5: scores(0.05), 50: scores(0.0)}
    boot = Bootstrap(resamples=200)
    out = run.bands(pooled, boot, "fomaml")
    for n, s in pooled.items():
        mae = out["mae"][str(n)]
        assert mae["best"] == "erm_finetune"  # the best of the baselines, the meta-learner not among them
        assert mae["rows"]["erm_finetune"] == {"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0}
        d = mae["rows"]["fomaml"]
        assert d["diff"] == pytest.approx(s.metric("fomaml", "mae") - s.metric("erm_finetune", "mae"))
        assert d["ci_low"] <= d["diff"] <= d["ci_high"] < 0
        best = max(("erm_finetune", "item_mean_user_bias", "item_mean"), key=lambda b: s.metric(b, "ndcg_at_5"))
        assert out["ndcg_at_5"][str(n)]["best"] == best
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("movielens_plot", RUN_PY.with_name("plot.py"))
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    png = tmp_path / "q.png"
    plot.draw({"bands": out, "bootstrap": boot.to_json(), "users": users, "split": "test"}, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
