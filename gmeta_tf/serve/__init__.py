"""``gmeta serve``: an exported (stock TensorFlow) SavedModel behind KServe's REST endpoints.

* ``signatures``  the SavedModel's signatures as typed specs, read from its TensorSpecs
* ``tensors``     request values → arrays checked against a signature (every error names the input)
* ``v1_format``   TF Serving's REST body (``instances`` rows / ``inputs`` columns) in and out
* ``v2_format``   Open Inference Protocol v2 (``InferRequest``/``InferResponse``) in and out
* ``batcher``     bounded micro-batching of concurrent ``predict`` calls
* ``model``       the ``kserve.Model`` that ties them together
* ``request_body``  the body limit (413) and clients that hang up (499), before the app
* ``access_log``  one log line per request
* ``kserve_lib``  the KServe names relied on (public ones only, pinned by a test)
* ``server``      KServe's v1/v2 endpoints and our middleware on uvicorn, one host/port

Nothing here imports TFRA or the trainer: the served model is stock TensorFlow.
"""
