"""Render a KServe ``InferenceService`` that serves an exported model with ``gmeta serve``.

Why a custom predictor container rather than KServe's ``tensorflow`` predictor (TF Serving on
the ``storageUri``): the export is stock TensorFlow, so TF Serving could load it, but then the
served API would differ from the one tested here -- no Open Inference Protocol v2 with a
signature parameter, no 400 naming the bad input, no micro-batching of ``predict`` -- and TF
Serving wants a numbered version directory above ``saved_model.pb``. The container runs the same
``gmeta serve`` as ``tests/test_serve_http.py`` does. KServe still fetches the model: a custom
container's ``STORAGE_URI`` is downloaded by the storage initializer to ``/mnt/models``.

The manifest is validated against the vendored InferenceService CRD (KServe v0.15.2, see
``launch/schemas/README.md``); ``GMETA_ISVC_CRD`` points at another copy. A missing CRD is an
error, never a skipped validation.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from gmeta_tf.errors import UserError
from launch.k8s_render import (
    _DNS1035_LABEL,
    _DNS1123_LABEL,
    _URI,
    APP_NAME,
    _check_quantity,
    _render,
    load_crd_schema,
    raise_if_invalid,
    schema_errors,
)

CRD_ENV = "GMETA_ISVC_CRD"
CRD_FILE = "serving.kserve.io_inferenceservices.v0.15.2.yaml"
MODEL_MOUNT = "/mnt/models"  # where KServe's storage initializer puts STORAGE_URI
PORT = 8080  # KServe's default HTTP port for predictors
SERVE_LABEL = "gmeta-tf/inference-service"
DEFAULTS = {"cpu": "2", "memory": "4Gi", "min_replicas": 1, "max_replicas": 1, "max_batch_size": 0,
            "max_latency_ms": 2.0, "max_body_mb": None}  # max_body_mb None: gmeta serve's own default


def serve_command(model_name: str, max_batch_size: int, max_latency_ms: float,
                  max_body_mb: Optional[float] = None) -> List[str]:
    cmd = ["gmeta", "serve", "--model", MODEL_MOUNT, "--port", str(PORT), "--host", "0.0.0.0", "--name", model_name]
    if max_batch_size:
        cmd += ["--max-batch-size", str(max_batch_size), "--max-latency-ms", f"{max_latency_ms:g}"]
    if max_body_mb is not None:
        cmd += ["--max-body-mb", f"{max_body_mb:g}"]
    return cmd


def render_inference_service(
    *,
    name: str,
    image: str,
    model_uri: str,
    namespace: Optional[str] = None,
    model_name: Optional[str] = None,
    cpu: str = DEFAULTS["cpu"],
    memory: str = DEFAULTS["memory"],
    min_replicas: int = DEFAULTS["min_replicas"],
    max_replicas: int = DEFAULTS["max_replicas"],
    max_batch_size: int = DEFAULTS["max_batch_size"],
    max_latency_ms: float = DEFAULTS["max_latency_ms"],
    max_body_mb: Optional[float] = DEFAULTS["max_body_mb"],
) -> Dict[str, Any]:
    """The InferenceService as a dict; ``UserError`` names the bad option."""
    if not isinstance(name, str) or not _DNS1035_LABEL.match(name) or len(name) > 63:
        raise UserError(f"--name {name!r} is not a valid InferenceService name: lower-case letters, digits and '-', "
                        "starting with a letter, at most 63 characters (DNS-1035), e.g. gmeta-recs")
    if namespace is not None and not _DNS1123_LABEL.match(namespace):
        raise UserError(f"--namespace {namespace!r} is not a valid Kubernetes namespace name")
    if not image or not isinstance(image, str) or any(c.isspace() for c in image):
        raise UserError(f"--image {image!r} is not a container image reference (e.g. registry/gmeta-tf:0.1.0)")
    if not isinstance(model_uri, str) or not _URI.match(model_uri):
        raise UserError(f"--model-uri {model_uri!r} must be a URI KServe can fetch, e.g. pvc://claim/exports/1 "
                        "or gs://bucket/exports/1")
    model_name = model_name or name
    if not _DNS1123_LABEL.match(model_name):
        raise UserError(f"--model-name {model_name!r} must be lower-case letters, digits and '-' (it is a URL part)")
    for flag, value, low in (("--min-replicas", min_replicas, 0), ("--max-replicas", max_replicas, 1),
                             ("--max-batch-size", max_batch_size, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise UserError(f"{flag} must be an integer >= {low}, got {value!r}")
    if max_replicas < min_replicas:
        raise UserError(f"--max-replicas {max_replicas} is below --min-replicas {min_replicas}")
    if max_latency_ms < 0:
        raise UserError(f"--max-latency-ms must be >= 0, got {max_latency_ms!r}")
    if max_body_mb is not None and not max_body_mb > 0:
        raise UserError(f"--max-body-mb must be a number > 0 (MiB), got {max_body_mb!r}")
    return _render(
        "inferenceservice.yaml.j2",
        name=name,
        namespace=namespace,
        labels={"app.kubernetes.io/name": APP_NAME, SERVE_LABEL: name},
        image=image,
        command=serve_command(model_name, max_batch_size, max_latency_ms, max_body_mb),
        env={"STORAGE_URI": model_uri, "PYTHONUNBUFFERED": "1"},
        port=PORT,
        ready_path=f"/v2/models/{model_name}/ready",
        cpu=_check_quantity("--cpu", cpu),
        memory=_check_quantity("--memory", memory),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
    )


def crd_path() -> Path:
    """The vendored CRD (``launch/schemas/``), or ``$GMETA_ISVC_CRD``."""
    override = os.environ.get(CRD_ENV)
    return Path(override) if override else Path(__file__).resolve().parent / "schemas" / CRD_FILE


def isvc_schema() -> Dict[str, Any]:
    return load_crd_schema(str(crd_path()), "InferenceService", "v1beta1",
                           f"set {CRD_ENV} to a copy of {CRD_FILE} (KServe v0.15.2, config/crd/full/"
                           "serving.kserve.io_inferenceservices.yaml), or reinstall gmeta-tf (it ships one in "
                           "launch/schemas/)")


def isvc_errors(doc: Any) -> List[str]:
    """Every reason ``doc`` is not a valid InferenceService (empty when valid)."""
    errors = schema_errors(isvc_schema(), doc)
    if isinstance(doc, dict):
        if doc.get("apiVersion") != "serving.kserve.io/v1beta1":
            errors.append(f"apiVersion: expected 'serving.kserve.io/v1beta1', got {doc.get('apiVersion')!r}")
        if doc.get("kind") != "InferenceService":
            errors.append(f"kind: expected 'InferenceService', got {doc.get('kind')!r}")
    return errors


def validate_inference_service(doc: Any) -> None:
    raise_if_invalid(doc, isvc_errors(doc), "InferenceService", "serving.kserve.io/v1beta1 InferenceService")
