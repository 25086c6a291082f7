"""``gmeta job``: dry-run output, and every no-cluster path as one clear line (never a trace).

No cluster is needed: a fake ``kubectl`` on PATH plays an unreachable API server
(with the real kubectl's messages and data answers: tests/fake_kubectl.py), a healthy one, or is
absent altogether.
"""
from __future__ import annotations

import json
import socket
import stat
import sys
import types
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from fake_kubectl import REFUSED

from gmeta_tf.cli.job_cmd import format_status, job_group
from gmeta_tf.cli.k8s_cmd import k8s_group
from gmeta_tf.config.loader import config_from_dict
from launch.k8s_render import validate_tfjob

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
RENDER = ["--config", QUICKSTART, "--image", "reg/gmeta:1", "--workers", "4", "--ps", "2",
          "--gpus-per-worker", "1", "--checkpoint-pvc", "ckpt", "--name", "maml-run", "--set", "train.steps=9"]

FAKE_KUBECTL = Path(__file__).with_name("fake_kubectl.py")  # what each call answers, and why
CONTEXTS = "kind-gmeta-dev prod-east prod minikube kind-dev"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Put a fake kubectl first (and alone) on PATH; returns a helper to read what it was asked.
    No kubeconfig the ``kubernetes`` client could load: kubectl alone is asked why a call failed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f"#!{sys.executable}\n" + FAKE_KUBECTL.read_text())
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("FAKE_STDIN", str(tmp_path / "stdin.yaml"))
    monkeypatch.setenv("FAKE_JSON", str(tmp_path / "tfjob.json"))
    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.setenv("FAKE_CONTEXTS", CONTEXTS)
    monkeypatch.setenv("FAKE_SERVER", f"https://127.0.0.1:{_closed_port()}")  # nothing listens there
    for name in ("FAKE_CONTEXT", "FAKE_SAYS", "FAKE_BROKEN", "FAKE_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)

    class Fake:
        def calls(self):
            log = tmp_path / "calls.log"
            return log.read_text().splitlines() if log.exists() else []

        def stdin(self):
            return (tmp_path / "stdin.yaml").read_text()

        def mode(self, mode, context=None, says=None):
            monkeypatch.setenv("FAKE_MODE", mode)
            if context:
                monkeypatch.setenv("FAKE_CONTEXT", context)
            if says:
                monkeypatch.setenv("FAKE_SAYS", says)

        def setenv(self, name, value):
            monkeypatch.setenv(name, value)

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
    calls = fake.calls()
    assert calls[0] == "--context prod-east apply -f -"
    # Why it failed is asked of that context too (the kubeconfig's list of contexts is no context's).
    assert calls[1:] and all(c.startswith("--context prod-east ") for c in calls if c != "config get-contexts -o name")


def test_no_cluster_and_no_current_context(fake):
    fake.mode("down")
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context the current context")


def test_cluster_without_training_operator(fake):
    fake.mode("nocrd", context="minikube")
    r = _invoke(job_group, ["submit", *RENDER])
    _one_line_error(r, "'minikube' has no TFJob resource", "training operator",
                    "kubectl api-resources --api-group kubeflow.org lists no tfjobs")


@pytest.mark.parametrize("args", [["status", "maml-run"], ["logs", "maml-run"], ["delete", "maml-run"]])
def test_other_commands_without_cluster(fake, args):
    fake.mode("down", context="kind-gmeta-dev")
    r = _invoke(job_group, args)
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context 'kind-gmeta-dev'")


# ------------------------------------- why a call failed: kubectl's data answers, not its wording

# Lines a kubectl of another version (or language, or plugin) could print for each cause; the
# old code sorted stderr by regular expressions and blamed by these words (issue 52, item 6).
MISLEADING = "error: You must be logged in to the server (the server has asked for the client to provide credentials)"


@pytest.mark.parametrize("says", [REFUSED, 'Fehler vom Server: tfjobs.kubeflow.org "maml-run" existiert nicht'])
def test_a_missing_job_is_said_so_whatever_kubectl_printed(fake, says):
    """`get tfjob NAME --ignore-not-found -o json` prints nothing: the job does not exist (the old
    code said "cannot reach the cluster" for the first line and a bare failure for the second)."""
    fake.mode("notfound", context="kind-dev", says=says)
    fake.setenv("FAKE_NAMESPACE", "ml")
    _one_line_error(_invoke(job_group, ["status", "maml-run"]),
                    "TFJob maml-run not found on the cluster of kube context 'kind-dev' (namespace ml)")
    r = _invoke(job_group, ["logs", "maml-run", "--index", "3", "-n", "team"])
    _one_line_error(r, "pod maml-run-worker-3 (TFJob maml-run, worker 3) not found", "(namespace team)")
    assert "--context kind-dev" not in " ".join(fake.calls())  # no --context given: kubectl's current one
    assert "--namespace team get pod maml-run-worker-3 --ignore-not-found -o json" in fake.calls()
    r = _invoke(job_group, ["delete", "maml-run"])
    _one_line_error(r, "TFJob maml-run not found")
    assert "cannot reach" not in r.stderr


def test_an_unreachable_cluster_is_found_by_connecting_not_by_kubectls_words(fake):
    """`kubectl version -o json` has no serverVersion and nothing listens at the server
    `config view --minify -o json` names (the old code read "logged in" and said "not authorized")."""
    fake.mode("down", context="kind-gmeta-dev", says=MISLEADING)
    r = _invoke(job_group, ["status", "maml-run"])
    _one_line_error(r, "cannot reach the Kubernetes cluster of kube context 'kind-gmeta-dev' to get TFJob maml-run",
                    "nothing accepts connections at https://127.0.0.1:", MISLEADING)
    assert "not authorized" not in r.stderr


def test_an_api_server_that_listens_but_does_not_answer_gets_kubectls_own_line(fake):
    """Credentials refused, a TLS mismatch, a proxy: nothing the answers name. kubectl's line,
    verbatim and unsorted, with the context."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    try:
        fake.setenv("FAKE_SERVER", f"https://127.0.0.1:{listening.getsockname()[1]}")
        fake.mode("down", context="kind-gmeta-dev", says=MISLEADING)
        r = _invoke(job_group, ["status", "maml-run"])
    finally:
        listening.close()
    _one_line_error(r, f"kubectl failed to get TFJob maml-run (kube context 'kind-gmeta-dev'): {MISLEADING}")


def test_a_context_the_kubeconfig_lacks_whatever_kubectl_printed(fake):
    """kubectl 1.32 says "context was not found for specified context" (the old code only knew
    "context ... does not exist"); `config get-contexts -o name` lists the contexts."""
    fake.mode("ok", context="kind-dev")
    r = _invoke(job_group, ["status", "maml-run", "--context", "nope"])
    _one_line_error(r, "kube context 'nope' does not exist in the kubeconfig", "its contexts: kind-gmeta-dev, prod-east")


def test_a_cluster_without_the_operator_whatever_kubectl_printed(fake):
    fake.mode("nocrd", context="minikube", says='error: unable to recognize "STDIN": unknown kind TFJob')
    _one_line_error(_invoke(job_group, ["submit", *RENDER]), "'minikube' has no TFJob resource")
    assert "api-resources --api-group kubeflow.org -o name" in " ".join(fake.calls())


def test_a_user_without_the_right_is_told_by_auth_can_i(fake):
    fake.mode("forbidden", context="kind-dev", says="Error from server: access denied")
    r = _invoke(job_group, ["delete", "maml-run"])
    _one_line_error(r, "not authorized to delete TFJob maml-run on the cluster of kube context 'kind-dev' "
                       "(kubectl auth can-i delete tfjobs.kubeflow.org: no)")


def test_a_failure_no_answer_explains_is_quoted_not_sorted(fake):
    """The cluster answers, serves TFJobs, allows the call and has the job, yet kubectl failed with
    words the old code sorted as "no TFJob resource" ("could not find the requested resource")."""
    fake.tfjob_json(JOB)
    line = "Error from server (NotFound): the server could not find the requested resource"
    fake.mode("broken", context="kind-dev")
    fake.setenv("FAKE_BROKEN", line)
    r = _invoke(job_group, ["status", "maml-run"])
    _one_line_error(r, f"kubectl failed to get TFJob maml-run (kube context 'kind-dev'): {line}")
    assert "not found on the cluster" not in r.stderr and "has no TFJob resource" not in r.stderr


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
