"""``gmeta job render | submit | status | logs | delete``: a TFJob's life cycle on a cluster.

``render`` and ``submit`` take exactly ``gmeta k8s render``'s options (one decorator). Submission
uses ``kubectl apply -f -`` when kubectl is on PATH, else the ``kubernetes`` Python client;
``status``, ``logs`` and ``delete`` use kubectl. Every cluster failure is one line naming the kube
context (exit 2): an unreachable API server, a missing context, a cluster without the Kubeflow
training operator, a job that does not exist.

Why a kubectl call failed is asked of the cluster, never read from kubectl's message
(``kube_answers.py``): the ``kubernetes`` client's typed answers where it loads the kubeconfig,
else kubectl's own data answers (``-o json``, ``-o name``, ``auth can-i``, ``--ignore-not-found``)
and exit statuses; where none names a cause, kubectl's last line, verbatim.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

import click

from gmeta_tf import exit_codes
from gmeta_tf.cli.common import friendly_errors
from gmeta_tf.cli.k8s_cmd import RenderRequest, echo_notes, output_option, render_options, write_render
from gmeta_tf.cli.kube_answers import KubeCall, NotFoundOnCluster, ctx_phrase, explain, kubectl_base
from gmeta_tf.errors import ClusterError, UserError

KUBECTL_TIMEOUT_S = 120
_INSTALL = "install kubectl (https://kubernetes.io/docs/tasks/tools/) or `pip install kubernetes`"


@click.group("job")
def job_group():
    """Render, submit, watch and delete a TFJob on a Kubernetes cluster."""


# ----------------------------------------------------------------------------- kubectl helpers

def _kubectl() -> Optional[str]:
    return shutil.which("kubectl")


def _require_kubectl() -> str:
    path = _kubectl()
    if path is None:
        raise UserError("kubectl not found on PATH: install kubectl (https://kubernetes.io/docs/tasks/tools/)")
    return path


def _run(argv: List[str], input_text: Optional[str] = None, timeout: float = KUBECTL_TIMEOUT_S):
    try:
        stdin = {"input": input_text} if input_text is not None else {"stdin": subprocess.DEVNULL}
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **stdin)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(argv[:4])} ... did not answer in {timeout:.0f} s") from None
    except OSError as e:
        raise ClusterError(f"cannot run {argv[0]}: {e.strerror}") from None


def _cluster_error(stderr: str, context: Optional[str], kubectl: Optional[str], what: str,
                   access: Tuple[Tuple[str, ...], ...] = (), missing: Optional[Tuple[str, str, str]] = None,
                   namespace: Optional[str] = None) -> UserError:
    """A failed kubectl call as one line naming the kube context (``kube_answers.explain``).
    ``access``: the ``kubectl auth can-i`` questions the call needed; ``missing``: the object it
    named (kind, name, how to say it)."""
    return explain(stderr, context, namespace, kubectl, KubeCall(what, access, missing))


# ------------------------------------------------------------------------------------ commands

@job_group.command("render")
@render_options
@output_option
@friendly_errors
def render_cmd(request: RenderRequest, out_file):
    """Write the ConfigMap + TFJob YAML (same options as `gmeta k8s render`)."""
    write_render(request, out_file)


@job_group.command("submit")
@render_options
@click.option("--dry-run", is_flag=True, help="Print exactly what would be applied; apply nothing.")
@click.option("--context", default=None, help="kube context (default: kubectl's current context).")
@friendly_errors
def submit_cmd(request: RenderRequest, dry_run, context):
    """Render, then apply: `kubectl apply -f -`, or the kubernetes Python client without kubectl."""
    docs, text = request.yaml()
    echo_notes(request)
    if dry_run:
        click.echo(text, nl=False)
        return
    name = docs[1]["metadata"]["name"]
    kubectl = _kubectl()
    if kubectl is not None:
        proc = _run(kubectl_base(kubectl, context) + ["apply", "-f", "-"], input_text=text)
        if proc.returncode != 0:
            raise _cluster_error(proc.stderr, context, kubectl, f"submit TFJob {name}", namespace=request.namespace,
                             access=(("create", "tfjobs.kubeflow.org"), ("create", "configmaps")))
        out = proc.stdout.strip()
        if out:
            click.echo(out)
    else:
        for line in _apply_with_client(docs, context):
            click.echo(line)
    ns = f" --namespace {request.namespace}" if request.namespace else ""
    ctx = f" --context {context}" if context else ""
    click.echo(f"submitted TFJob {name}: gmeta job status {name}{ns}{ctx}; gmeta job logs {name}{ns}{ctx} -f")


def _apply_with_client(docs: List[Dict[str, Any]], context: Optional[str]) -> List[str]:
    """Create-or-replace the ConfigMap and the TFJob through the ``kubernetes`` Python client."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise UserError(f"cannot submit: kubectl is not on PATH and the kubernetes Python client is not "
                        f"installed: {_INSTALL}") from None
    ctx = ctx_phrase(context)
    try:
        config.load_kube_config(context=context)
        if not context:
            _, active = config.list_kube_config_contexts()
            ctx = ctx_phrase((active or {}).get("name"))
    except Exception as e:  # the client raises ConfigException, OSError, TypeError ... for a bad kubeconfig
        raise ClusterError(f"cannot load the kubeconfig for kube context {ctx}: {_first_line(e)}") from None
    namespace = docs[0]["metadata"].get("namespace") or _context_namespace(config, context) or "default"
    configmap, tfjob = docs
    name = tfjob["metadata"]["name"]
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    out = []
    try:
        cm_name = configmap["metadata"]["name"]
        if _create_or_replace(
            lambda: core.create_namespaced_config_map(namespace, configmap),
            lambda: core.replace_namespaced_config_map(cm_name, namespace, configmap),
        ):
            out.append(f"configmap/{cm_name} configured")
        else:
            out.append(f"configmap/{cm_name} created")
        crd = {"group": "kubeflow.org", "version": "v1", "namespace": namespace, "plural": "tfjobs"}

        def replace_tfjob():
            live = custom.get_namespaced_custom_object(name=name, **crd)
            body = dict(tfjob, metadata={**tfjob["metadata"],
                                         "resourceVersion": live["metadata"]["resourceVersion"]})
            custom.replace_namespaced_custom_object(name=name, body=body, **crd)

        if _create_or_replace(lambda: custom.create_namespaced_custom_object(body=tfjob, **crd), replace_tfjob):
            out.append(f"tfjob.kubeflow.org/{name} configured")
        else:
            out.append(f"tfjob.kubeflow.org/{name} created")
    except UserError:
        raise
    except Exception as e:  # ApiException, urllib3 connection errors ...: one line, never a trace
        status = getattr(e, "status", None)
        if status == 404:
            raise ClusterError(f"the cluster of kube context {ctx} has no TFJob resource: install the "
                               "Kubeflow training operator (v1.9) first") from None
        if status in (401, 403):
            raise ClusterError(f"not authorized to submit TFJob {name} on the cluster of kube context "
                               f"{ctx}: {status} {getattr(e, 'reason', '')}".rstrip()) from None
        if status is not None:
            raise ClusterError(f"the cluster of kube context {ctx} rejected TFJob {name}: {status} "
                               f"{getattr(e, 'reason', '')}: {_first_line(getattr(e, 'body', '') or '')}") from None
        raise ClusterError(f"cannot reach the Kubernetes cluster of kube context {ctx} to submit TFJob "
                           f"{name}: {_first_line(e)}") from None
    return out


