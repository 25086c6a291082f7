"""Render a Kubeflow ``TFJob`` (plus the ConfigMap holding its config) for ``gmeta k8s render``.

The manifests come from two Jinja2 templates (``launch/templates``) and are parsed back with
``yaml.safe_load``, so callers get plain dicts and tests can check structure rather than text.
Every value is JSON-quoted by the templates' ``q`` filter (JSON is valid YAML), so a name, a path
or an image can never change the document's shape.

What every pod runs (``gmeta k8s entrypoint``, which reads ``TF_CONFIG`` to be a PS or a worker)::

    gmeta k8s entrypoint --config /etc/gmeta/config.yaml --out <run dir> --data <data path>

with ``TF_USE_LEGACY_KERAS=1``, ``GMETA_RENDEZVOUS_PORT=12355`` (worker 0 serves the Horovod Gloo
rendezvous there), ``GMETA_HEALTH_PORT=2223`` (the PS readiness probe) and
``GMETA_GLOO_IFACE=eth0``. ``<run dir>`` is ``/ckpt/<name>`` on the checkpoint PVC, or the
``--checkpoint-uri`` itself.

The training operator's CRD is lax (no enums for ``restartPolicy`` and friends), so
``validate_tfjob`` checks the CRD's ``openAPIV3Schema`` and, on top, the few values the operator
only rejects at run time.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from gmeta_tf import exit_codes
from gmeta_tf.config.loader import config_to_dict
from gmeta_tf.config.schema import Config
from gmeta_tf.errors import UserError
from launch.tfjob_ports import (
    GLOO_IFACE_ENV,
    HEALTH_PORT,
    HEALTH_PORT_ENV,
    POD_IFACE,
    RENDEZVOUS_PORT,
    RENDEZVOUS_PORT_ENV,
    TFJOB_PORT,
)

TEMPLATES = Path(__file__).resolve().parent / "templates"
CRD_ENV = "GMETA_TFJOB_CRD"
CRD_FILE = "kubeflow.org_tfjobs.v1.9.0.yaml"

CONFIG_DIR = "/etc/gmeta"
CONFIG_KEY = "config.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
CHECKPOINT_MOUNT = "/ckpt"
GLOO_IFACE = POD_IFACE
# The image's user and group (Dockerfile: USER 1000:1000). Volumes of a pod with fsGroup are
# group-writable by it, so the non-root image can write its checkpoints to a fresh PVC.
IMAGE_GID = 1000
APP_NAME = "gmeta-tf"
JOB_LABEL = "gmeta-tf/job"
GANG_SCHEDULERS = {
    # --gang-scheduler → the pods' schedulerName (the training operator creates the PodGroup
    # when it runs with --gang-scheduler-name set to the same scheduler).
    "volcano": "volcano",
    "scheduler-plugins": "scheduler-plugins-scheduler",
}
DEFAULTS = {"worker_cpu": "4", "worker_memory": "16Gi", "ps_cpu": "4", "ps_memory": "32Gi", "backoff_limit": 3}

# Kubernetes name rules. Job names become pod and (headless) Service names ``<name>-worker-<i>``,
# and Service names are DNS-1035 labels: lower case, digits and '-', starting with a letter.
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://\S+$")

# Values the operator accepts but its CRD does not enumerate.
_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
_CLEAN_POD_POLICIES = ("All", "Running", "None")
_REPLICA_TYPES = ("PS", "Worker", "Chief", "Master", "Evaluator")


def _q(value: Any) -> str:
    """Jinja filter: a value as a JSON scalar/list (valid YAML, never reinterpreted)."""
    return json.dumps(value, ensure_ascii=False)


@functools.lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = _q
    return env


def _render(template: str, **context) -> Dict[str, Any]:
    text = _env().get_template(template).render(**context)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:  # a template bug, not a user error: say where
        raise RuntimeError(f"launch/templates/{template} rendered invalid YAML: {e}\n{text}") from None
    return doc


def config_yaml(cfg: Config) -> str:
    """The config as ``gmeta_tf.config.loader.dump_config`` writes it."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def default_job_name(cfg: Config) -> str:
    """``gmeta-<first 10 hex digits of the config's sha256>``: the same config, the same job."""
    return "gmeta-" + hashlib.sha256(config_yaml(cfg).encode()).hexdigest()[:10]


def _check_name(name: str, workers: int, ps: int) -> None:
    longest = max(f"-worker-{workers - 1}", f"-ps-{ps - 1}", key=len)
    limit = 63 - len(longest)
    if not isinstance(name, str) or not _DNS1123_LABEL.match(name):
        raise UserError(
            f"--name {name!r} is not a valid Kubernetes name: use lower-case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit (DNS-1123), e.g. gmeta-maml-1"
        )
    if not _DNS1035_LABEL.match(name):
        raise UserError(f"--name {name!r} must start with a letter: pods of the job get Services "
                        f"named {name}{longest}, which must be DNS-1035 labels")
    if len(name) > limit:
        raise UserError(f"--name {name!r} is {len(name)} characters; at most {limit} fit, since the pod "
                        f"{name}{longest} must be a DNS label of at most 63 characters")


