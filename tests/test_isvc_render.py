"""``gmeta k8s render-serving``: the InferenceService validates against KServe's CRD and runs `gmeta serve`.

No cluster needed: the manifest is rendered, parsed back and checked against the vendored
InferenceService CRD's ``openAPIV3Schema`` (KServe v0.15.2).
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gmeta_tf.cli.main import cli
from gmeta_tf.errors import UserError
from launch.isvc_render import (
    CRD_ENV,
    crd_path,
    isvc_errors,
    isvc_schema,
    render_inference_service,
    validate_inference_service,
)
from launch.k8s_render import CrdNotFoundError, to_yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(name="gmeta-recs", image="registry.example/gmeta-tf:0.1.0", model_uri="pvc://models/exports/1")


def _container(doc):
    (container,) = doc["spec"]["predictor"]["containers"]
    return container


@pytest.mark.parametrize("batch", [0, 32])
def test_render_validates_and_serves_the_model_with_gmeta_serve(batch):
    doc = render_inference_service(**BASE, namespace="recs", max_batch_size=batch, max_latency_ms=5,
                                   min_replicas=2, max_replicas=4, cpu="4", memory="8Gi")
    (parsed,) = yaml.safe_load_all(to_yaml([doc]))
    assert parsed == doc
    assert isvc_errors(parsed) == []
    validate_inference_service(parsed)

    assert (doc["apiVersion"], doc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert doc["metadata"] == {"name": "gmeta-recs", "namespace": "recs", "labels": {
        "app.kubernetes.io/name": "gmeta-tf", "gmeta-tf/inference-service": "gmeta-recs"}}
    predictor = doc["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 4)
    c = _container(doc)
    assert c["name"] == "kserve-container" and c["image"] == BASE["image"]
    expected = ["gmeta", "serve", "--model", "/mnt/models", "--port", "8080", "--host", "0.0.0.0",
                "--name", "gmeta-recs"]
    assert c["command"] == expected + (["--max-batch-size", "32", "--max-latency-ms", "5"] if batch else [])
    assert {e["name"]: e["value"] for e in c["env"]}["STORAGE_URI"] == "pvc://models/exports/1"
    assert c["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/models/gmeta-recs/ready", "port": 8080}
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}


def test_max_body_mb_reaches_gmeta_serve():
    """Issue 37: the body limit is gmeta serve's --max-body-mb; left out, gmeta serve's default holds."""
    doc = render_inference_service(**BASE, max_body_mb=256)
    validate_inference_service(doc)
    assert _container(doc)["command"][-2:] == ["--max-body-mb", "256"]
    assert "--max-body-mb" not in _container(render_inference_service(**BASE))["command"]
    r = _invoke(["--image", "reg/gmeta:1", "--model-uri", "pvc://c/m", "--name", "recs", "--max-body-mb", "0.5"])
    assert r.exit_code == 0, r.output + r.stderr
    assert _container(next(yaml.safe_load_all(r.stdout)))["command"][-2:] == ["--max-body-mb", "0.5"]


def test_the_schema_catches_a_broken_manifest():
    doc = render_inference_service(**BASE)
    broken = copy.deepcopy(doc)
    broken["spec"]["predictor"]["minReplicas"] = "two"
    del _container(broken)["name"]
    errors = isvc_errors(broken)
    assert "spec.predictor.minReplicas: 'two' is not of type 'integer'" in errors
    assert "spec.predictor.containers[0]: 'name' is a required property" in errors
    with pytest.raises(UserError, match="does not match the serving.kserve.io/v1beta1 InferenceService CRD"):
        validate_inference_service(broken)
    assert any(e.startswith("kind:") for e in isvc_errors({**doc, "kind": "Deployment"}))


def test_schema_is_the_v1beta1_openapi_schema():
    predictor = isvc_schema()["properties"]["spec"]["properties"]["predictor"]["properties"]
    assert predictor["minReplicas"]["type"] == "integer"
    assert "containers" in predictor and "tensorflow" in predictor


def test_missing_crd_is_a_typed_error(tmp_path, monkeypatch):
    missing = tmp_path / "nope.yaml"
    monkeypatch.setenv(CRD_ENV, str(missing))
    with pytest.raises(CrdNotFoundError, match=f"InferenceService CRD not found at {missing}.*{CRD_ENV}"):
        validate_inference_service(render_inference_service(**BASE))
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\n")
    monkeypatch.setenv(CRD_ENV, str(other))
    with pytest.raises(UserError, match="no InferenceService CustomResourceDefinition"):
        isvc_schema()


def test_default_crd_is_the_vendored_copy_with_its_licence():
    here = crd_path()
    assert here == ROOT / "launch" / "schemas" / "serving.kserve.io_inferenceservices.v0.15.2.yaml"
    notice = (here.parent / "README.md").read_text()
    assert "kserve/kserve" in notice and "v0.15.2" in notice and "Apache" in notice


def _invoke(args):
    return CliRunner(mix_stderr=False).invoke(cli, ["k8s", "render-serving", *args])


def test_cli_render_serving_stdout_and_out_file(tmp_path):
    args = ["--image", "reg/gmeta:1", "--model-uri", "gs://b/exports/7", "--name", "recs", "--model-name", "dlrm"]
    r = _invoke(args)
    assert r.exit_code == 0, r.output + r.stderr
    (doc,) = yaml.safe_load_all(r.stdout)
    validate_inference_service(doc)
    assert _container(doc)["command"][-2:] == ["--name", "dlrm"]
    out = tmp_path / "isvc.yaml"
    r = _invoke(args + ["--out", str(out)])
    assert r.exit_code == 0 and "wrote" in r.stdout
    assert list(yaml.safe_load_all(out.read_text())) == [doc]


def test_cli_without_crd_is_an_error_and_writes_nothing(tmp_path, monkeypatch):
    missing = tmp_path / "missing.yaml"
    monkeypatch.setenv(CRD_ENV, str(missing))
    out = tmp_path / "isvc.yaml"
    r = _invoke(["--image", "i", "--model-uri", "pvc://c/m", "--name", "recs", "--out", str(out)])
    assert r.exit_code == 2
    assert f"InferenceService CRD not found at {missing}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == "" and not out.exists()


@pytest.mark.parametrize("extra,needle", [
    (["--name", "Recs"], "--name 'Recs' is not a valid InferenceService name"),
    (["--name", "1recs"], "--name '1recs' is not a valid InferenceService name"),
    (["--model-uri", "/local/path"], "--model-uri '/local/path' must be a URI"),
    (["--image", "has space"], "--image 'has space'"),
    (["--memory", "4GB"], "--memory '4GB' is not a Kubernetes resource quantity"),
    (["--min-replicas", "3", "--max-replicas", "2"], "--max-replicas 2 is below --min-replicas 3"),
    (["--max-batch-size", "-1"], "--max-batch-size must be an integer >= 0"),
    (["--namespace", "ML"], "--namespace 'ML'"),
    (["--max-body-mb", "0"], "--max-body-mb must be a number > 0"),
])
def test_cli_bad_option_is_one_line_naming_it(extra, needle):
    args = {"--image": "reg/gmeta:1", "--model-uri": "pvc://c/m", "--name": "recs"}
    flat = []
    for k, v in args.items():
        if k not in extra:
            flat += [k, v]
    r = _invoke(flat + extra)
    assert r.exit_code == 2, r.output + r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
