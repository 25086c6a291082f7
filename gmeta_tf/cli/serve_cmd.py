"""``gmeta serve``: an exported SavedModel behind KServe's ModelServer (``gmeta_tf/serve``)."""
import click

from gmeta_tf.cli.common import friendly_errors
from gmeta_tf.serve.linger import DEFAULT_LINGER_MB, DEFAULT_LINGER_S
from gmeta_tf.serve.request_body import DEFAULT_MAX_BODY_MB


@click.command("serve")
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="SavedModel directory (from gmeta export).")
@click.option("--port", type=click.IntRange(1, 65535), required=True, help="HTTP port.")
@click.option("--name", default="model", show_default=True,
              help="Model name in the URLs: /v1/models/NAME:predict, /v2/models/NAME/infer.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind (0.0.0.0 inside a container).")
@click.option("--max-batch-size", type=click.IntRange(0), default=0, show_default=True,
              help="Merge concurrent predict requests into calls of up to this many rows (0: off).")
@click.option("--max-latency-ms", type=click.FloatRange(0), default=2.0, show_default=True,
              help="Longest a request waits for batch-mates (with --max-batch-size).")
@click.option("--max-body-mb", type=click.FloatRange(0, min_open=True), default=DEFAULT_MAX_BODY_MB,
              show_default=True, help="Largest request body, MiB: a larger one is refused with 413 before it is read.")
@click.option("--linger-s", type=click.FloatRange(0), default=DEFAULT_LINGER_S, show_default=True,
              help="After a 413, read and drop the rest of the body for at most this long before closing, so a "
                   "client that sends all before it reads gets the 413 (nginx's lingering_time; 0: close at once).")
@click.option("--linger-mb", type=click.FloatRange(0), default=DEFAULT_LINGER_MB, show_default=True,
              help="...and at most this many MiB of it; a client still sending past either bound is cut off.")
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="One log line per request.")
@friendly_errors
def serve_cmd(model_dir, port, name, host, max_batch_size, max_latency_ms, max_body_mb, linger_s, linger_mb,
              access_log):
    """Serve a SavedModel's signatures: TF Serving-style v1 REST and Open Inference Protocol v2.

    POST /v1/models/NAME:predict with {"signature_name": ..., "instances" | "inputs": ...};
    POST /v2/models/NAME/infer with parameters.signature_name. See docs/serving.md.
    """
    from gmeta_tf.serve.batcher import BatchingConfig
    from gmeta_tf.serve.linger import Linger
    from gmeta_tf.serve.server import ServeConfig, serve

    serve(ServeConfig(model_dir=model_dir, port=port, name=name, host=host, access_log=access_log, max_body_mb=max_body_mb,
                      linger=Linger(seconds=linger_s, max_mb=linger_mb),
                      batching=BatchingConfig(max_batch_size=max_batch_size, max_latency_ms=max_latency_ms)))
