"""``gmeta job render | submit | status | logs | delete``: a TFJob's life cycle on a cluster.

``render`` and ``submit`` take exactly ``gmeta k8s render``'s options (one decorator). Submission
uses ``kubectl apply -f -`` when kubectl is on PATH, else the ``kubernetes`` Python client;
``status``, ``logs`` and ``delete`` use kubectl. Every cluster failure is one line naming the kube
context (exit 2): an unreachable API server, a missing context, a cluster without the Kubeflow
training operator, a job that does not exist.

Why a kubectl call failed is asked of the cluster, not read from kubectl's message: kubectl's exit
status says only that it failed, and its wording changes between versions. The ``kubernetes``
client answers with types (the kubeconfig's contexts, a connection error, an HTTP status:
``_ask_cluster``). Only where the client cannot ask (not installed, a kubeconfig it cannot load,
an auth plugin it lacks) is kubectl's message sorted as before (``_by_message``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

import click

from gmeta_tf import exit_codes
from gmeta_tf.cli.common import friendly_errors
from gmeta_tf.cli.k8s_cmd import RenderRequest, echo_notes, output_option, render_options, write_render
from gmeta_tf.errors import ClusterError, UserError

KUBECTL_TIMEOUT_S = 120
_INSTALL = "install kubectl (https://kubernetes.io/docs/tasks/tools/) or `pip install kubernetes`"

# kubectl's stderr, classified where the cluster cannot be asked (``_by_message``). Newer kubectl prefixes client-go errors with klog headers
# ("E1121 01:25:10.099215 19950 memcache.go:265] ..."): those lines are skipped when quoting.
_KLOG = re.compile(r"^[EIWF]\d{4} \d\d:\d\d:\d\d")
_UNREACHABLE = re.compile(
    r"connection to the server .* was refused|unable to connect to the server|connection refused|"
    r"no such host|i/o timeout|tls handshake timeout|no route to host|network is unreachable|"
    r"current-context is not set|no configuration has been provided|dial tcp", re.I)
_NO_CONTEXT = re.compile(r'context "[^"]*" does not exist|no context exists with the name', re.I)
_UNAUTHORIZED = re.compile(r"unauthorized|must be logged in|forbidden", re.I)
_NO_CRD = re.compile(r'no matches for kind "TFJob"|doesn\'t have a resource type "tfjobs?"|'
                     r"could not find the requested resource", re.I)
_NOT_FOUND = re.compile(r"\(NotFound\)|\bnot found\b", re.I)


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


def _base(kubectl: str, context: Optional[str], namespace: Optional[str] = None) -> List[str]:
    argv = [kubectl]
    if context:
        argv += ["--context", context]
    if namespace:
        argv += ["--namespace", namespace]
    return argv


def current_context(context: Optional[str], kubectl: Optional[str] = None) -> str:
    """The kube context a command uses: ``--context``, else kubectl's current one, else a phrase."""
    if context:
        return context
    kubectl = kubectl or _kubectl()
    if kubectl:
        try:
            proc = subprocess.run([kubectl, "config", "current-context"], capture_output=True, text=True,
                                  timeout=15, stdin=subprocess.DEVNULL)
            if proc.returncode == 0 and proc.stdout.strip():
                return proc.stdout.strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "the current context"


def _ctx(name: str) -> str:
    return name if name == "the current context" else f"'{name}'"


