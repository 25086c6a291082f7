"""``gmeta k8s render``: a Kubeflow TFJob (and its ConfigMap) for the hybrid trainer.

The options are declared once (``render_options``) and shared with ``gmeta job render`` and
``gmeta job submit``; they arrive in the command as one ``RenderRequest``. The config goes
through the one loader (``--config`` / ``--set``), and the resolved config is what the pods get.
The ``entrypoint`` sub-command every pod runs is registered on ``k8s_group`` by its own module.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import click

from gmeta_tf.cli.common import build_config, config_options, friendly_errors, write_output
from launch.k8s_render import DEFAULTS as _DEFAULTS  # (Jinja2 and jsonschema load only when used)


@dataclass
class RenderRequest:
    """Everything ``render_options`` parses; ``manifests()`` turns it into ``[ConfigMap, TFJob]``."""

    config_path: Optional[str]
    overrides: Tuple[str, ...]
    image: str
    workers: int
    ps: int
    gpus_per_worker: int = 0
    namespace: Optional[str] = None
    name: Optional[str] = None
    data: Optional[str] = None
    checkpoint_pvc: Optional[str] = None
    checkpoint_uri: Optional[str] = None
    gang_scheduler: Optional[str] = None
    backoff_limit: int = _DEFAULTS["backoff_limit"]
    worker_cpu: str = _DEFAULTS["worker_cpu"]
    worker_memory: str = _DEFAULTS["worker_memory"]
    ps_cpu: str = _DEFAULTS["ps_cpu"]
    ps_memory: str = _DEFAULTS["ps_memory"]
    notes: List[str] = field(default_factory=list)

    def manifests(self, validate: bool = True) -> List[Dict[str, Any]]:
        from launch.k8s_render import render_manifests

        cfg = build_config(self.config_path, self.overrides, {"data.path": self.data})
        if cfg.cluster.ps:
            self.notes.append(f"note: cluster.ps ({', '.join(cfg.cluster.ps)}) is cleared in the job's config: "
                              "in a TFJob the PS addresses come from TF_CONFIG")
        docs = render_manifests(
            cfg, image=self.image, workers=self.workers, ps=self.ps, gpus_per_worker=self.gpus_per_worker,
            name=self.name, namespace=self.namespace, data=self.data, checkpoint_pvc=self.checkpoint_pvc,
            checkpoint_uri=self.checkpoint_uri, gang_scheduler=self.gang_scheduler,
            backoff_limit=self.backoff_limit, worker_cpu=self.worker_cpu, worker_memory=self.worker_memory,
            ps_cpu=self.ps_cpu, ps_memory=self.ps_memory,
        )
        if validate:
            self._validate(docs[1])
        return docs

    def _validate(self, tfjob: Dict[str, Any]) -> None:
        from launch.k8s_render import validate_tfjob

        validate_tfjob(tfjob)  # a missing CRD raises CrdNotFoundError: an unvalidated TFJob is never written

    def yaml(self) -> Tuple[List[Dict[str, Any]], str]:
        from launch.k8s_render import to_yaml

        docs = self.manifests()
        return docs, to_yaml(docs)


_RENDER_KEYS = [f for f in RenderRequest.__dataclass_fields__ if f != "notes"]


def _render_option_decorators():
    """The options of ``k8s render`` / ``job render`` / ``job submit``, in --help order."""
    return [
        click.option("--image", required=True, help="Container image with gmeta-tf installed (the `gmeta` command)."),
        click.option("--workers", type=int, required=True, help="Worker replicas: Horovod ranks, one per pod."),
        click.option("--ps", type=int, required=True, help="Parameter-server replicas."),
        click.option("--gpus-per-worker", type=int, default=0, show_default=True,
                     help="nvidia.com/gpu limit of each worker (PS never get GPUs)."),
        click.option("--namespace", default=None, help="Namespace of both objects (default: kubectl's)."),
        click.option("--name", default=None, help="TFJob name, a DNS-1123 label (default: gmeta-<config hash>)."),
        click.option("--data", default=None,
                     help="Prepared data path as the pods see it, e.g. on the PVC (default: the config's data.path)."),
        click.option("--checkpoint-pvc", default=None, metavar="CLAIM",
                     help="PersistentVolumeClaim mounted at /ckpt; the run directory is /ckpt/<name>."),
        click.option("--checkpoint-uri", default=None, metavar="URI",
                     help="Run directory on object storage (e.g. gs://bucket/run) instead of a PVC."),
        click.option("--gang-scheduler", type=click.Choice(["volcano", "scheduler-plugins"]), default=None,
                     help="Gang-schedule all workers + PS together (minAvailable = workers + ps)."),
        click.option("--backoff-limit", type=int, default=_DEFAULTS["backoff_limit"], show_default=True,
                     help="Pod restarts before the job is marked failed (runPolicy.backoffLimit)."),
        click.option("--worker-cpu", default=_DEFAULTS["worker_cpu"], show_default=True, help="CPU per worker."),
        click.option("--worker-memory", default=_DEFAULTS["worker_memory"], show_default=True,
                     help="Memory per worker."),
        click.option("--ps-cpu", default=_DEFAULTS["ps_cpu"], show_default=True, help="CPU per PS."),
        click.option("--ps-memory", default=_DEFAULTS["ps_memory"], show_default=True, help="Memory per PS."),
    ]


def render_options(f):
    """Add the render options (plus ``--config`` / ``--set``); the command gets ``request=RenderRequest``."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        fields = {key: kwargs.pop(key) for key in _RENDER_KEYS}
        fields["overrides"] = tuple(fields["overrides"] or ())
        return f(*args, request=RenderRequest(**fields), **kwargs)

    for option in reversed(_render_option_decorators()):
        wrapper = option(wrapper)
    return config_options(wrapper)