def _check_quantity(flag: str, value: str) -> str:
    value = str(value).strip()
    if not re.match(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
                    value) or value.startswith("-"):
        raise UserError(f"{flag} {value!r} is not a Kubernetes resource quantity (e.g. 4, 500m, 16Gi)")
    return value


def _check_counts(workers: int, ps: int, gpus_per_worker: int, backoff_limit: int) -> None:
    for flag, value, low in (("--workers", workers, 1), ("--ps", ps, 1), ("--gpus-per-worker", gpus_per_worker, 0),
                             ("--backoff-limit", backoff_limit, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise UserError(f"{flag} must be an integer >= {low}, got {value!r}")


def _check_places(image: str, checkpoint_pvc: Optional[str], checkpoint_uri: Optional[str],
                  namespace: Optional[str], gang_scheduler: Optional[str]) -> None:
    """The image, the one checkpoint location, the namespace and the gang scheduler, each by its flag."""
    if not image or not isinstance(image, str) or any(c.isspace() for c in image):
        raise UserError(f"--image {image!r} is not a container image reference (e.g. registry/gmeta-tf:0.1.0)")
    if checkpoint_pvc and checkpoint_uri:
        raise UserError("give one of --checkpoint-pvc and --checkpoint-uri, not both")
    if not checkpoint_pvc and not checkpoint_uri:
        raise UserError("a checkpoint location is required: --checkpoint-pvc CLAIM (a PersistentVolumeClaim "
                        f"mounted at {CHECKPOINT_MOUNT}) or --checkpoint-uri gs://bucket/run")
    if checkpoint_pvc and not _DNS1123_SUBDOMAIN.match(checkpoint_pvc):
        raise UserError(f"--checkpoint-pvc {checkpoint_pvc!r} is not a valid PersistentVolumeClaim name")
    if checkpoint_uri and not _URI.match(checkpoint_uri):
        raise UserError(f"--checkpoint-uri {checkpoint_uri!r} must be a URI such as gs://bucket/run "
                        "(for a path on a volume use --checkpoint-pvc)")
    if namespace is not None and not _DNS1123_LABEL.match(namespace):
        raise UserError(f"--namespace {namespace!r} is not a valid Kubernetes namespace name")
    if gang_scheduler is not None and gang_scheduler not in GANG_SCHEDULERS:
        raise UserError(f"--gang-scheduler {gang_scheduler!r}: expected one of {', '.join(GANG_SCHEDULERS)}")


def _replicas(workers: int, ps: int, gpus_per_worker: int, worker_cpu: str, worker_memory: str, ps_cpu: str,
              ps_memory: str) -> Dict[str, Dict[str, Any]]:
    """Each replica type's count and resources, the quantities checked."""
    return {
        "Worker": {"count": workers, "cpu": _check_quantity("--worker-cpu", worker_cpu),
                   "memory": _check_quantity("--worker-memory", worker_memory), "gpus": gpus_per_worker},
        "PS": {"count": ps, "cpu": _check_quantity("--ps-cpu", ps_cpu),
               "memory": _check_quantity("--ps-memory", ps_memory), "gpus": 0},
    }


def render_manifests(
    cfg: Config,
    *,
    image: str,
    workers: int,
    ps: int,
    gpus_per_worker: int = 0,
    name: Optional[str] = None,
    namespace: Optional[str] = None,
    data: Optional[str] = None,
    checkpoint_pvc: Optional[str] = None,
    checkpoint_uri: Optional[str] = None,
    gang_scheduler: Optional[str] = None,
    backoff_limit: int = DEFAULTS["backoff_limit"],
    worker_cpu: str = DEFAULTS["worker_cpu"],
    worker_memory: str = DEFAULTS["worker_memory"],
    ps_cpu: str = DEFAULTS["ps_cpu"],
    ps_memory: str = DEFAULTS["ps_memory"],
) -> List[Dict[str, Any]]:
    """``[ConfigMap, TFJob]`` for ``workers`` Horovod workers and ``ps`` parameter servers.

    The ConfigMap holds ``cfg`` (with ``data.path`` set to ``data`` and ``cluster.ps`` cleared:
    inside a TFJob the PS addresses come from ``TF_CONFIG``, and a ``cluster.ps`` in the config
    would take precedence over it). Raises ``UserError`` naming the bad input.
    """
    _check_counts(workers, ps, gpus_per_worker, backoff_limit)
    _check_places(image, checkpoint_pvc, checkpoint_uri, namespace, gang_scheduler)
    resources = _replicas(workers, ps, gpus_per_worker, worker_cpu, worker_memory, ps_cpu, ps_memory)
    data = data or cfg.data.path
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=data),
                              cluster=dataclasses.replace(cfg.cluster, ps=[]))
    name = name if name is not None else default_job_name(cfg)
    _check_name(name, workers, ps)
    run_dir = checkpoint_uri or f"{CHECKPOINT_MOUNT}/{name}"
    labels = {"app.kubernetes.io/name": APP_NAME, JOB_LABEL: name}
    configmap_name = f"{name}-config"

    configmap = _render("configmap.yaml.j2", configmap_name=configmap_name, namespace=namespace, labels=labels,
                        config_yaml=config_yaml(cfg))
    tfjob = _render(
        "tfjob.yaml.j2", name=name, namespace=namespace, labels=labels, image=image,
        command=entrypoint_command(run_dir, data), env=container_env(),
        ports={"tfjob": TFJOB_PORT, "rendezvous": RENDEZVOUS_PORT, "health": HEALTH_PORT},
        replicas=resources, restart_policy=RESTART_POLICY, termination_grace_s=termination_grace_s(cfg),
        backoff_limit=backoff_limit, scheduler_name=GANG_SCHEDULERS.get(gang_scheduler) if gang_scheduler else None,
        min_available=workers + ps, configmap_name=configmap_name, config_dir=CONFIG_DIR,
        checkpoint_pvc=checkpoint_pvc, checkpoint_mount=CHECKPOINT_MOUNT, fs_group=IMAGE_GID,
    )
    return [configmap, tfjob]