def _create_or_replace(create, replace) -> bool:
    """Create; on 409 (exists) replace. True when it replaced."""
    try:
        create()
        return False
    except Exception as e:
        if getattr(e, "status", None) != 409:
            raise
    replace()
    return True


def _context_namespace(config, context: Optional[str]) -> Optional[str]:
    try:
        contexts, active = config.list_kube_config_contexts()
        chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
        return ((chosen or {}).get("context") or {}).get("namespace")
    except Exception:
        return None


def _first_line(e: Any) -> str:
    text = str(e).strip() or type(e).__name__
    line = text.splitlines()[0]
    return line if len(line) <= 300 else line[:297] + "..."


def _cluster_options(f):
    f = click.option("--namespace", "-n", default=None, help="Namespace (default: kubectl's).")(f)
    f = click.option("--context", default=None, help="kube context (default: kubectl's current context).")(f)
    return f


@job_group.command("status")
@click.argument("name")
@_cluster_options
@friendly_errors
def status_cmd(name, context, namespace):
    """Print a TFJob's conditions and replica counts (`kubectl get tfjob NAME -o json`)."""
    kubectl = _require_kubectl()
    proc = _run(kubectl_base(kubectl, context, namespace) + ["get", "tfjob", name, "-o", "json"])
    if proc.returncode != 0:
        raise _cluster_error(proc.stderr, context, kubectl, f"get TFJob {name}", access=(("get", "tfjobs.kubeflow.org"),),
                             missing=("tfjob", name, f"TFJob {name}"), namespace=namespace)
    try:
        job = json.loads(proc.stdout)
    except ValueError:
        raise ClusterError(f"kubectl get tfjob {name} -o json did not print JSON: {proc.stdout[:200]!r}") from None
    for line in format_status(job):
        click.echo(line)