def output_option(f):
    return click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
                        help="Write the YAML to this file instead of stdout.")(f)


def echo_notes(request: RenderRequest) -> None:
    for note in request.notes:
        click.echo(note, err=True)


def write_render(request: RenderRequest, out_file: Optional[str]) -> None:
    """``render``'s body, shared by ``gmeta k8s render`` and ``gmeta job render``."""
    docs, text = request.yaml()
    echo_notes(request)
    if not write_output(text, out_file):
        return
    tfjob = docs[1]
    specs = tfjob["spec"]["tfReplicaSpecs"]
    click.echo(f"wrote {out_file}: ConfigMap {docs[0]['metadata']['name']}, TFJob {tfjob['metadata']['name']} "
               f"({specs['Worker']['replicas']} worker(s), {specs['PS']['replicas']} PS)")


@click.group("k8s")
def k8s_group():
    """Kubernetes: render a Kubeflow TFJob (or the prepare Jobs); the entrypoint its pods run."""


@k8s_group.command("render")
@render_options
@output_option
@friendly_errors
def render_cmd(request: RenderRequest, out_file):
    """Write a ConfigMap (the resolved config) and a kubeflow.org/v1 TFJob as multi-document YAML.

    Every pod runs `gmeta k8s entrypoint`, which reads TF_CONFIG to serve as a PS or join the
    Horovod ring as a worker. Apply with `kubectl apply -f` or `gmeta job submit`.
    """
    write_render(request, out_file)


@k8s_group.command("render-prepare")
@click.option("--image", required=True, help="Container image with gmeta-tf installed (the `gmeta` command).")
@click.option("--parts", type=int, required=True,
              help="N: pods of the Indexed Job; pod I runs `gmeta data prepare --part I/N`.")
@click.option("--input", "inputs", multiple=True, required=True,
              help="Sample-level input (file or directory) as the pods see it, under --mount; repeatable.")
@click.option("--dest", required=True,
              help="The combined prepared data set as the pods see it, under --mount (parts go to DEST-parts/).")
@click.option("--pvc", required=True, metavar="CLAIM", help="PersistentVolumeClaim every pod mounts at --mount.")
@click.option("--mount", default="/data", show_default=True, help="Where the claim is mounted in the pods.")
@click.option("--name", default="gmeta-prepare", show_default=True, help="Job name (the combine Job adds -combine).")
@click.option("--namespace", default=None, help="Namespace of both Jobs (default: kubectl's).")
@click.option("--set", "overrides", multiple=True, metavar="prepare.KEY=VALUE",
              help="A prepare setting every part gets (e.g. prepare.shards=64); repeatable.")
@click.option("--cpu", default="4", show_default=True, help="CPU per pod.")
@click.option("--memory", default="16Gi", show_default=True, help="Memory per pod.")
@click.option("--backoff-limit", type=int, default=3, show_default=True, help="Pod retries per Job.")
@output_option
@friendly_errors
def render_prepare_cmd(image, parts, inputs, dest, pvc, mount, name, namespace, overrides, cpu, memory,
                       backoff_limit, out_file):
    """Write `gmeta data prepare` as an Indexed batch/v1 Job of N parts plus the Job that combines them.

    Both Jobs are validated against the kubernetes client's batch/v1 Job model before anything is
    written. Apply both at once: the combine Job waits for every part's schema.json.
    """
    from launch.k8s_render import to_yaml
    from launch.prepare_job import PrepareJob, render

    job = PrepareJob(image=image, parts=parts, inputs=tuple(inputs), dest=dest, pvc=pvc, mount=mount, name=name,
                     namespace=namespace, overrides=tuple(overrides), cpu=cpu, memory=memory,
                     backoff_limit=backoff_limit)
    docs = render(job)
    if write_output(to_yaml(docs), out_file):
        click.echo(f"wrote {out_file}: Job {docs[0]['metadata']['name']} ({parts} indexed part(s)), "
                   f"Job {docs[1]['metadata']['name']} (combine into {dest})")