# Kubeflow's ExitCode policy restarts a pod whose container exited 128-255 (a signal, a
# preemption: 143, a lost PS: 200) and leaves one that exited 1-127 failed (a bad config exits 2):
# a mistake is not retried until backoffLimit, a fault is (docs/fault_tolerance.md). It is the
# policy because gmeta_tf/exit_codes.py's retryable column is that rule (``policy_retries``;
# tests/test_exit_codes.py holds every row to it).
RESTART_POLICY = "ExitCode"


def policy_retries(code: int) -> bool:
    """Whether ``RESTART_POLICY`` (the training operator's ExitCode) restarts a pod that exited ``code``."""
    return exit_codes.normalized(code) in exit_codes.RETRIED_CODES


def _check_policy() -> None:
    wrong = [e.name for e in exit_codes.TABLE if e.code and policy_retries(e.code) != e.retryable]
    if wrong:  # a row added to the table that the rendered pods would treat otherwise
        raise AssertionError(f"restartPolicy {RESTART_POLICY} disagrees with exit_codes on: {wrong}")


_check_policy()
GRACE_MARGIN_S = 5  # Python start-up of the signal handler, Horovod's shutdown, the PS's own exit


def termination_grace_s(cfg) -> int:
    """The pods' terminationGracePeriodSeconds: the trainer's preemption grace plus a margin, so
    the kubelet's SIGKILL never lands inside a preemption checkpoint the trainer still has time for."""
    return int(math.ceil(cfg.train.preemption_grace_s)) + GRACE_MARGIN_S


def entrypoint_command(run_dir: str, data: str) -> List[str]:
    """The container command of both replica types (the entrypoint picks its role from TF_CONFIG)."""
    return ["gmeta", "k8s", "entrypoint", "--config", CONFIG_PATH, "--out", run_dir, "--data", data]


def container_env() -> Dict[str, str]:
    return {
        # gmeta itself needs no help (importing gmeta_tf sets it); this is for any other Python in
        # the pod that imports TensorFlow first (horovodrun's checks, a debugging shell).
        "TF_USE_LEGACY_KERAS": "1",
        RENDEZVOUS_PORT_ENV: str(RENDEZVOUS_PORT),
        HEALTH_PORT_ENV: str(HEALTH_PORT),
        GLOO_IFACE_ENV: GLOO_IFACE,
        "PYTHONUNBUFFERED": "1",
    }


