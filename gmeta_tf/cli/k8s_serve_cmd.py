"""``gmeta k8s render-serving``: a KServe InferenceService running ``gmeta serve`` (``launch/isvc_render.py``)."""
from __future__ import annotations

import click

from gmeta_tf.cli.common import friendly_errors, write_output
from launch.isvc_render import DEFAULTS


@click.command("render-serving")
@click.option("--image", required=True, help="Container image with gmeta-tf installed (the `gmeta` command).")
@click.option("--model-uri", required=True, metavar="URI",
              help="Where KServe fetches the exported SavedModel: pvc://claim/path, gs://..., s3://...")
@click.option("--name", required=True, help="InferenceService name (DNS-1035 label).")
@click.option("--namespace", default=None, help="Namespace (default: kubectl's).")
@click.option("--model-name", default=None, help="Model name in the URLs (default: --name).")
@click.option("--cpu", default=DEFAULTS["cpu"], show_default=True, help="CPU per replica.")
@click.option("--memory", default=DEFAULTS["memory"], show_default=True, help="Memory per replica.")
@click.option("--min-replicas", type=int, default=DEFAULTS["min_replicas"], show_default=True)
@click.option("--max-replicas", type=int, default=DEFAULTS["max_replicas"], show_default=True)
@click.option("--max-batch-size", type=int, default=DEFAULTS["max_batch_size"], show_default=True,
              help="gmeta serve --max-batch-size: merge concurrent predict requests (0: off).")
@click.option("--max-latency-ms", type=float, default=DEFAULTS["max_latency_ms"], show_default=True,
              help="gmeta serve --max-latency-ms.")
@click.option("--max-body-mb", type=float, default=DEFAULTS["max_body_mb"],
              help="gmeta serve --max-body-mb: largest request body, MiB (default: gmeta serve's).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Write the YAML to this file instead of stdout.")
@friendly_errors
def render_serving_cmd(image, model_uri, name, namespace, model_name, cpu, memory, min_replicas, max_replicas,
                       max_batch_size, max_latency_ms, max_body_mb, out_file):
    """Write a serving.kserve.io/v1beta1 InferenceService that serves an exported model.

    Its predictor container runs `gmeta serve --model /mnt/models` (KServe downloads --model-uri
    there). The manifest is validated against KServe's InferenceService CRD before it is written.
    """
    from launch.isvc_render import render_inference_service, validate_inference_service
    from launch.k8s_render import to_yaml

    doc = render_inference_service(name=name, image=image, model_uri=model_uri, namespace=namespace,
                                   model_name=model_name, cpu=cpu, memory=memory, min_replicas=min_replicas,
                                   max_replicas=max_replicas, max_batch_size=max_batch_size,
                                   max_latency_ms=max_latency_ms, max_body_mb=max_body_mb)
    validate_inference_service(doc)  # a missing CRD raises CrdNotFoundError: nothing unvalidated is written
    if write_output(to_yaml([doc]), out_file):
        click.echo(f"wrote {out_file}: InferenceService {name} serving {model_uri}")
