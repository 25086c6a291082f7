"""Why a kubectl call failed, asked of the cluster, never read from kubectl's message.

kubectl's exit status says only that a call failed, and its message is prose that changes
between versions (``context "x" does not exist`` became ``context was not found for specified
context``), so sorting it by regular expressions blamed the wrong thing whenever the wording
moved. Instead the cluster is asked again, with questions whose answers are data:

1. the ``kubernetes`` client, loading the kubeconfig kubectl reads: the kubeconfig's contexts, the
   API groups the server serves, the HTTP status of a read of the object (``_ask_with_client``);
2. where the client cannot ask (not installed, a kubeconfig or an auth plugin it cannot load),
   kubectl itself, through answers that are data or exit statuses (``_ask_kubectl``):

   * ``kubectl config get-contexts -o name``: the contexts, one per line (does ``--context`` exist);
   * ``kubectl version -o json``: ``serverVersion`` is there only when the API server answered;
     if it did not, ``kubectl config view --minify -o json`` names the server, and a TCP connect to
     it says whether anything listens there;
   * ``kubectl api-resources --api-group kubeflow.org -o name``: whether ``tfjobs.kubeflow.org`` is served;
   * ``kubectl auth can-i VERB RESOURCE``: "yes" or "no" on stdout (exit 1 for both "no" and an error);
   * ``kubectl get KIND NAME --ignore-not-found -o json``: exit 0 with nothing printed when the
     object does not exist.

Where no answer names a cause, the user gets kubectl's own last line, verbatim, with the kube
context: never a guess from its wording.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from gmeta_tf.errors import ClusterError, UserError

ASK_TIMEOUT_S = 15.0
NO_CONTEXT = "the current context"
TFJOB_RESOURCE = "tfjobs.kubeflow.org"
# Newer kubectl prefixes client-go errors with klog header lines ("E1121 01:25:10.099215 19950
# memcache.go:265] ..."): the lines kubectl itself writes for the user are the others. This
# picks the line to quote; it decides nothing.
_KLOG = re.compile(r"^[EIWF]\d{4} \d\d:\d\d:\d\d")


class NotFoundOnCluster(UserError):
    """The object a command names does not exist on the cluster."""


@dataclass(frozen=True)
class KubeCall:
    """A kubectl call that failed: what it did (for the message), the access it needs (each one
    ``kubectl auth can-i`` arguments) and the object it named, if any (kind as kubectl spells it,
    name, and how to say it to the user)."""

    what: str
    access: Tuple[Tuple[str, ...], ...] = ()
    missing: Optional[Tuple[str, str, str]] = None


def kubectl_line(stderr: str) -> str:
    """kubectl's last meaningful line, as it wrote it: the last non-empty line that is not a klog
    header (the whole last line when all are), cut to 300 characters."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    plain = [ln for ln in lines if not _KLOG.match(ln)]
    line = (plain or lines or ["(kubectl printed nothing)"])[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def _ask(argv: Sequence[str], timeout: float = ASK_TIMEOUT_S) -> Optional[subprocess.CompletedProcess]:
    """One question to kubectl; None when it cannot be run or does not answer in time."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _json(text: str) -> Optional[Any]:
    try:
        return json.loads(text)
    except ValueError:
        return None


def current_context(context: Optional[str], kubectl: Optional[str]) -> Optional[str]:
    """The kube context a command uses: ``--context``, else kubectl's current one (None: none set
    or kubectl cannot say)."""
    if context:
        return context
    if not kubectl:
        return None
    proc = _ask([kubectl, "config", "current-context"])
    if proc is not None and proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip().splitlines()[0]
    return None


def ctx_phrase(name: Optional[str]) -> str:
    return f"'{name}'" if name else NO_CONTEXT


def explain(stderr: str, context: Optional[str], namespace: Optional[str], kubectl: Optional[str],
            call: KubeCall) -> UserError:
    """One line for a failed kubectl call, naming the kube context: the cause the cluster's
    answers name (module docstring), else kubectl's own line unsorted."""
    name = current_context(context, kubectl)
    ctx = ctx_phrase(name)
    asked, error = _ask_with_client(context, namespace, ctx, call, stderr)
    if error is None and not asked and kubectl:
        error = _ask_kubectl(kubectl, context, name, namespace, ctx, call, stderr)
    return error if error is not None else ClusterError(
        f"kubectl failed to {call.what} (kube context {ctx}): {kubectl_line(stderr)}")


# ------------------------------------------------------------------------------- kubectl's answers

def kubectl_base(kubectl: str, context: Optional[str], namespace: Optional[str] = None) -> List[str]:
    argv = [kubectl]
    if context:
        argv += ["--context", context]
    if namespace:
        argv += ["--namespace", namespace]
    return argv


def _minified(kubectl: str, context: Optional[str]) -> Optional[dict]:
    """The kubeconfig cut to the context (``config view --minify -o json``); None without one."""
    proc = _ask(kubectl_base(kubectl, context) + ["config", "view", "--minify", "-o", "json"])
    doc = _json(proc.stdout) if proc is not None and proc.returncode == 0 else None
    return doc if isinstance(doc, dict) else None


