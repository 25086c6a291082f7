"""Keep TensorFlow's and TFRA's start-up chatter out of every command's output.

Importing TF on a CPU host logs three ``Unable to register cu{FFT,DNN,BLAS} factory`` lines at
ERROR level (from C++, straight to fd 2), TFRA prints ``_SingleDeviceSaver removed ...`` and
warns about ``GraphKeys`` for every table: a user takes them for errors. ``TF_CPP_MIN_LOG_LEVEL=3``
would silence them and every real C++ error too, so instead exactly these known lines are
dropped and everything else is passed through unchanged.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile

NOISE = re.compile(
    r"Unable to register cu(?:FFT|DNN|BLAS) factory"
    r"|_SingleDeviceSaver removed after tf version"
    r"|dynamic_embedding\.GraphKeys has already been deprecated"
    r"|TF-TRT Warning: Could not find TensorRT"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|To enable the following instructions: .* in other operations, rebuild TensorFlow")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not NOISE.search(record.getMessage())


def _pass_through(text: str, stream) -> None:
    kept = [line for line in text.splitlines(keepends=True) if not NOISE.search(line)]
    if kept:
        stream.write("".join(kept))
        stream.flush()


def import_tensorflow() -> None:
    """Import TF and TFRA with their known start-up noise filtered; idempotent."""
    logging.getLogger("tensorflow").addFilter(_DropNoise())
    if "tensorflow_recommenders_addons.dynamic_embedding" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    out = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as err:
        os.dup2(err.fileno(), 2)
        try:
            with contextlib.redirect_stdout(out):
                import tensorflow  # noqa: F401
                import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            err.seek(0)
            _pass_through(err.read().decode("utf-8", "replace"), sys.stderr)
            _pass_through(out.getvalue(), sys.stdout)
