"""gmeta-tf: distributed meta-learning for deep recommendation models.

Data flows prepare → Meta-IO → model → meta step → PS / all-reduce → checkpoint:

* ``gmeta_tf.data``       sample-level tables → task-major Parquet (``prepare``), synthetic data
* ``gmeta_tf.metaio``     task-major Parquet → padded ``tf.data`` task batches
* ``gmeta_tf.embedding``  every embedding table: TFRA tables, hot tier, optimizers, table files
* ``gmeta_tf.model``      the DLRM: its embeddings and the functional dense tower
* ``gmeta_tf.meta``       inner loop (fast weights) and outer meta step, ERM baseline step
* ``gmeta_tf.train``      training loop, dense-gradient sync, checkpoints
* ``gmeta_tf.evaluation`` adapt-then-score on unseen tasks, metrics

``TF_USE_LEGACY_KERAS`` must be set before TensorFlow is first imported (TFRA rejects Keras 3
optimizers), so importing this package sets it. Python runs this file before any module of the
package, so no module of it needs to say so again; code outside the package (``ps/``, ``bench/``,
scripts) imports ``gmeta_tf`` before TensorFlow.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
