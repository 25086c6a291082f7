"""``gmeta job``: why a kubectl call failed is the cluster's typed answer, not kubectl's wording
(issue 52, item 6).

kubectl here always fails with the same misleading message ("connection refused"); the cluster
behind the kubeconfig says what is really wrong, through the ``kubernetes`` client: a context the
kubeconfig lacks, an API server that does not answer, one without the ``kubeflow.org`` API, a
TFJob that does not exist (404), a user without the right (403). The API server is a small HTTP
server on loopback answering the three reads the client makes, with Kubernetes' own status codes.
"""
from __future__ import annotations

import stat

import pytest
from kube_loopback import JsonHandler, closed_port, serve
from kube_loopback import cli_error as _error

MISLEADING = "The connection to the server localhost:8080 was refused - did you specify the right host or port?"
KUBECTL = f"""#!/bin/sh
case "$*" in *"config current-context"*) echo "dev"; exit 0;; *"delete configmap"*) exit 0;; esac
echo "{MISLEADING}" >&2
exit 1
"""


class _Api(JsonHandler):
    groups = ["apps", "kubeflow.org"]
    jobs = {"there"}
    forbidden = False

    def do_GET(self):
        if self.forbidden:
            return self._send(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403})
        if self.path.startswith("/apis") and self.path.rstrip("/") == "/apis":
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}]} for g in self.groups]})
        name = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        if "/tfjobs/" in self.path and name in self.jobs:
            return self._send(200, {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": name}})
        return self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(KUBECTL)
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))

    yield from serve(_Api, tmp_path, monkeypatch)


def test_a_job_that_does_not_exist_is_said_so_whatever_kubectl_printed(cluster):
    assert "TFJob gone not found on the cluster of kube context 'dev' (namespace ml)" in _error(["status", "gone"])
    said = _error(["delete", "gone"])
    assert "TFJob gone not found" in said and "cannot reach" not in said


def test_a_cluster_without_the_training_operator(cluster):
    cluster.groups = ["apps"]
    assert "'dev' has no TFJob resource: install the Kubeflow training operator" in _error(["status", "x"])


def test_a_user_without_the_right(cluster):
    cluster.forbidden = True
    assert "not authorized to get TFJob x on the cluster of kube context 'dev': 403" in _error(["status", "x"])


def test_a_context_the_kubeconfig_lacks(cluster):
    assert "kube context 'prod' does not exist in the kubeconfig" in _error(["status", "x", "--context", "prod"])


def test_a_cluster_that_names_nothing_wrong_gets_kubectls_own_line_unsorted(cluster):
    said = _error(["status", "there"])  # the job exists, the API answers: kubectl failed for its own reason
    assert said.startswith("error: kubectl failed to get TFJob there (kube context 'dev'): ") and \
        "cannot reach" not in said, said


def test_an_api_server_that_does_not_answer(cluster):
    closed = closed_port()
    cluster.kubeconfig(closed)
    said = _error(["status", "x"])
    assert "cannot reach the Kubernetes cluster of kube context 'dev' to get TFJob x" in said, said