def _first(doc: Optional[dict], key: str, inner: str) -> dict:
    items = (doc or {}).get(key) or [{}]
    return (items[0] or {}).get(inner) or {}


def _listens(server: str, timeout_s: float = 3.0) -> bool:
    """Whether anything accepts a TCP connection at the API server's URL."""
    parts = urlsplit(server if "://" in server else f"https://{server}")
    if not parts.hostname:
        return False
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _ask_kubectl(kubectl: str, context: Optional[str], name: Optional[str], namespace: Optional[str], ctx: str,
                 call: KubeCall, stderr: str) -> Optional[UserError]:
    """kubectl's data answers, in the order a cause hides the next: the context, the API server,
    the TFJob kind, the user's rights, the object. None: no answer names a cause."""
    if context:
        listed = _ask([kubectl, "config", "get-contexts", "-o", "name"])
        if listed is not None and listed.returncode == 0 and context not in listed.stdout.split():
            known = ", ".join(listed.stdout.split()) or "none"
            return ClusterError(f"kube context {ctx} does not exist in the kubeconfig (its contexts: {known}; "
                                "kubectl config get-contexts)")
    version = _ask(kubectl_base(kubectl, context) + ["version", "-o", "json"])
    answer = _json(version.stdout) if version is not None else None
    if isinstance(answer, dict) and not answer.get("serverVersion"):  # kubectl ran; the API server did not answer
        config = _minified(kubectl, context)
        server = _first(config, "clusters", "cluster").get("server")
        if not server:
            why = "no cluster is configured for it" if name else "kubectl has no current context"
            return ClusterError(f"cannot reach the Kubernetes cluster of kube context {ctx} to {call.what}: {why} "
                                f"(kubectl config view --minify names no server); kubectl: {kubectl_line(stderr)}")
        if not _listens(server):
            return ClusterError(f"cannot reach the Kubernetes cluster of kube context {ctx} to {call.what}: nothing "
                                f"accepts connections at {server}; kubectl: {kubectl_line(stderr)}")
        return None  # it listens but answers kubectl nothing (credentials, TLS, a proxy): kubectl's own line
    resources = _ask(kubectl_base(kubectl, context) + ["api-resources", "--api-group", "kubeflow.org", "-o", "name"])
    if resources is not None and resources.returncode == 0 and TFJOB_RESOURCE not in resources.stdout.split():
        return ClusterError(f"the cluster of kube context {ctx} has no TFJob resource: install the Kubeflow training "
                            f"operator (v1.9) first (kubectl api-resources --api-group kubeflow.org lists no tfjobs)")
    for access in call.access:
        said = _ask(kubectl_base(kubectl, context, namespace) + ["auth", "can-i", *access])
        verdict = said.stdout.strip() if said is not None else ""
        if verdict.split(" ", 1)[0] == "no":
            return ClusterError(f"not authorized to {call.what} on the cluster of kube context {ctx} "
                                f"(kubectl auth can-i {' '.join(access)}: {verdict})")
    if call.missing is not None:
        kind, obj, said_as = call.missing
        got = _ask(kubectl_base(kubectl, context, namespace) + ["get", kind, obj, "--ignore-not-found", "-o", "json"])
        if got is not None and got.returncode == 0 and not got.stdout.strip():
            ns = namespace or _first(_minified(kubectl, context), "contexts", "context").get("namespace") or "default"
            return NotFoundOnCluster(f"{said_as} not found on the cluster of kube context {ctx} (namespace {ns})")
    return None


# ------------------------------------------------------------------------- the kubernetes client's

def _ask_with_client(context: Optional[str], namespace: Optional[str], ctx: str, call: KubeCall,
                     stderr: str) -> Tuple[bool, Optional[UserError]]:
    """The cluster's typed answers through the ``kubernetes`` client: the kubeconfig's contexts,
    whether the API server answers, whether it serves ``kubeflow.org``, the HTTP status of a read
    of ``call.missing``. Returns whether the cluster could be asked, and what it says is wrong
    (None: nothing it can name)."""
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
        return True, ClusterError(f"kube context {ctx} does not exist in the kubeconfig (its contexts: "
                                  f"{', '.join(sorted(map(str, named))) or 'none'}; kubectl config get-contexts)")
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
        if call.missing is not None:
            kind, name, _ = call.missing
            if kind == "tfjob":
                client.CustomObjectsApi(api).get_namespaced_custom_object("kubeflow.org", "v1", ns, "tfjobs", name,
                                                                         _request_timeout=15)
            else:
                client.CoreV1Api(api).read_namespaced_pod(name, ns, _request_timeout=15)
    except ApiException as e:
        if e.status in (401, 403):
            return True, ClusterError(f"not authorized to {call.what} on the cluster of kube context {ctx}: "
                                      f"{e.status} {e.reason or ''}".rstrip())
        if e.status == 404 and call.missing is not None:
            return True, NotFoundOnCluster(f"{call.missing[2]} not found on the cluster of kube context {ctx} "
                                           f"(namespace {ns})")
        return True, None
    except (urllib3.exceptions.HTTPError, OSError) as e:
        said = kubectl_line(stderr) if stderr.strip() else (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        return True, ClusterError(f"cannot reach the Kubernetes cluster of kube context {ctx} to {call.what}: {said}")
    return True, None
