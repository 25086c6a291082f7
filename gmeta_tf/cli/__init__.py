"""The ``gmeta`` command line. TensorFlow's start-up noise is filtered for every command
(``gmeta_tf.quiet``), whenever a command first imports it."""
from gmeta_tf import quiet

quiet.install()
