"""The ``gmeta`` command line. TensorFlow's start-up noise is filtered for every command
(``gmeta_tf.quiet``), whenever a command first imports it."""
import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS first)
from gmeta_tf import quiet

quiet.install()
