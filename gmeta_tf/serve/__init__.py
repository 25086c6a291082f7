"""``gmeta serve``: an exported (stock TensorFlow) SavedModel behind KServe's Python ModelServer.

* ``signatures``  the SavedModel's signatures as typed specs, read from its TensorSpecs
* ``tensors``     request values → arrays checked against a signature (every error names the input)
* ``v1_format``   TF Serving's REST body (``instances`` rows / ``inputs`` columns) in and out
* ``v2_format``   Open Inference Protocol v2 (``InferRequest``/``InferResponse``) in and out
* ``batcher``     bounded micro-batching of concurrent ``predict`` calls
* ``model``       the ``kserve.Model`` that ties them together
* ``server``      KServe's ``ModelServer`` on one host/port

Nothing here imports TFRA or the trainer: the served model is stock TensorFlow.
"""
