"""Keep TensorFlow's and TFRA's start-up chatter out of every command's output.

Importing TF on a CPU host logs three ``Unable to register cu{FFT,DNN,BLAS} factory`` lines at
ERROR level (from C++, straight to fd 2), TFRA prints ``_SingleDeviceSaver removed ...`` and
warns about ``GraphKeys`` for every table: a user takes them for errors. ``TF_CPP_MIN_LOG_LEVEL=3``
would silence them and every real C++ error too, so instead exactly these known lines are
dropped and everything else is passed through unchanged.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
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


@contextlib.contextmanager
def _filtered_output():
    """Capture fd 2 (C++ logs) and Python's stdout (TFRA's print) and pass on all but noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    out = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as err:
        os.dup2(err.fileno(), 2)
        try:
            with contextlib.redirect_stdout(out):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            err.seek(0)
            _pass_through(err.read().decode("utf-8", "replace"), sys.stderr)
            _pass_through(out.getvalue(), sys.stdout)


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with _filtered_output():
            self._loader.exec_module(module)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Wraps the first import of TF / TFRA in ``_filtered_output``; commands that never import
    TF (``gmeta --help``, ``data prepare``) pay nothing."""

    def find_spec(self, name, path, target=None):
        if name not in _NOISY:
            return None
        _NOISY.discard(name)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


_NOISY = {"tensorflow", "tensorflow_recommenders_addons"}


def install() -> None:
    """Filter TF's and TFRA's known start-up noise from here on; idempotent."""
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())
    if not any(isinstance(f, _QuietFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())
