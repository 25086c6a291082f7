"""``gmeta export``: a trained run → a SavedModel that stock TensorFlow loads and scores exactly
as ``gmeta eval`` does, before and after adaptation.

The parity tests train tiny runs (click data with the quickstart's SGD inner loop on the top
MLP, click data adapting embeddings too, rating data with the MovieLens Newton head and its
learned ridge λ), export them, and score the test split in a fresh process that imports only
TensorFlow and numpy (``export_client.py``). That process also lists every op in the graph and
checks that its stock TensorFlow registers it. ``saved_model_cli`` must show and run the model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.main import cli
from gmeta_tf.config.loader import load_config
from gmeta_tf.errors import CheckpointError, DataError
from tests.serve_fixture import RUNS

TOL = 1e-5
REPO = Path(__file__).resolve().parents[1]
CLIENT = Path(__file__).with_name("export_client.py")
VENV_BIN = Path(sys.executable).parent
TIMEOUT = 300

def _test_split_inputs(run: Path, manifest: dict, out: Path) -> dict:
    """``gmeta eval``'s per-task scores of the test split, and the same tasks' samples as the
    signatures' inputs (named as ``export.json`` says), written to ``out`` for the client: the
    real ids (Meta-IO read without ``data.min_id_count``) and only the input's own dense
    columns, raw (the target-encoding ones are the graph's to compute)."""
    import dataclasses

    from gmeta_tf.evaluation.evaluate import query_scores
    from gmeta_tf.export.client_inputs import task_inputs
    from gmeta_tf.metaio.reader import make_dataset
    from gmeta_tf.train.trained_run import load_trained

    cfg, model, _ = load_trained(run)
    scores = query_scores(model, cfg)
    arrays, task_ids = {}, []
    inputs = manifest["signatures"]["adapt_and_predict"]["inputs"]
    real_ids = dataclasses.replace(cfg.data, min_id_count={})
    for batch in make_dataset(cfg.data.path, cfg.eval.split, real_ids, training=False):
        for t in np.flatnonzero(batch["task_mask"].numpy() > 0):
            i = len(task_ids)
            task_ids.append(batch["task_id"][t].numpy().decode())
            for name, value in task_inputs(batch, t, inputs, model.schema).items():
                arrays[f"{i}/{name}"] = value
    assert task_ids == scores["task_ids"]  # the same tasks, in the same order
    np.savez(out, tasks=len(task_ids), **arrays)
    return scores


def _client(export_dir: Path, inputs: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(VENV_BIN / "python"), str(CLIENT), str(export_dir), str(inputs), str(out)],
                   check=True, timeout=TIMEOUT, env=env, cwd=str(out.parent))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def exports(exported_model):
    """``exports(name)``: run ``name`` of ``RUNS`` trained and exported (``exported_model``, once per
    session) and scored by the fresh client, once per module, as (run dir, export dir, manifest,
    gmeta eval's scores, the client's result). Tests about every run take ``exported``; a test
    about one run names it."""
    done = {}

    def get(name: str):
        if name not in done:
            run, out, manifest = exported_model(name)
            scores = _test_split_inputs(run, manifest, run.parent / "inputs.npz")
            client = _client(out, run.parent / "inputs.npz", run.parent / "client.json")
            done[name] = run, out, manifest, scores, client
        return done[name]

    return get


@pytest.fixture(scope="module", params=list(RUNS))
def exported(request, exports):
    return exports(request.param)


def _max_diff(a, b) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b))


@pytest.mark.integration  # trains three tiny runs and starts a TensorFlow process per run
def test_scores_equal_gmeta_eval_before_and_after_adaptation(exported):
    _, _, manifest, scores, client = exported
    assert client["modules"] == []  # never imported gmeta_tf nor TFRA
    assert len(scores["after"]) > 20
    assert _max_diff(client["predict"], scores["before"]) <= TOL
    assert _max_diff(client["adapt_no_adapt"], scores["before"]) <= TOL
    assert _max_diff(client["adapt"], scores["after"]) <= TOL
    assert _max_diff(client["adapt_concurrent"], client["adapt"]) <= 1e-6  # concurrent requests do not interfere
    assert client["predict_after"] == client["predict"][0]  # adapting never writes the weights
    # Adaptation changes the scores (else "after" parity would prove nothing).
    assert _max_diff(scores["after"], scores["before"]) > 1e-3
    # Scores are on the label's scale (probabilities, or ratings), not the standardised one.
    low, high = {"click": (0.0, 1.0), "rating": (1.0, 5.0)}[manifest["label"]["kind"]]
    assert low < np.mean(np.concatenate(client["predict"])) < high


