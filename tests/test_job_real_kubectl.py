"""``gmeta job`` with the real kubectl and no ``kubernetes`` client: why a call failed comes from
kubectl's data answers (issue 52, item 6), checked against kubectl itself rather than a fake.

The API server is a small HTTP server on loopback: discovery (``/api``, ``/apis``, the resource
lists), ``/version``, reads of TFJobs and pods, ``SelfSubjectAccessReview`` for ``auth can-i``,
with Kubernetes' own status codes. kubectl then asks and prints exactly what it prints against a
cluster; ``tests/test_job_tool.py``'s fake plays the same answers where kubectl is not installed.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
from kube_loopback import JsonHandler, closed_port, serve
from kube_loopback import cli_error as _error

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


class _Api(JsonHandler):
    protocol_version = "HTTP/1.1"
    groups = ["kubeflow.org"]
    jobs = {"there"}
    allowed = True

    def _status(self, code, reason, message):
        self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                          "code": code, "message": message})

    def _resources(self, group_version, resources):
        self._send(200, {"kind": "APIResourceList", "groupVersion": group_version, "resources": [
            {"name": name, "singularName": name.rstrip("s") if "/" not in name else "", "namespaced": True,
             "kind": kind, "verbs": ["get", "list", "create", "delete", "patch"]} for name, kind in resources]})

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path == "/version":
            return self._send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.2"})
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        if path == "/apis":
            groups = [*self.groups, "authorization.k8s.io"]
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}} for g in groups]})
        if path == "/api/v1":
            return self._resources("v1", [("pods", "Pod"), ("pods/log", "Pod"), ("configmaps", "ConfigMap")])
        if path == "/apis/kubeflow.org/v1" and "kubeflow.org" in self.groups:
            return self._resources("kubeflow.org/v1", [("tfjobs", "TFJob")])
        if path == "/apis/authorization.k8s.io/v1":
            return self._send(200, {"kind": "APIResourceList", "groupVersion": "authorization.k8s.io/v1", "resources": [
                {"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview", "namespaced": False,
                 "kind": "SelfSubjectAccessReview", "verbs": ["create"]}]})
        name = path.rsplit("/", 1)[-1]
        if not self.allowed:
            return self._status(403, "Forbidden", f'tfjobs.kubeflow.org "{name}" is forbidden: User "dev" cannot get '
                                                  'resource "tfjobs" in API group "kubeflow.org"')
        if "/tfjobs/" in path and name in self.jobs:
            return self._send(200, {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
                                    "metadata": {"name": name, "namespace": "ml"}})
        kind = "tfjobs.kubeflow.org" if "/tfjobs/" in path else "pods"
        return self._status(404, "NotFound", f'{kind} "{name}" not found')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if "selfsubjectaccessreviews" in self.path:
            body["status"] = {"allowed": self.allowed, **({} if self.allowed else {"reason": "no RBAC rule allows it"})}
            return self._send(201, body)
        return self._status(404, "NotFound", "not found")

    def do_DELETE(self):  # the job exists, but its deletion fails on the server
        self._status(500, "InternalError", "etcdserver: request timed out")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # no client: kubectl alone is asked
    monkeypatch.setenv("HOME", str(tmp_path))  # kubectl's discovery cache, this test's own
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", os.path.dirname(KUBECTL))

    yield from serve(_Api, tmp_path, monkeypatch)


def test_a_missing_job_and_pod(cluster):
    assert "TFJob gone not found on the cluster of kube context 'dev' (namespace ml)" in _error(["status", "gone"])
    assert "pod gone-ps-1 (TFJob gone, ps 1) not found on the cluster of kube context 'dev' (namespace ml)" in \
        _error(["logs", "gone", "--replica", "ps", "--index", "1"])


def test_a_cluster_without_the_training_operator(cluster):
    cluster.groups = []
    said = _error(["status", "x"])
    assert "'dev' has no TFJob resource: install the Kubeflow training operator" in said, said


def test_a_user_without_the_right(cluster):
    cluster.allowed = False
    said = _error(["status", "x"])
    assert "not authorized to get TFJob x on the cluster of kube context 'dev' (kubectl auth can-i get " \
           "tfjobs.kubeflow.org: no - no RBAC rule allows it)" in said, said


def test_a_context_the_kubeconfig_lacks(cluster):
    said = _error(["status", "x", "--context", "prod"])
    assert "kube context 'prod' does not exist in the kubeconfig (its contexts: dev;" in said, said


def test_an_api_server_that_does_not_answer(cluster):
    closed = closed_port()
    cluster.kubeconfig(closed)
    said = _error(["status", "x"])
    assert f"cannot reach the Kubernetes cluster of kube context 'dev' to get TFJob x: nothing accepts " \
           f"connections at http://127.0.0.1:{closed}; kubectl: " in said, said


def test_a_failure_no_answer_explains_is_kubectls_own_line(cluster):
    said = _error(["delete", "there"])
    assert said.startswith("error: kubectl failed to delete TFJob there (kube context 'dev'): ") and \
        "etcdserver: request timed out" in said, said
