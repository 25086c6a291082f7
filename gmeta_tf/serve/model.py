"""The ``kserve.Model`` that serves every signature of one SavedModel.

KServe hands ``predict`` a decoded JSON dict for the v1 endpoint and an ``InferRequest`` for
v2; both are parsed against the signature's specs (``BadRequest`` → KServe's ``InvalidInput``,
HTTP 400) before the model runs. The model runs in the event loop's thread pool, so a slow call
never blocks health checks or other requests; TensorFlow releases the GIL while it computes.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Dict, List, Optional

import numpy as np
from prometheus_client import Counter

from gmeta_tf.errors import tf_error_cause
from gmeta_tf.serve import v1_format, v2_format
from gmeta_tf.serve.access_log import SERVE_LOGGER
from gmeta_tf.serve.batcher import BatchingConfig, MicroBatcher, not_batchable
from gmeta_tf.serve.kserve_lib import InferRequest, InvalidInput, Model, from_np_dtype
from gmeta_tf.serve.signatures import DEFAULT_SIGNATURE, Signature, load_saved_model
from gmeta_tf.serve.tensors import BadRequest

log = logging.getLogger(SERVE_LOGGER)

# On KServe's /metrics: rows / calls is the batcher's mean merged batch size per signature.
MODEL_CALLS = Counter("gmeta_serve_model_calls", "calls of a signature's function (merged calls count once)",
                      ["model_name", "signature"])
MODEL_ROWS = Counter("gmeta_serve_model_rows", "rows (first-dimension samples of the outputs) scored by those calls",
                     ["model_name", "signature"])

class SavedModelServer(Model):
    def __init__(self, name: str, model_dir: str, batching: Optional[BatchingConfig] = None):
        super().__init__(name)
        self.model_dir = model_dir
        self.batching = batching or BatchingConfig()
        self.signatures: Dict[str, Signature] = {}
        self._loaded: Any = None
        self._runners: Dict[str, Any] = {}
        self._batchers: Dict[str, MicroBatcher] = {}

    def load(self) -> bool:
        """Raises ``ModelDirError`` (a ``UserError``) naming the path when it is not a SavedModel."""
        self._loaded, self.signatures = load_saved_model(self.model_dir)
        self._runners = {name: self._runner(sig) for name, sig in self.signatures.items()}
        if self.batching.enabled:
            self._plan_batching()
        self.ready = True
        return self.ready

    def _plan_batching(self) -> None:
        """A batcher per signature that can be merged; every other one is named with why."""
        cfg = self.batching
        for name, sig in sorted(self.signatures.items()):
            reason = not_batchable(sig)
            if reason is None:
                self._batchers[name] = MicroBatcher(self._runners[name], cfg, sig)
            else:
                log.warning("signature %r is not micro-batched (--max-batch-size %d): %s; each request runs alone",
                            name, cfg.max_batch_size, reason)
        if self._batchers:
            log.info("micro-batching %s: up to %d rows per call, waiting at most %g ms for batch-mates",
                     ", ".join(sorted(self._batchers)), cfg.max_batch_size, cfg.max_latency_ms)

    def start(self) -> None:
        """KServe's default marks the model ready here; readiness comes from ``load`` alone."""

    def _runner(self, sig: Signature):
        import tensorflow as tf

        fn = self._loaded.signatures[sig.name]
        calls, rows = (c.labels(model_name=self.name, signature=sig.name) for c in (MODEL_CALLS, MODEL_ROWS))

        def run(arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
            try:
                out = fn(**{k: tf.constant(v) for k, v in arrays.items()})
            except tf.errors.InvalidArgumentError as e:
                sizes = ", ".join(f"{k}{list(v.shape)}" for k, v in sorted(arrays.items()))
                raise BadRequest(f"signature {sig.name!r} rejected the inputs ({sizes}): "
                                 f"{tf_error_cause(e.message)}") from None
            out = {k: v.numpy() for k, v in out.items()}
            calls.inc()
            rows.inc(len(next(iter(out.values()))) if out and next(iter(out.values())).ndim else 0)
            return out

        return run

    async def _infer(self, sig: Signature, arrays: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        batcher = self._batchers.get(sig.name)
        if batcher is not None:
            return await batcher.submit(arrays)
        return await asyncio.get_running_loop().run_in_executor(None, self._runners[sig.name], arrays)

    async def predict(self, payload: Any, headers: Optional[Dict[str, str]] = None):
        try:
            if isinstance(payload, InferRequest):
                sig, arrays = v2_format.parse(payload, self.signatures)
                return v2_format.encode(self.name, payload, sig, await self._infer(sig, arrays))
            request = v1_format.parse(payload, self.signatures)
            return v1_format.encode(request, await self._infer(request.signature, request.arrays))
        except BadRequest as e:
            raise InvalidInput(str(e)) from None

    def _types(self, which: str) -> List[Dict[str, Any]]:
        sig = self.signatures.get(DEFAULT_SIGNATURE) or next(iter(self.signatures.values()))
        specs = getattr(sig, which)
        return [{"name": t.name, "datatype": from_np_dtype(t.dtype),
                 "shape": [-1 if d is None else d for d in (t.shape or ())]} for t in specs.values()]

    def get_input_types(self) -> List[Dict[str, Any]]:
        """v2 model metadata: the default signature's inputs."""
        return self._types("inputs")

    def get_output_types(self) -> List[Dict[str, Any]]:
        return self._types("outputs")