@pytest.mark.integration
def test_only_stock_tensorflow_ops(exported):
    _, _, _, _, client = exported
    assert client["unregistered"] == []
    assert not [op for op in client["ops"] if "TFRA" in op or ">" in op]
    assert {"HashTableV2", "LookupTableFindV2", "LookupTableImportV2"} <= set(client["ops"])


@pytest.mark.integration
def test_manifest_and_layout(exported):
    run, out, manifest, _, client = exported
    assert sorted(p.name for p in out.iterdir()) == ["assets", "assets.extra", "fingerprint.pb",
                                                     "saved_model.pb", "variables"]
    extra = out / "assets.extra"
    assert json.loads((extra / "export.json").read_text()) == manifest
    assert json.loads((extra / "schema.json").read_text())["label"]["kind"] == manifest["label"]["kind"]
    assert load_config(extra / "config.yaml").meta.adapt == manifest["adaptation"]["adapt"]
    schema = json.loads((extra / "schema.json").read_text())
    tables = [c["name"] for c in schema["categorical"] + schema["multi_hot"]]
    assert list(manifest["tables"]) == tables
    for sig in ("predict", "adapt_and_predict"):
        assert sorted(client["inputs"][sig]) == sorted(x["name"] for x in manifest["signatures"][sig]["inputs"])
    device = next(x for x in manifest["signatures"]["predict"]["inputs"] if x["feature"] == "device")
    assert device["hashed"] is True and device["dtype"] == "int64" and device["shape"] == [-1]
    # what a server cannot read from the TensorSpecs: batch groups, pad values, the labels trained on
    sigs = manifest["signatures"]
    assert {x["batch_group"] for x in sigs["predict"]["inputs"]} == {"samples"}
    assert sigs["predict"]["output_batch_group"] == "samples" and sigs["adapt_and_predict"]["output_batch_group"] == "query"
    assert {x["name"]: x["batch_group"] for x in sigs["adapt_and_predict"]["inputs"]} == {
        x["name"]: x["name"].split("_", 1)[0] for x in sigs["adapt_and_predict"]["inputs"]}
    assert {x["name"]: x.get("pad") for x in sigs["predict"]["inputs"] if "pad" in x} == {"item_tags": -1}
    label = manifest["label"]
    assert label == ({"kind": "click", "name": "click", "values": [0.0, 1.0]} if label["kind"] == "click" else
                     {"kind": "rating", "name": "rating", "min": 1.0, "max": 5.0})
    assert manifest["source"]["step"] in (5, 10)  # best (validated runs) or latest
    if manifest["adaptation"]["solver"] == "newton":
        assert manifest["adaptation"]["ridge_lambda"] == "learned per feature"
    half_life = load_config(extra / "config.yaml").meta.support_half_life
    if half_life:  # learned from its start value: recorded, since clients must send the support oldest first
        assert manifest["adaptation"]["support_half_life"] == pytest.approx(half_life, rel=0.5)
        assert manifest["adaptation"]["support_half_life"] != half_life
    else:
        assert manifest["adaptation"]["support_half_life"] is None
    assert manifest["adaptation"]["neighbourhood"] == load_config(extra / "config.yaml").model.neighbourhood