def format_status(job: Dict[str, Any]) -> List[str]:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    conditions = status.get("conditions") or []
    state = next((c.get("type") for c in reversed(conditions) if c.get("status") == "True"), None)
    ns = f" (namespace {meta['namespace']})" if meta.get("namespace") else ""
    lines = [f"TFJob {meta.get('name', '?')}{ns}: {state or 'Pending'}"]
    if not conditions:
        lines.append("  no conditions yet: is the Kubeflow training operator running?")
    rows = [(c.get("type", ""), c.get("status", ""), c.get("reason", ""), c.get("lastTransitionTime", ""),
             c.get("message", "")) for c in conditions]
    if rows:
        widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
        for r in rows:
            lines.append("  " + "  ".join(str(r[i]).ljust(widths[i]) for i in range(4)) + f"  {r[4]}".rstrip())
    for rtype, counts in sorted((status.get("replicaStatuses") or {}).items()):
        counts = counts or {}
        lines.append(f"  {rtype}: active {counts.get('active', 0)}, succeeded {counts.get('succeeded', 0)}, "
                     f"failed {counts.get('failed', 0)}")
    return lines


@job_group.command("logs")
@click.argument("name")
@click.option("--replica", type=click.Choice(["worker", "ps"]), default="worker", show_default=True)
@click.option("--index", type=click.IntRange(min=0), default=0, show_default=True, help="Replica index.")
@click.option("-f", "--follow", is_flag=True, help="Stream the log until the pod ends.")
@_cluster_options
@friendly_errors
def logs_cmd(name, replica, index, follow, context, namespace):
    """Print the log of one pod's `tensorflow` container (pod <NAME>-<replica>-<index>)."""
    kubectl = _require_kubectl()
    pod = f"{name}-{replica}-{index}"
    argv = kubectl_base(kubectl, context, namespace) + ["logs", pod, "-c", "tensorflow"] + (["-f"] if follow else [])
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    except OSError as e:
        raise ClusterError(f"cannot run {kubectl}: {e.strerror}") from None
    try:
        for line in proc.stdout:
            click.echo(line, nl=False)
        stderr = proc.stderr.read()
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        sys.exit(exit_codes.INTERRUPTED.code)
    if rc != 0:
        raise _cluster_error(stderr, context, kubectl, f"read the log of pod {pod}",
                             access=(("get", "pods", "--subresource=log"),),
                             missing=("pod", pod, f"pod {pod} (TFJob {name}, {replica} {index})"), namespace=namespace)


@job_group.command("delete")
@click.argument("name")
@_cluster_options
@friendly_errors
def delete_cmd(name, context, namespace):
    """Delete a TFJob (its pods go with it) and its ConfigMap <NAME>-config."""
    kubectl = _require_kubectl()
    base = kubectl_base(kubectl, context, namespace)
    job = _run(base + ["delete", "tfjob", name])
    failed = None if job.returncode == 0 else _cluster_error(
        job.stderr, context, kubectl, f"delete TFJob {name}", access=(("delete", "tfjobs.kubeflow.org"),),
        missing=("tfjob", name, f"TFJob {name}"), namespace=namespace)
    if failed is not None and not isinstance(failed, NotFoundOnCluster):
        raise failed
    cm = _run(base + ["delete", "configmap", f"{name}-config", "--ignore-not-found"])  # a job gone, its config too
    if cm.returncode != 0:
        raise _cluster_error(cm.stderr, context, kubectl, f"delete ConfigMap {name}-config", namespace=namespace,
                             access=(("delete", "configmaps"),))
    for out in (job.stdout, cm.stdout):
        if out.strip():
            click.echo(out.strip())
    if failed is not None:
        raise failed
