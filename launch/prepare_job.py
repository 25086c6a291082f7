"""Render ``gmeta data prepare`` as a Kubernetes Indexed Job of N parts, plus the Job that combines them.

Why an Indexed Job: ``prepare --part I/N`` prepares the shards ``s % N == I`` of one hash-based
task assignment, so N pods with ``completionMode: Indexed`` (``completions = parallelism = N``)
prepare one data set side by side, pod I reading its index from ``JOB_COMPLETION_INDEX`` (the Job
controller sets it in every container of an Indexed Job, Kubernetes >= 1.22; ``$(VAR)`` in
``args`` is expanded by the kubelet). Each pod writes ``<dest>-parts/part-<I>``; all paths live
on one shared PersistentVolumeClaim, mounted at the same place in every pod.

Kubernetes has no "run after that Job" for Jobs, so the second Job (``<name>-combine``) starts
with the first and its init container waits until every part's ``schema.json`` exists (prepare
writes it last, atomically); then ``gmeta data combine`` hard-links the shards into ``<dest>``
(same volume, so no copy). ``activeDeadlineSeconds`` bounds the wait when a part never finishes.

Validation needs no cluster and no network: each Job is deserialised into the kubernetes
client's ``V1Job`` model (kubernetes==32.0.1, pinned for ``gmeta serve``), which checks types and
required fields, and serialised back: a field the model does not know (a typo) or a value it had
to coerce shows up as a difference, named by its path. On top, the Job rules the model does not
encode (Indexed mode, ``completions == parallelism``, a Job's restart policy).
"""
from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from gmeta_tf.errors import UserError
from launch.k8s_render import _DNS1035_LABEL as _NAME
from launch.k8s_render import _DNS1123_SUBDOMAIN as _CLAIM
from launch.k8s_render import APP_NAME, IMAGE_GID, JOB_LABEL, _check_quantity

MAX_PARTS = 10_000  # far below the Job API's limit; more pods than this is a mistake
VOLUME = "data"
_JOB_RESTART = ("Never", "OnFailure")


@dataclass(frozen=True)
class PrepareJob:
    """What ``gmeta k8s render-prepare`` renders; every path as the pods see it."""

    image: str
    parts: int
    inputs: Tuple[str, ...]
    dest: str  # the combined prepared data set; parts go to <dest>-parts/part-<I>
    pvc: str
    mount: str = "/data"
    name: str = "gmeta-prepare"
    namespace: Optional[str] = None
    overrides: Tuple[str, ...] = ()  # --set prepare.<key>=<value>, passed to every part
    cpu: str = "4"
    memory: str = "16Gi"
    backoff_limit: int = 3
    combine_deadline_s: int = 86_400
    labels: Dict[str, str] = field(default_factory=dict)

    @property
    def parts_dir(self) -> str:
        return f"{self.dest.rstrip('/')}-parts"

    def part_dirs(self) -> List[str]:
        return [f"{self.parts_dir}/part-{i}" for i in range(self.parts)]


def check(job: PrepareJob) -> None:
    """Refuse what would render a Job that cannot work, naming the option."""
    if not isinstance(job.parts, int) or isinstance(job.parts, bool) or not 1 <= job.parts <= MAX_PARTS:
        raise UserError(f"--parts must be an integer in [1, {MAX_PARTS}], got {job.parts!r}")
    shards = _override(job.overrides, "prepare.shards")
    if shards is not None and shards.isdigit() and job.parts > int(shards):
        raise UserError(f"--parts {job.parts} is more than prepare.shards={shards}: part I prepares the shards "
                        f"s % {job.parts} == I, so some parts would have none")
    if not job.image or any(c.isspace() for c in job.image):
        raise UserError(f"--image {job.image!r} is not a container image reference")
    if not _NAME.match(job.name) or len(job.name) > 63 - len("-combine"):
        raise UserError(f"--name {job.name!r} must be a DNS-1035 label (lower-case letters, digits, '-', starting "
                        f"with a letter) of at most {63 - len('-combine')} characters")
    if job.namespace is not None and not _NAME.match(job.namespace):
        raise UserError(f"--namespace {job.namespace!r} is not a valid Kubernetes namespace name")
    if not _CLAIM.match(job.pvc or ""):
        raise UserError(f"--pvc {job.pvc!r} is not a valid PersistentVolumeClaim name")
    if not job.mount.startswith("/"):
        raise UserError(f"--mount {job.mount!r} must be an absolute path")
    if not job.inputs:
        raise UserError("--input is required (a path on the volume, as the pods see it)")
    for flag, path in [("--input", p) for p in job.inputs] + [("--dest", job.dest)]:
        norm = posixpath.normpath(path)
        if not norm.startswith(job.mount.rstrip("/") + "/"):
            raise UserError(f"{flag} {path!r} is not on the shared volume: it must be under --mount {job.mount}")
    _check_quantity("--cpu", job.cpu)
    _check_quantity("--memory", job.memory)
    if job.backoff_limit < 0:
        raise UserError(f"--backoff-limit must be >= 0, got {job.backoff_limit}")


def _override(overrides: Tuple[str, ...], key: str) -> Optional[str]:
    found = None
    for item in overrides:
        k, _, v = item.partition("=")
        if k.strip() == key:
            found = v.strip()
    return found


