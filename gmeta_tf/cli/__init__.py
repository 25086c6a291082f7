"""The ``gmeta`` command line. Importing it imports TensorFlow once, with its start-up noise
filtered (``gmeta_tf.quiet``), before any sub-command module does."""
import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS first)
from gmeta_tf.quiet import import_tensorflow

import_tensorflow()
