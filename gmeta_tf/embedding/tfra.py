"""TFRA, imported in one place, without importing Keras 3 for nothing.

Why: TFRA 0.8.1 (``dynamic_embedding/python/ops/tf_save_restore_patch.py`` and
``python/keras/models.py``) tries ``from keras.saving.saved_model import save``, a Keras 2 module.
The ``keras`` that TF 2.16 installs is Keras 3, which has no such module, so the import fails
(TFRA catches that and patches nothing), but only after all of Keras 3 was imported and, through
its scikit-learn wrapper, scikit-learn and SciPy's stats: 1.1 s of CPU in every process that
imports TFRA, i.e. each PS, each rank, at each start and restart (docs/startup.md).

While TFRA imports, ``keras`` is shadowed (``sys.modules["keras"] = None``), so that import fails
at once, with the same ``ModuleNotFoundError`` family TFRA already catches: TFRA ends in the same
state (pinned by tests/test_tfra_hazards.py). The shadow is removed at once; this project's Keras
is tf_keras (``TF_USE_LEGACY_KERAS``), and a process that imported Keras 3 before is left alone.
"""
from __future__ import annotations

import sys

_TFRA_DE = "tensorflow_recommenders_addons.dynamic_embedding"


def _import_without_keras3() -> None:
    if _TFRA_DE in sys.modules or "keras" in sys.modules:
        import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401
        return
    sys.modules["keras"] = None  # `import keras` raises ModuleNotFoundError, without importing it
    try:
        import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401
    finally:
        if "keras" in sys.modules and sys.modules["keras"] is None:
            del sys.modules["keras"]


_import_without_keras3()

import tensorflow_recommenders_addons as tfra  # noqa: E402
from tensorflow_recommenders_addons.dynamic_embedding.python.ops.dynamic_embedding_variable import (  # noqa: E402
    default_partition_fn,
)

de = tfra.dynamic_embedding

__all__ = ["tfra", "de", "default_partition_fn"]