def _summary(stderr: str, pattern: Optional[re.Pattern] = None) -> str:
    """kubectl's one meaningful line: the last line that is not a klog header line (preferring
    one that matches ``pattern``)."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    plain = [ln for ln in lines if not _KLOG.match(ln)]
    matching = [ln for ln in plain if pattern is not None and pattern.search(ln)]
    line = (matching or plain or lines or ["(no message)"])[-1]
    line = re.sub(r"^error:\s*", "", line)
    return line if len(line) <= 300 else line[:297] + "..."


class NotFoundOnCluster(UserError):
    """The object a command names does not exist on the cluster."""


def _ask_cluster(context: Optional[str], namespace: Optional[str], ctx: str, what: str, stderr: str,
                 missing: Optional[Tuple[str, str, str]] = None) -> Tuple[bool, Optional[UserError]]:
    """Why a kubectl call failed, from the cluster's typed answers through the ``kubernetes``
    client: the kubeconfig's contexts, whether the API server answers, whether it serves
    ``kubeflow.org``, the HTTP status of a read of ``missing`` (kind "tfjob" or "pod", its name,
    how to say it). Returns whether the cluster could be asked, and what it says is wrong (None:
    nothing it can name)."""
    try:
        import urllib3
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
    except ImportError:
        return False, None
    # kubectl's own lookup, read now (the client reads $KUBECONFIG once, at its import)
    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception:  # no kubeconfig the client can load (ConfigException, OSError, YAML errors ...)
        return False, None
    named = {c.get("name"): c for c in contexts or []}
    if context and context not in named:
        return True, ClusterError(f"kube context {ctx} does not exist in the kubeconfig: {_summary(stderr)} "
                                  "(list them: kubectl config get-contexts)")
    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context, persist_config=False)
    except Exception:  # an auth plugin the client lacks, a missing certificate file ...
        return False, None
    chosen = named.get(context) if context else active
    ns = namespace or ((chosen or {}).get("context") or {}).get("namespace") or "default"
    try:
        groups = client.ApisApi(api).get_api_versions(_request_timeout=15)
        if "kubeflow.org" not in {g.name for g in groups.groups or []}:
            return True, ClusterError(f"the cluster of kube context {ctx} has no TFJob resource: install the "
                                      "Kubeflow training operator (v1.9) first (it serves no kubeflow.org API)")
        if missing is not None:
            kind, name, said = missing
            if kind == "tfjob":
                client.CustomObjectsApi(api).get_namespaced_custom_object("kubeflow.org", "v1", ns, "tfjobs", name,
                                                                         _request_timeout=15)
            else:
                client.CoreV1Api(api).read_namespaced_pod(name, ns, _request_timeout=15)
    except ApiException as e:
        if e.status in (401, 403):
            return True, ClusterError(f"not authorized to {what} on the cluster of kube context {ctx}: "
                                      f"{e.status} {e.reason or ''}".rstrip())
        if e.status == 404 and missing is not None:
            return True, NotFoundOnCluster(f"{missing[2]} not found on the cluster of kube context {ctx} "
                                           f"(namespace {ns})")
        return True, None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        return True, ClusterError(f"cannot reach the Kubernetes cluster of kube context {ctx} to {what}: "
                                  f"{_summary(stderr) if stderr.strip() else _first_line(e)}")
    return True, None


def _cluster_error(stderr: str, context: Optional[str], kubectl: Optional[str], what: str,
                   not_found: Optional[str] = None, missing: Optional[Tuple[str, str]] = None,
                   namespace: Optional[str] = None) -> UserError:
    """Turn a failed kubectl call into one line that names the kube context: the cluster says
    why (``_ask_cluster``); kubectl's message only where it cannot be asked. ``missing``: the
    object the call named (kind "tfjob" or "pod", name), ``not_found`` how to say it is absent."""
    ctx = _ctx(current_context(context, kubectl))
    asked, error = _ask_cluster(context, namespace, ctx, what, stderr,
                                None if missing is None else (missing[0], missing[1], not_found or missing[1]))
    if error is not None:
        return error
    if asked:  # the cluster answers and names nothing wrong: kubectl's own line, unsorted
        return ClusterError(f"kubectl failed to {what} (kube context {ctx}): {_summary(stderr)}")
    return _by_message(stderr, ctx, what, not_found)


def _by_message(stderr: str, ctx: str, what: str, not_found: Optional[str]) -> UserError:
    """kubectl's message, sorted: the fallback where the cluster cannot be asked."""
    if _NO_CONTEXT.search(stderr):
        return ClusterError(f"kube context {ctx} does not exist: {_summary(stderr, _NO_CONTEXT)} "
                            "(list them: kubectl config get-contexts)")
    if _UNREACHABLE.search(stderr):
        return ClusterError(f"cannot reach the Kubernetes cluster of kube context {ctx} to {what}: "
                            f"{_summary(stderr, _UNREACHABLE)}")
    if _UNAUTHORIZED.search(stderr):
        return ClusterError(f"not authorized to {what} on the cluster of kube context {ctx}: "
                            f"{_summary(stderr, _UNAUTHORIZED)}")
    if _NO_CRD.search(stderr):
        return ClusterError(f"the cluster of kube context {ctx} has no TFJob resource: install the Kubeflow "
                            f"training operator (v1.9) first ({_summary(stderr, _NO_CRD)})")
    if not_found and _NOT_FOUND.search(stderr):
        return NotFoundOnCluster(f"{not_found} not found on the cluster of kube context {ctx}: {_summary(stderr, _NOT_FOUND)}")
    return ClusterError(f"kubectl failed to {what} (kube context {ctx}): {_summary(stderr)}")


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
        proc = _run(_base(kubectl, context) + ["apply", "-f", "-"], input_text=text)
        if proc.returncode != 0:
            raise _cluster_error(proc.stderr, context, kubectl, f"submit TFJob {name}", namespace=request.namespace)
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
    ctx = context or "the current context"
    try:
        config.load_kube_config(context=context)
        if not context:
            _, active = config.list_kube_config_contexts()
            ctx = (active or {}).get("name") or ctx
    except Exception as e:  # the client raises ConfigException, OSError, TypeError ... for a bad kubeconfig
        raise ClusterError(f"cannot load the kubeconfig for kube context {_ctx(ctx)}: {_first_line(e)}") from None
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
            raise ClusterError(f"the cluster of kube context {_ctx(ctx)} has no TFJob resource: install the "
                               "Kubeflow training operator (v1.9) first") from None
        if status in (401, 403):
            raise ClusterError(f"not authorized to submit TFJob {name} on the cluster of kube context "
                               f"{_ctx(ctx)}: {status} {getattr(e, 'reason', '')}".rstrip()) from None
        if status is not None:
            raise ClusterError(f"the cluster of kube context {_ctx(ctx)} rejected TFJob {name}: {status} "
                               f"{getattr(e, 'reason', '')}: {_first_line(getattr(e, 'body', '') or '')}") from None
        raise ClusterError(f"cannot reach the Kubernetes cluster of kube context {_ctx(ctx)} to submit TFJob "
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
    proc = _run(_base(kubectl, context, namespace) + ["get", "tfjob", name, "-o", "json"])
    if proc.returncode != 0:
        raise _cluster_error(proc.stderr, context, kubectl, f"get TFJob {name}", not_found=f"TFJob {name}",
                             missing=("tfjob", name), namespace=namespace)
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
    argv = _base(kubectl, context, namespace) + ["logs", pod, "-c", "tensorflow"] + (["-f"] if follow else [])
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
                             not_found=f"pod {pod} (TFJob {name}, {replica} {index})", missing=("pod", pod),
                             namespace=namespace)


@job_group.command("delete")
@click.argument("name")
@_cluster_options
@friendly_errors
def delete_cmd(name, context, namespace):
    """Delete a TFJob (its pods go with it) and its ConfigMap <NAME>-config."""
    kubectl = _require_kubectl()
    base = _base(kubectl, context, namespace)
    job = _run(base + ["delete", "tfjob", name])
    failed = None if job.returncode == 0 else _cluster_error(
        job.stderr, context, kubectl, f"delete TFJob {name}", not_found=f"TFJob {name}", missing=("tfjob", name),
        namespace=namespace)
    if failed is not None and not isinstance(failed, NotFoundOnCluster):
        raise failed
    cm = _run(base + ["delete", "configmap", f"{name}-config", "--ignore-not-found"])  # a job gone, its config too
    if cm.returncode != 0:
        raise _cluster_error(cm.stderr, context, kubectl, f"delete ConfigMap {name}-config", namespace=namespace)
    for out in (job.stdout, cm.stdout):
        if out.strip():
            click.echo(out.strip())
    if failed is not None:
        raise failed
