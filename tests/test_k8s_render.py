"""``gmeta k8s render``: the TFJob validates against the Kubeflow CRD and has the shape we rely on.

No cluster needed: manifests are rendered, parsed, and checked against the TFJob CRD's
``openAPIV3Schema`` (training-operator v1.9.0) plus structural checks.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gmeta_tf.cli.k8s_cmd import k8s_group
from gmeta_tf.config.loader import config_from_dict, load_config
from gmeta_tf.errors import UserError
from launch.k8s_render import (
    CRD_ENV,
    CrdNotFoundError,
    crd_path,
    default_job_name,
    render_manifests,
    tfjob_errors,
    tfjob_schema,
    to_yaml,
    validate_tfjob,
)

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")



def test_crd_is_present():
    assert crd_path().is_file(), f"the TFJob CRD is expected at {crd_path()} (or set {CRD_ENV})"


@pytest.fixture(scope="module")
def cfg():
    return load_config(QUICKSTART, ["train.steps=123", "cluster.ps=[localhost:1234]"])


def _render(cfg, **kw):
    args = dict(image="registry.example/gmeta-tf:0.1.0", workers=2, ps=1, checkpoint_pvc="gmeta-ckpt",
                data="/ckpt/data/prepared")
    args.update(kw)
    return render_manifests(cfg, **args)


def _container(tfjob, role):
    (container,) = tfjob["spec"]["tfReplicaSpecs"][role]["template"]["spec"]["containers"]
    return container


def _env(container):
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.parametrize("workers,ps,gpus", [(1, 1, 0), (2, 2, 0), (4, 2, 1), (8, 4, 2)])
def test_render_validates_and_has_the_expected_shape(cfg, workers, ps, gpus):
    configmap, tfjob = _render(cfg, workers=workers, ps=ps, gpus_per_worker=gpus, name="meta-run")
    # The whole TFJob, through YAML text and back, validates against the CRD's openAPIV3Schema.
    parsed = list(yaml.safe_load_all(to_yaml([configmap, tfjob])))
    assert parsed == [configmap, tfjob]
    assert tfjob_errors(parsed[1]) == []
    validate_tfjob(parsed[1])

    assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert (configmap["apiVersion"], configmap["kind"]) == ("v1", "ConfigMap")
    for doc in (configmap, tfjob):
        assert doc["metadata"]["labels"] == {"app.kubernetes.io/name": "gmeta-tf", "gmeta-tf/job": "meta-run"}
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"PS", "Worker"}
    assert specs["Worker"]["replicas"] == workers and specs["PS"]["replicas"] == ps
    assert tfjob["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "Running"}

    command = ["gmeta", "k8s", "entrypoint", "--config", "/etc/gmeta/config.yaml",
               "--out", "/ckpt/meta-run", "--data", "/ckpt/data/prepared"]
    for role in ("PS", "Worker"):
        spec = specs[role]
        assert spec["restartPolicy"] == "ExitCode"  # 128-255 retried, a bad config (2) not
        assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 30  # grace 25 s + 5
        pod = spec["template"]["spec"]
        assert "schedulerName" not in pod
        assert pod["securityContext"] == {"fsGroup": 1000}  # the image's group (tests/image checks it)
        c = _container(tfjob, role)
        assert c["name"] == "tensorflow"
        assert c["image"] == "registry.example/gmeta-tf:0.1.0"
        assert c["command"] == command
        assert _env(c) == {"TF_USE_LEGACY_KERAS": "1", "GMETA_RENDEZVOUS_PORT": "12355",
                           "GMETA_HEALTH_PORT": "2223", "GMETA_GLOO_IFACE": "eth0", "PYTHONUNBUFFERED": "1"}
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["tfjob-port"] == 2222
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["gmeta-config"] == "/etc/gmeta" and mounts["gmeta-checkpoints"] == "/ckpt"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["gmeta-config"]["configMap"]["name"] == "meta-run-config"
        assert volumes["gmeta-checkpoints"]["persistentVolumeClaim"]["claimName"] == "gmeta-ckpt"
        assert spec["template"]["metadata"]["labels"]["gmeta-tf/role"] == role.lower()

    worker, ps_c = _container(tfjob, "Worker"), _container(tfjob, "PS")
    assert {p["name"]: p["containerPort"] for p in worker["ports"]} == {"tfjob-port": 2222, "gloo-rdv": 12355}
    assert {p["name"]: p["containerPort"] for p in ps_c["ports"]} == {"tfjob-port": 2222, "health": 2223}
    assert ps_c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 2223}
    assert "readinessProbe" not in worker
    assert worker["resources"]["requests"] == {"cpu": "4", "memory": "16Gi"}
    assert ps_c["resources"] == {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"cpu": "4", "memory": "32Gi"}}
    if gpus:
        assert worker["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": gpus}
        assert "nvidia.com/gpu" not in worker["resources"]["requests"]
    else:
        assert worker["resources"]["limits"] == {"cpu": "4", "memory": "16Gi"}
    assert not any("gpu" in key for key in ps_c["resources"]["limits"])

    # The ConfigMap holds the resolved config: it loads back through the one config loader.
    assert configmap["metadata"]["name"] == "meta-run-config"
    back = config_from_dict(yaml.safe_load(configmap["data"]["config.yaml"]))
    expected = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path="/ckpt/data/prepared"),
                                   cluster=dataclasses.replace(cfg.cluster, ps=[]))
    assert back == expected
    assert back.train.steps == 123 and back.cluster.ps == []


def test_checkpoint_uri_has_no_volume_and_is_the_run_dir(cfg):
    _, tfjob = _render(cfg, checkpoint_pvc=None, checkpoint_uri="gs://bucket/runs/maml-1")
    validate_tfjob(tfjob)
    for role in ("PS", "Worker"):
        c = _container(tfjob, role)
        assert c["command"][c["command"].index("--out") + 1] == "gs://bucket/runs/maml-1"
        assert [m["name"] for m in c["volumeMounts"]] == ["gmeta-config"]
        assert [v["name"] for v in tfjob["spec"]["tfReplicaSpecs"][role]["template"]["spec"]["volumes"]] == [
            "gmeta-config"]


@pytest.mark.parametrize("scheduler,name", [("volcano", "volcano"), ("scheduler-plugins", "scheduler-plugins-scheduler")])
def test_gang_scheduling(cfg, scheduler, name):
    _, tfjob = _render(cfg, workers=4, ps=2, gang_scheduler=scheduler, backoff_limit=5, namespace="ml-team")
    validate_tfjob(tfjob)
    assert tfjob["metadata"]["namespace"] == "ml-team"
    assert tfjob["spec"]["runPolicy"] == {"backoffLimit": 5, "cleanPodPolicy": "Running",
                                          "schedulingPolicy": {"minAvailable": 6}}
    for role in ("PS", "Worker"):
        assert tfjob["spec"]["tfReplicaSpecs"][role]["template"]["spec"]["schedulerName"] == name


def test_values_are_quoted_not_interpreted(cfg):
    """A data path or image that looks like YAML stays one string (the templates JSON-quote values)."""
    data = "/ckpt/a: b\n- c # d"
    configmap, tfjob = _render(cfg, data=data, image="reg:5000/img@sha256:abc")
    validate_tfjob(tfjob)
    c = _container(tfjob, "Worker")
    assert c["command"][-1] == data and c["image"] == "reg:5000/img@sha256:abc"
    assert config_from_dict(yaml.safe_load(configmap["data"]["config.yaml"])).data.path == data


def test_default_name_is_a_hash_of_the_config(cfg):
    a = _render(cfg)[1]["metadata"]["name"]
    assert a == _render(cfg, workers=5)[1]["metadata"]["name"]
    assert a.startswith("gmeta-") and len(a) == len("gmeta-") + 10
    other = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=7))
    assert _render(other)[1]["metadata"]["name"] != a
    assert default_job_name(cfg) != default_job_name(other)


# ------------------------------------------------------------------------- the validator can fail

@pytest.mark.parametrize("mutate,path", [
    (lambda d: d["spec"]["runPolicy"].__setitem__("backoffLimit", "three"), "spec.runPolicy.backoffLimit"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"].__setitem__("replicas", "two"),
     "spec.tfReplicaSpecs.Worker.replicas"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]["ports"][0]
     .__setitem__("containerPort", "2222"), "spec.tfReplicaSpecs.PS.template.spec.containers[0].ports[0].containerPort"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]
     .__setitem__("memory", "16GB"), "spec.tfReplicaSpecs.Worker.template.spec.containers[0].resources.limits.memory"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].pop("name"),
     "spec.tfReplicaSpecs.Worker.template.spec.containers[0]"),
    (lambda d: d["spec"].pop("tfReplicaSpecs"), "spec"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"].__setitem__("restartPolicy", "Sometimes"),
     "spec.tfReplicaSpecs.Worker.restartPolicy"),
    (lambda d: d["spec"]["runPolicy"].__setitem__("cleanPodPolicy", "Whenever"), "spec.runPolicy.cleanPodPolicy"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0].__setitem__("name", "main"),
     "no container named 'tensorflow'"),
    (lambda d: d.__setitem__("kind", "PyTorchJob"), "kind"),
])
def test_invalid_tfjob_fails_validation_naming_the_path(cfg, mutate, path):
    _, tfjob = _render(cfg)
    bad = copy.deepcopy(tfjob)
    mutate(bad)
    with pytest.raises(UserError) as exc:
        validate_tfjob(bad)
    msg = str(exc.value)
    assert path in msg
    assert "\n" not in msg
    validate_tfjob(tfjob)  # the original is untouched and valid


def test_schema_is_the_v1_openapi_schema():
    schema = tfjob_schema()
    assert schema["properties"]["spec"]["required"] == ["tfReplicaSpecs"]
    assert schema["properties"]["spec"]["properties"]["runPolicy"]["properties"]["backoffLimit"]["type"] == "integer"


def test_missing_crd_is_a_clear_error(tmp_path, monkeypatch):
    missing = tmp_path / "nope.yaml"
    monkeypatch.setenv(CRD_ENV, str(missing))
    with pytest.raises(UserError, match=f"TFJob CRD not found at {missing}.*{CRD_ENV}"):
        tfjob_schema()
    not_crd = tmp_path / "other.yaml"
    not_crd.write_text("apiVersion: v1\nkind: ConfigMap\n")
    monkeypatch.setenv(CRD_ENV, str(not_crd))
    with pytest.raises(UserError, match="no TFJob CustomResourceDefinition"):
        tfjob_schema()


# --------------------------------------------------------------------------------------- the CLI

BASE = ["render", "--config", QUICKSTART, "--image", "reg/gmeta:1", "--workers", "2", "--ps", "1"]


def _invoke(args):
    return CliRunner(mix_stderr=False).invoke(k8s_group, args)


def test_cli_render_stdout_is_valid_multidoc_yaml_with_overrides_baked_in():
    r = _invoke(BASE + ["--checkpoint-pvc", "ckpt", "--gpus-per-worker", "1", "--set", "meta.algo=fomaml",
                        "--set", "train.steps=11", "--name", "fomaml-1", "--data", "/ckpt/prepared",
                        "--worker-cpu", "8", "--worker-memory", "30Gi", "--ps-cpu", "500m", "--ps-memory", "2Gi"])
    assert r.exit_code == 0, r.output + r.stderr
    configmap, tfjob = yaml.safe_load_all(r.stdout)
    validate_tfjob(tfjob)
    cfg = config_from_dict(yaml.safe_load(configmap["data"]["config.yaml"]))
    assert (cfg.meta.algo, cfg.train.steps, cfg.data.path) == ("fomaml", 11, "/ckpt/prepared")
    assert tfjob["metadata"]["name"] == "fomaml-1"
    worker, ps = _container(tfjob, "Worker"), _container(tfjob, "PS")
    assert worker["resources"]["limits"] == {"cpu": "8", "memory": "30Gi", "nvidia.com/gpu": 1}
    assert ps["resources"]["limits"] == {"cpu": "500m", "memory": "2Gi"}
    assert worker["command"][worker["command"].index("--out") + 1] == "/ckpt/fomaml-1"


def test_cli_render_out_file_and_cluster_ps_note(tmp_path):
    out = tmp_path / "job.yaml"
    r = _invoke(BASE + ["--checkpoint-uri", "gs://b/run", "--set", "cluster.ps=[h:1]", "--out", str(out)])
    assert r.exit_code == 0, r.output + r.stderr
    assert "wrote" in r.stdout and "TFJob gmeta-" in r.stdout
    assert "cluster.ps (h:1) is cleared" in r.stderr
    configmap, tfjob = yaml.safe_load_all(out.read_text())
    validate_tfjob(tfjob)
    assert config_from_dict(yaml.safe_load(configmap["data"]["config.yaml"])).cluster.ps == []


def test_cli_render_without_crd_is_an_error_and_writes_nothing(tmp_path, monkeypatch):
    # Issue 14: a missing schema used to be a note on stderr and an unvalidated TFJob.
    missing = tmp_path / "missing.yaml"
    monkeypatch.setenv(CRD_ENV, str(missing))
    out = tmp_path / "job.yaml"
    r = _invoke(BASE + ["--checkpoint-pvc", "ckpt", "--out", str(out)])
    assert r.exit_code == 2, r.output + r.stderr
    assert f"TFJob CRD not found at {missing}" in r.stderr and CRD_ENV in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == "" and not out.exists()


def test_missing_crd_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setenv(CRD_ENV, str(tmp_path / "gone.yaml"))
    with pytest.raises(CrdNotFoundError):
        validate_tfjob({"apiVersion": "kubeflow.org/v1", "kind": "TFJob"})


def test_default_crd_is_the_vendored_copy_with_its_licence():
    here = crd_path()
    assert here == ROOT / "launch" / "schemas" / "kubeflow.org_tfjobs.v1.9.0.yaml"
    notice = (here.parent / "README.md").read_text()
    assert "kubeflow/training-operator" in notice and "v1.9.0" in notice and "Apache" in notice
    assert "Apache License" in (here.parent / "LICENSE-Apache-2.0").read_text()


@pytest.mark.parametrize("extra,needle", [
    (["--checkpoint-pvc", "c", "--name", "Bad_Name"], "--name 'Bad_Name' is not a valid Kubernetes name"),
    (["--checkpoint-pvc", "c", "--name", "1st-run"], "--name '1st-run' must start with a letter"),
    (["--checkpoint-pvc", "c", "--name", "a" * 60], "at most 54 fit"),
    ([], "a checkpoint location is required: --checkpoint-pvc"),
    (["--checkpoint-pvc", "c", "--checkpoint-uri", "gs://b/r"], "not both"),
    (["--checkpoint-uri", "/not/a/uri"], "--checkpoint-uri '/not/a/uri' must be a URI"),
    (["--checkpoint-pvc", "c", "--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["--checkpoint-pvc", "c", "--ps", "0"], "--ps must be an integer >= 1, got 0"),
    (["--checkpoint-pvc", "c", "--gpus-per-worker", "-1"], "--gpus-per-worker must be an integer >= 0, got -1"),
    (["--checkpoint-pvc", "c", "--worker-memory", "16GB"], "--worker-memory '16GB' is not a Kubernetes resource"),
    (["--checkpoint-pvc", "c", "--namespace", "ML"], "--namespace 'ML'"),
    (["--checkpoint-pvc", "c", "--set", "train.steps=-1"], "train.steps"),
])
def test_cli_bad_inputs_are_one_line_errors(extra, needle):
    r = _invoke(BASE + extra)
    assert r.exit_code == 2, r.output + r.stderr
    assert r.stdout == ""
    assert needle in r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr
