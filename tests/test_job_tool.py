"""``gmeta job``: dry-run output, and every no-cluster path as one clear line (never a trace).

No cluster is needed: a fake ``kubectl`` shell script on PATH plays an unreachable API server
(with the real kubectl's messages), a healthy one, or is absent altogether.
"""
from __future__ import annotations

import json
import stat
import sys
import types
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gmeta_tf.cli.job_cmd import format_status, job_group
from gmeta_tf.cli.k8s_cmd import k8s_group
from gmeta_tf.config.loader import config_from_dict
from launch.k8s_render import validate_tfjob

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
RENDER = ["--config", QUICKSTART, "--image", "reg/gmeta:1", "--workers", "4", "--ps", "2",
          "--gpus-per-worker", "1", "--checkpoint-pvc", "ckpt", "--name", "maml-run", "--set", "train.steps=9"]

REFUSED = "The connection to the server localhost:8080 was refused - did you specify the right host or port?"
KLOG = ('E1121 01:25:10.099215   19950 memcache.go:265] "Unhandled Error" err="couldn\'t get current server API '
        'group list: Get \\"http://localhost:8080/api?timeout=32s\\": dial tcp 127.0.0.1:8080: connect: '
        'connection refused"')

# A stand-in for kubectl. FAKE_MODE: down (API server unreachable), nocrd (no TFJob kind),
# notfound, ok. FAKE_CONTEXT: what `kubectl config current-context` prints (unset: no context).
FAKE_KUBECTL = r"""#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$*" in
  *"config current-context"*)
    if [ -n "$FAKE_CONTEXT" ]; then echo "$FAKE_CONTEXT"; exit 0; fi
    echo "error: current-context is not set" >&2; exit 1;;
esac
case "$*" in *" apply "*|apply*) /bin/cat > "$FAKE_STDIN";; esac
case "$FAKE_MODE" in
  down)
    for i in 1 2 3; do echo '__KLOG__' >&2; done
    echo "__REFUSED__" >&2; exit 1;;
  nocrd)
    echo 'error: resource mapping not found for name: "maml-run" namespace: "" from "STDIN": no matches for kind "TFJob" in version "kubeflow.org/v1"' >&2
    echo 'ensure CRDs are installed first' >&2; exit 1;;
  notfound)
    case "$*" in *--ignore-not-found*) exit 0;; esac
    echo 'Error from server (NotFound): tfjobs.kubeflow.org "maml-run" not found' >&2; exit 1;;
esac
case "$*" in
  *" apply "*|apply*) echo "configmap/maml-run-config created"; echo "tfjob.kubeflow.org/maml-run created";;
  *"get tfjob"*) /bin/cat "$FAKE_JSON";;
  *" logs "*|logs*) echo "step 100 loss 0.51"; echo "step 200 loss 0.43";;
  *"delete tfjob"*) echo 'tfjob.kubeflow.org "maml-run" deleted';;
  *"delete configmap"*) echo 'configmap "maml-run-config" deleted';;
esac
exit 0
""".replace("__KLOG__", KLOG.replace("'", "'\\''")).replace("__REFUSED__", REFUSED)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Put a fake kubectl first (and alone) on PATH; returns a helper to read what it was asked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(FAKE_KUBECTL)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("FAKE_STDIN", str(tmp_path / "stdin.yaml"))
    monkeypatch.setenv("FAKE_JSON", str(tmp_path / "tfjob.json"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.delenv("FAKE_CONTEXT", raising=False)

    class Fake:
        def calls(self):
            log = tmp_path / "calls.log"
            return log.read_text().splitlines() if log.exists() else []

        def stdin(self):
            return (tmp_path / "stdin.yaml").read_text()

        def mode(self, mode, context=None):
            monkeypatch.setenv("FAKE_MODE", mode)
            if context:
                monkeypatch.setenv("FAKE_CONTEXT", context)

        def tfjob_json(self, doc):
            (tmp_path / "tfjob.json").write_text(json.dumps(doc))

    return Fake()


def _invoke(group, args):
    return CliRunner(mix_stderr=False).invoke(group, args)


def _one_line_error(r, *needles):
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr, r.exception)
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    for needle in needles:
        assert needle in r.stderr, r.stderr


# ---------------------------------------------------------------------------- render / dry run

def test_dry_run_prints_exactly_what_would_be_applied_and_applies_nothing(fake):
    r = _invoke(job_group, ["submit", "--dry-run", *RENDER])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert fake.calls() == []  # kubectl was never run
    configmap, tfjob = yaml.safe_load_all(r.stdout)
    validate_tfjob(tfjob)
    assert tfjob["metadata"]["name"] == "maml-run"
    assert tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 4
    assert config_from_dict(yaml.safe_load(configmap["data"]["config.yaml"])).train.steps == 9
    # The same bytes `job render` and `k8s render` write, and that a real submit pipes to kubectl.
    assert _invoke(job_group, ["render", *RENDER]).stdout == r.stdout
    assert _invoke(k8s_group, ["render", *RENDER]).stdout == r.stdout
    ok = _invoke(job_group, ["submit", "--context", "prod", *RENDER])
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert fake.stdin() == r.stdout
    assert fake.calls() == ["--context prod apply -f -"]
    assert "tfjob.kubeflow.org/maml-run created" in ok.stdout
    assert "gmeta job status maml-run --context prod" in ok.stdout


def test_submit_bad_input_fails_before_kubectl(fake):
    r = _invoke(job_group, ["submit", *RENDER, "--name", "Not_OK"])
    _one_line_error(r, "--name 'Not_OK'")
    assert fake.calls() == []


# --------------------------------------------------------------------------------- no cluster

def test_no_cluster_names_the_current_context(fake):
    fake.mode("down", context="kind-gmeta-dev")
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context 'kind-gmeta-dev'", REFUSED)
    assert "memcache.go" not in r.stderr  # klog noise is not quoted
    assert fake.calls()[0] == "apply -f -"
    assert "config current-context" in fake.calls()[1]


def test_no_cluster_names_the_context_option(fake):
    fake.mode("down", context="kind-gmeta-dev")
    r = _invoke(job_group, ["submit", "--context", "prod-east", *RENDER])
    _one_line_error(r, "kube context 'prod-east'", "localhost:8080 was refused")
    assert "kind-gmeta-dev" not in r.stderr
    assert fake.calls() == ["--context prod-east apply -f -"]


def test_no_cluster_and_no_current_context(fake):
    fake.mode("down")
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context the current context")


def test_cluster_without_training_operator(fake):
    fake.mode("nocrd", context="minikube")
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "'minikube' has no TFJob resource", "training operator", 'no matches for kind "TFJob"')


@pytest.mark.parametrize("args", [["status", "maml-run"], ["logs", "maml-run"], ["delete", "maml-run"]])
def test_other_commands_without_cluster(fake, args):
    fake.mode("down", context="kind-gmeta-dev")
    r = _invoke(job_group, args)
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context 'kind-gmeta-dev'")


def test_no_kubectl_and_no_client(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # `import kubernetes` raises ImportError
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "kubectl is not on PATH", "install kubectl")
    for args in (["status", "x"], ["logs", "x"], ["delete", "x"]):
        _one_line_error(_invoke(job_group, args), "kubectl not found on PATH", "install kubectl")
    # --dry-run needs neither.
    assert _invoke(job_group, ["submit", "--dry-run", *RENDER]).exit_code == 0


def _fake_client(tmp_path, monkeypatch, create_error=None):
    """A minimal ``kubernetes`` package: kubeconfig loads; create calls record or raise."""
    created = []

    class Api:
        def create_namespaced_config_map(self, namespace, body):
            created.append(("ConfigMap", namespace, body["metadata"]["name"]))

        def create_namespaced_custom_object(self, group, version, namespace, plural, body):
            if create_error is not None:
                raise create_error
            created.append((body["kind"], namespace, body["metadata"]["name"]))

    config = types.SimpleNamespace(
        load_kube_config=lambda context=None: None,
        list_kube_config_contexts=lambda: ([{"name": "gke-prod", "context": {"namespace": "ml"}}],
                                           {"name": "gke-prod", "context": {"namespace": "ml"}}),
    )
    client = types.SimpleNamespace(CoreV1Api=Api, CustomObjectsApi=Api)
    module = types.ModuleType("kubernetes")
    module.client, module.config = client, config
    monkeypatch.setitem(sys.modules, "kubernetes", module)
    empty = tmp_path / "nokubectl"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    return created