class _Dumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (the ConfigMap's config.yaml) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(docs: List[Dict[str, Any]]) -> str:
    """Multi-document YAML (``safe_dump_all`` with block-style multi-line strings)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True, default_flow_style=False,
                         allow_unicode=True)


# ------------------------------------------------------------------------------ validation

class CrdNotFoundError(UserError):
    """The TFJob CRD to validate against is missing: validation is never skipped silently."""


def crd_path() -> Path:
    """The vendored CRD (``launch/schemas/``, see its README for source and licence), or ``$GMETA_TFJOB_CRD``."""
    override = os.environ.get(CRD_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "schemas" / CRD_FILE


@functools.lru_cache(maxsize=8)
def load_crd_schema(path: str, kind: str, version: str, hint: str) -> Dict[str, Any]:
    """The ``openAPIV3Schema`` of ``kind``'s ``version`` in the CRD file at ``path``; a missing file
    is a ``CrdNotFoundError`` ending with ``hint`` (how to get one)."""
    p = Path(path)
    if not p.is_file():
        raise CrdNotFoundError(f"{kind} CRD not found at {p}: {hint}")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        docs = list(yaml.load_all(p.read_text(), Loader=loader))
    except yaml.YAMLError as e:
        raise UserError(f"{kind} CRD {p} is not valid YAML: {e}") from None
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
            continue
        spec = doc.get("spec") or {}
        if (spec.get("names") or {}).get("kind") != kind:
            continue
        for v in spec.get("versions") or []:
            if v.get("name") == version:
                schema = (v.get("schema") or {}).get("openAPIV3Schema")
                if isinstance(schema, dict):
                    return schema
    raise UserError(f"{p} holds no {kind} CustomResourceDefinition with a {version} openAPIV3Schema")


def _load_schema(path: str) -> Dict[str, Any]:
    return load_crd_schema(path, "TFJob", "v1", f"set {CRD_ENV} to a copy of {CRD_FILE} (training-operator "
                           "v1.9.0, manifests/base/crds), or reinstall gmeta-tf (it ships one in launch/schemas/)")


def tfjob_schema() -> Dict[str, Any]:
    """The ``openAPIV3Schema`` of the TFJob CRD's ``v1`` version (``GMETA_TFJOB_CRD`` overrides the file)."""
    return _load_schema(str(crd_path()))


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def schema_errors(schema: Dict[str, Any], doc: Any) -> List[str]:
    """Every way ``doc`` breaks ``schema``, each as ``path: message``, sorted by path."""
    from jsonschema import Draft7Validator

    found = sorted(Draft7Validator(schema).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_path(e.absolute_path)}: {_short(e.message)}" for e in found]


def tfjob_errors(doc: Any) -> List[str]:
    """Every reason ``doc`` is not a valid TFJob, each as ``path: message`` (empty when valid)."""
    errors = schema_errors(tfjob_schema(), doc)
    if not isinstance(doc, dict):
        return errors
    if doc.get("apiVersion") != "kubeflow.org/v1":
        errors.append(f"apiVersion: expected 'kubeflow.org/v1', got {doc.get('apiVersion')!r}")
    if doc.get("kind") != "TFJob":
        errors.append(f"kind: expected 'TFJob', got {doc.get('kind')!r}")
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    run_policy = spec.get("runPolicy") if isinstance(spec.get("runPolicy"), dict) else {}
    clean = run_policy.get("cleanPodPolicy")
    if clean is not None and clean not in _CLEAN_POD_POLICIES:
        errors.append(f"spec.runPolicy.cleanPodPolicy: {clean!r} is not one of {', '.join(_CLEAN_POD_POLICIES)}")
    replicas = spec.get("tfReplicaSpecs") if isinstance(spec.get("tfReplicaSpecs"), dict) else {}
    for rtype, rspec in replicas.items():
        where = f"spec.tfReplicaSpecs.{rtype}"
        if rtype not in _REPLICA_TYPES:
            errors.append(f"{where}: unknown replica type (expected one of {', '.join(_REPLICA_TYPES)})")
        if not isinstance(rspec, dict):
            continue
        policy = rspec.get("restartPolicy")
        if policy is not None and policy not in _RESTART_POLICIES:
            errors.append(f"{where}.restartPolicy: {policy!r} is not one of {', '.join(_RESTART_POLICIES)}")
        pod = (rspec.get("template") or {}).get("spec") or {}
        containers = pod.get("containers") if isinstance(pod, dict) else None
        if isinstance(containers, list) and not any(isinstance(c, dict) and c.get("name") == "tensorflow"
                                                    for c in containers):
            errors.append(f"{where}.template.spec.containers: no container named 'tensorflow' "
                          "(the training operator needs it)")
    return errors


def validate_tfjob(doc: Any) -> None:
    """Raise ``UserError`` listing every schema error with its path, e.g.
    ``spec.runPolicy.backoffLimit: 'three' is not of type 'integer'``."""
    raise_if_invalid(doc, tfjob_errors(doc), "TFJob", "kubeflow.org/v1 TFJob")


def raise_if_invalid(doc: Any, errors: List[str], kind: str, crd: str) -> None:
    """``UserError`` naming the object and its first ten errors, when there are any."""
    if errors:
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        shown = errors[:10] + ([f"... and {len(errors) - 10} more"] if len(errors) > 10 else [])
        raise UserError(f"{kind} {name or '(unnamed)'} does not match the {crd} CRD: " + "; ".join(shown))
