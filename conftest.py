# Loaded by pytest before any test module: TF_USE_LEGACY_KERAS must be set before TensorFlow
# is first imported (TFRA rejects Keras 3 optimizers), and importing gmeta_tf sets it.
import gmeta_tf  # noqa: F401