def test_python_client_is_used_without_kubectl(tmp_path, monkeypatch):
    created = _fake_client(tmp_path, monkeypatch)
    r = _invoke(job_group, ["submit", *RENDER])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert created == [("ConfigMap", "ml", "maml-run-config"), ("TFJob", "ml", "maml-run")]
    assert "tfjob.kubeflow.org/maml-run created" in r.stdout


def test_python_client_unreachable_cluster(tmp_path, monkeypatch):
    error = ConnectionRefusedError(111, "Connection refused")
    _fake_client(tmp_path, monkeypatch, create_error=error)
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context 'gke-prod'", "Connection refused")


# ------------------------------------------------------------------------ status / logs / delete

JOB = {
    "apiVersion": "kubeflow.org/v1", "kind": "TFJob",
    "metadata": {"name": "maml-run", "namespace": "ml"},
    "status": {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "TFJobCreated",
             "message": "TFJob ml/maml-run is created.", "lastTransitionTime": "2024-05-01T10:00:00Z"},
            {"type": "Running", "status": "True", "reason": "TFJobRunning",
             "message": "TFJob ml/maml-run is running.", "lastTransitionTime": "2024-05-01T10:01:00Z"},
        ],
        "replicaStatuses": {"PS": {"active": 2}, "Worker": {"active": 3, "failed": 1}},
    },
}


def test_status_prints_conditions(fake):
    fake.tfjob_json(JOB)
    r = _invoke(job_group, ["status", "maml-run", "-n", "ml", "--context", "prod"])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert fake.calls() == ["--context prod --namespace ml get tfjob maml-run -o json"]
    lines = r.stdout.splitlines()
    assert lines[0] == "TFJob maml-run (namespace ml): Running"
    assert any("Created" in ln and "TFJobCreated" in ln for ln in lines)
    assert any("Running" in ln and "TFJob ml/maml-run is running." in ln for ln in lines)
    assert "  Worker: active 3, succeeded 0, failed 1" in lines
    assert format_status({"metadata": {"name": "x"}})[1].startswith("  no conditions yet")


def test_status_of_a_missing_job(fake):
    fake.mode("notfound", context="kind-dev")
    _one_line_error(_invoke(job_group, ["status", "maml-run"]), "TFJob maml-run not found", "'kind-dev'")


def test_logs_and_delete_of_a_missing_job(fake):
    fake.mode("notfound", context="kind-dev")
    _one_line_error(_invoke(job_group, ["logs", "maml-run", "--index", "3"]),
                    "pod maml-run-worker-3 (TFJob maml-run, worker 3) not found", "'kind-dev'")
    r = _invoke(job_group, ["delete", "maml-run"])
    _one_line_error(r, "TFJob maml-run not found", "'kind-dev'")
    assert "delete configmap maml-run-config --ignore-not-found" in fake.calls()  # still cleaned up


def test_logs_reads_the_tensorflow_container_of_the_right_pod(fake):
    r = _invoke(job_group, ["logs", "maml-run", "--replica", "ps", "--index", "1", "-f"])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert r.stdout == "step 100 loss 0.51\nstep 200 loss 0.43\n"
    assert fake.calls() == ["logs maml-run-ps-1 -c tensorflow -f"]
    _invoke(job_group, ["logs", "maml-run"])
    assert fake.calls()[-1] == "logs maml-run-worker-0 -c tensorflow"


def test_delete_removes_the_job_and_its_configmap(fake):
    r = _invoke(job_group, ["delete", "maml-run"])
    assert r.exit_code == 0, r.stdout + r.stderr
    assert fake.calls() == ["delete tfjob maml-run", "delete configmap maml-run-config --ignore-not-found"]
    assert 'tfjob.kubeflow.org "maml-run" deleted' in r.stdout