def prepare_args(job: PrepareJob) -> List[str]:
    """The command of pod I (``$(JOB_COMPLETION_INDEX)`` is expanded by the kubelet)."""
    args = ["gmeta", "data", "prepare"]
    for path in job.inputs:
        args += ["--input", path]
    args += ["--out", f"{job.parts_dir}/part-$(JOB_COMPLETION_INDEX)",
             "--part", f"$(JOB_COMPLETION_INDEX)/{job.parts}", "--overwrite"]
    for item in job.overrides:
        args += ["--set", item]
    return args


def combine_args(job: PrepareJob) -> List[str]:
    return ["gmeta", "data", "combine", *job.part_dirs(), "--out", job.dest, "--overwrite"]


def wait_script(job: PrepareJob) -> str:
    """Shell for the combine Job's init container: wait for every part's schema.json."""
    files = " ".join(shlex.quote(f"{d}/schema.json") for d in job.part_dirs())
    return (f"for f in {files}; do until [ -f \"$f\" ]; do sleep 10; done; done; "
            f"echo all {job.parts} parts prepared")


def _pod(job: PrepareJob, containers: List[Dict], init: Optional[List[Dict]] = None) -> Dict[str, Any]:
    spec: Dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"fsGroup": IMAGE_GID},
        "containers": containers,
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": job.pvc}}],
    }
    if init:
        spec["initContainers"] = init
    return {"metadata": {"labels": _labels(job)}, "spec": spec}


def _container(job: PrepareJob, name: str, args: List[str]) -> Dict[str, Any]:
    res = {"cpu": job.cpu, "memory": job.memory}
    return {"name": name, "image": job.image, "command": args[:1], "args": args[1:],
            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
            "resources": {"requests": dict(res), "limits": dict(res)},
            "volumeMounts": [{"name": VOLUME, "mountPath": job.mount}]}


def _labels(job: PrepareJob) -> Dict[str, str]:
    return {"app.kubernetes.io/name": APP_NAME, JOB_LABEL: job.name, **job.labels}


def _meta(job: PrepareJob, name: str) -> Dict[str, Any]:
    meta: Dict[str, Any] = {"name": name, "labels": _labels(job)}
    if job.namespace:
        meta["namespace"] = job.namespace
    return meta


def render(job: PrepareJob) -> List[Dict[str, Any]]:
    """``[prepare Job, combine Job]`` as plain dicts, validated."""
    check(job)
    prepare = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job, job.name),
        "spec": {"completionMode": "Indexed", "completions": job.parts, "parallelism": job.parts,
                 "backoffLimit": job.backoff_limit,
                 "template": _pod(job, [_container(job, "prepare", prepare_args(job))])},
    }
    waiter = dict(_container(job, "wait-for-parts", ["sh", "-c", wait_script(job)]),
                  resources={"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}})
    combine = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job, f"{job.name}-combine"),
        "spec": {"completions": 1, "parallelism": 1, "backoffLimit": job.backoff_limit,
                 "activeDeadlineSeconds": job.combine_deadline_s,
                 "template": _pod(job, [_container(job, "combine", combine_args(job))], init=[waiter])},
    }
    for doc in (prepare, combine):
        validate_job(doc)
    return [prepare, combine]


# ------------------------------------------------------------------------------ validation

def _diff(want: Any, got: Any, path: str, out: List[str]) -> None:
    """Where the model's round trip of ``want`` lost or changed something."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k, v in want.items():
            where = f"{path}.{k}" if path else k
            if k not in got:
                out.append(f"{where}: not a field of the batch/v1 Job model" if v is not None else "")
            else:
                _diff(v, got[k], where, out)
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got)):
            _diff(a, b, f"{path}[{i}]", out)
    elif want != got or type(want) is not type(got):
        out.append(f"{path}: {json.dumps(want)} is not a valid value here (the model reads {json.dumps(got)})")


def job_errors(doc: Dict[str, Any]) -> List[str]:
    """Every reason ``doc`` is not a valid batch/v1 Job, each as ``path: message``."""
    from kubernetes.client import ApiClient

    class _Response:  # what ApiClient.deserialize reads: the JSON body
        data = json.dumps(doc)

    with ApiClient() as api:
        try:
            back = api.sanitize_for_serialization(api.deserialize(_Response(), "V1Job"))
        except (ValueError, TypeError) as e:
            return [f"(model): {str(e).splitlines()[0]}"]
    errors: List[str] = []
    _diff(doc, back, "", errors)
    errors = [e for e in errors if e]
    if doc.get("apiVersion") != "batch/v1" or doc.get("kind") != "Job":
        errors.append(f"apiVersion/kind: expected batch/v1 Job, got {doc.get('apiVersion')!r} {doc.get('kind')!r}")
    spec = doc.get("spec") or {}
    if spec.get("completionMode") not in (None, "NonIndexed", "Indexed"):
        errors.append(f"spec.completionMode: {spec.get('completionMode')!r} is not Indexed or NonIndexed")
    if spec.get("completionMode") == "Indexed" and spec.get("completions") != spec.get("parallelism"):
        errors.append("spec.parallelism: differs from spec.completions (every part runs at once)")
    policy = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if policy not in _JOB_RESTART:
        errors.append(f"spec.template.spec.restartPolicy: a Job's pods need one of {', '.join(_JOB_RESTART)}, "
                      f"got {policy!r}")
    return errors


def validate_job(doc: Dict[str, Any]) -> None:
    errors = job_errors(doc)
    if errors:
        name = (doc.get("metadata") or {}).get("name") or "(unnamed)"
        raise UserError(f"Job {name} is not a valid batch/v1 Job: " + "; ".join(errors[:10]))