def _cli(*args, timeout=TIMEOUT):
    return subprocess.run([str(VENV_BIN / "saved_model_cli"), *args], capture_output=True, text=True,
                          timeout=timeout, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


@pytest.mark.integration
def test_saved_model_cli_shows_and_runs_it(exports, tmp_path):
    run, out, manifest, _, client = exports("click_top_sgd")
    shown = _cli("show", "--dir", str(out), "--all")
    assert shown.returncode == 0, shown.stderr
    for sig in ("predict", "adapt_and_predict", "serving_default"):
        assert f"signature_def['{sig}']" in shown.stdout
    data = np.load(run.parent / "inputs.npz")
    files = []  # the first test user's query samples, one .npy per input
    for x in manifest["signatures"]["predict"]["inputs"]:
        np.save(tmp_path / f"{x['name']}.npy", data[f"0/query_{x['name']}"])
        files.append(f"{x['name']}={tmp_path / (x['name'] + '.npy')}")
    ran = _cli("run", "--dir", str(out), "--tag_set", "serve", "--signature_def", "predict",
               "--inputs", ";".join(files), "--outdir", str(tmp_path / "o"))
    assert ran.returncode == 0, ran.stderr
    got = np.load(tmp_path / "o" / "score.npy")
    np.testing.assert_allclose(got, client["predict"][0], rtol=0, atol=TOL)


# ---------------------------------------------------------------------------- errors

def test_run_without_checkpoints_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("data: {path: /nowhere}\n")
    got = CliRunner().invoke(cli, ["export", "--run", str(run), "--out", str(tmp_path / "x")])
    assert got.exit_code == 2
    assert got.output.count("\n") == 1 and str(run / "checkpoints") in got.output
    assert not (tmp_path / "x").exists()


def test_not_a_run_dir_is_one_line(tmp_path):
    got = CliRunner().invoke(cli, ["export", "--run", str(tmp_path), "--out", str(tmp_path / "x")])
    assert got.exit_code == 2 and "not a run directory" in got.output and str(tmp_path) in got.output


@pytest.mark.integration
def test_damaged_checkpoint_names_the_file(exported, tmp_path):
    import shutil

    from gmeta_tf.export.export_run import export_run

    run, _, manifest, _, _ = exported
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ckpt = Path(manifest["source"]["checkpoint"]).name
    table = copy / "checkpoints" / ckpt / "tables" / "item_id.npz"
    raw = bytearray(table.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    table.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"tables/item_id\.npz does not match its checksum"):
        export_run(str(copy), str(tmp_path / "x"), which=ckpt[5:].lstrip("0"))
    assert not (tmp_path / "x").exists()
    got = CliRunner().invoke(cli, ["export", "--run", str(copy), "--out", str(tmp_path / "x"),
                                   "--checkpoint", ckpt[5:].lstrip("0")])
    assert got.exit_code == 2 and "item_id.npz" in got.output and got.output.count("\n") == 1


@pytest.mark.integration
def test_existing_output_is_refused_and_a_failed_export_leaves_nothing(exported, tmp_path, monkeypatch):
    from gmeta_tf.export import export_run as module

    run, _, _, _, _ = exported
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        module.export_run(str(run), str(full))
    assert (full / "keep.txt").read_text() == "mine"

    def disk_full(obj, path, signatures=None):  # the save dies half-way through its writes
        Path(path, "saved_model.pb").write_bytes(b"partial")
        raise OSError(28, "No space left on device", str(Path(path, "variables")))

    monkeypatch.setattr(module.tf.saved_model, "save", disk_full)
    with pytest.raises(DataError, match="nothing was written"):
        module.export_run(str(run), str(tmp_path / "new"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no output, no temp dir
    with pytest.raises(DataError):
        module.export_run(str(run), str(full), overwrite=True)
    assert (full / "keep.txt").read_text() == "mine"  # --overwrite replaces only a complete export


@pytest.mark.integration
def test_gmeta_serve_answers_the_export_with_gmeta_evals_scores(exports, tmp_path):
    """Train → export → serve: the real export behind a real `gmeta serve`, over HTTP (v1 columnar
    and v2), gives `gmeta eval`'s scores for the first test users, before and after adaptation."""
    from tests.serve_fixture import request, server_process

    run, out, manifest, scores, _ = exports("rating_newton")
    data = np.load(run.parent / "inputs.npz")
    names = [x["name"] for x in manifest["signatures"]["adapt_and_predict"]["inputs"]]
    with server_process(out, tmp_path / "serve.log", name="ml") as (port, _):
        for t in range(3):
            adapt_inputs = {n: data[f"{t}/{n}"].tolist() for n in names}
            query = {n[len("query_"):]: v for n, v in adapt_inputs.items() if n.startswith("query_")}
            status, body = request(port, "POST", "/v1/models/ml:predict",
                                   {"signature_name": "predict", "inputs": query})
            assert status == 200, body
            assert _max_diff([body["outputs"]], [scores["before"][t]]) <= TOL
            status, body = request(port, "POST", "/v1/models/ml:predict",
                                   {"signature_name": "adapt_and_predict", "inputs": adapt_inputs})
            assert status == 200, body
            assert _max_diff([body["outputs"]["score"]], [scores["after"][t]]) <= TOL
            v2 = {"inputs": [{"name": n, "shape": list(np.shape(v)), "datatype": "INT64", "data": np.ravel(v).tolist()}
                             for n, v in query.items()], "parameters": {"signature_name": "predict"}}
            for x in v2["inputs"]:
                if np.asarray(query[x["name"]]).dtype.kind == "f":
                    x["datatype"] = "FP32"
            status, body = request(port, "POST", "/v2/models/ml/infer", v2)
            assert status == 200, body
            assert _max_diff([body["outputs"][0]["data"]], [scores["before"][t]]) <= TOL
        status, body = request(port, "POST", "/v1/models/ml:predict",
                               {"signature_name": "adapt_and_predict", "inputs": {"query_movie": [1]}})
        assert status == 400 and any(n in json.dumps(body) for n in names if n != "query_movie"), body


@pytest.mark.integration
@pytest.mark.parametrize("name", ["click_top_sgd", "rating_newton"])
def test_runs_without_data_features_export_no_input_transforms(exports, name):
    manifest = exports(name)[2]
    transforms = manifest["input_transforms"]
    assert transforms["rare_ids"] == {} and transforms["computed_dense"] == []
    assert "te." not in json.dumps(manifest["signatures"])


@pytest.mark.integration
def test_rare_ids_and_target_encoding_are_the_graphs(exports):
    """The te run's clients send real ids (some rare) and no target-encoding columns."""
    from gmeta_tf.metaio.rare_ids import frequent_ids

    run, _, manifest, _, _ = exports("rating_te_rare")
    transforms = manifest["input_transforms"]
    schema = json.loads((run.parent / "export" / "assets.extra" / "schema.json").read_text())
    cfg = load_config(run / "config.yaml")
    assert {f: r["min_id_count"] for f, r in transforms["rare_ids"].items()} == {"item_id": 3, "item_tags": 3}
    assert (manifest["adaptation"]["support_loss"], manifest["adaptation"]["irls_steps"]) == ("absolute", 3)
    assert transforms["computed_dense"][0]["features"] == ["te.item_id.mean", "te.item_id.log_count"]
    assert transforms["dense_inputs"] == ["price", "item_age_days", "user_activity"]
    dense_in = next(x for x in manifest["signatures"]["predict"]["inputs"] if x["role"] == "dense")
    assert dense_in["shape"] == [-1, 3] and dense_in["features"] == transforms["dense_inputs"]
    frequent = frequent_ids(cfg.data.path, schema, cfg.data.min_id_count)
    data = np.load(run.parent / "inputs.npz")
    for feature, name in (("item_id", "query_item_id"), ("item_tags", "query_item_tags")):
        sent = np.concatenate([data[f"{t}/{name}"].ravel() for t in range(int(data["tasks"]))])
        sent = sent[sent != -1]
        rare = ~np.isin(sent, frequent[feature])
        assert 0 < rare.sum() < sent.size, feature  # real ids, some rare, some not


@pytest.mark.integration
@pytest.mark.parametrize("change, message", [
    ("model.embedding_dim=8", r"table 'item_id' has rows of dim 16, but the run's config has model\.embedding_dim 8"),
    ("model.top_mlp=[16]", r"dense weight 'top/0/w' is of shape \[\d+, 64\], but the run's config builds \[\d+, 16\]"),
])
def test_a_config_that_does_not_match_the_checkpoint_names_the_weight(exports, tmp_path, change, message):
    import shutil

    import yaml

    from gmeta_tf.export.export_run import export_run

    run = tmp_path / "run"
    shutil.copytree(exports("click_top_sgd")[0], run)
    key, value = change.split("=")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"][key.split(".")[1]] = yaml.safe_load(value)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(CheckpointError, match=message):
        export_run(str(run), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
@pytest.mark.parametrize("name, labels, message", [
    ("click_top_sgd", [5.0, 4.0, 1.0, 3.0], "support_label: a click model takes 0 or 1"),
    ("rating_newton", [100.0, 3.0, 3.0, 3.0], "support_label: this rating model was trained on labels in [1, 5]"),
    ("rating_newton", [3.0, -50.0, 3.0, 3.0], "support_label: this rating model was trained on labels in [1, 5]"),
    ("rating_newton", [3.0, float("nan"), 3.0, 3.0], "input 'support_label' holds NaN or Inf"),
])
def test_the_signature_refuses_a_support_set_it_cannot_adapt_to(exported_model, name, labels, message):
    """Labels the model was not trained on (a click model adapted to ratings scored 0.99999; a
    1-5 rating model adapted to 100 scored 405.6) and NaN support values (every query score
    became NaN) fail the SavedModel's own call, for clients that do not go through gmeta serve."""
    import tensorflow as tf

    from tests.serve_fixture import export_inputs

    _, out, manifest = exported_model(name)
    fn = tf.saved_model.load(str(out)).signatures["adapt_and_predict"]
    good = export_inputs(manifest, "adapt_and_predict", batch=2, support=4, seed=1)
    scores = fn(**{k: tf.constant(v) for k, v in good.items()})["score"].numpy()
    assert np.isfinite(scores).all()
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        fn(**{k: tf.constant(v) for k, v in {**good, "support_label": np.float32(labels)}.items()})
    assert message in e.value.message
    dense = good["support_dense"].copy()
    dense[2, 1] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 'support_dense' holds NaN or Inf"):
        fn(**{k: tf.constant(v) for k, v in {**good, "support_dense": dense}.items()})
