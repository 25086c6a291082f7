"""Run-directory I/O for local disks *and* object stores (``gs://``, ``s3://``, ``ram://``).

Why: on Kubernetes the run directory (checkpoints, summaries, ``config.yaml``) is often a bucket
rather than a mounted volume (``gmeta k8s render --checkpoint-uri gs://bucket/run``). Everything
that reads or writes a run directory goes through these few functions, which use
``tf.io.gfile`` and therefore reach whatever filesystems TensorFlow has registered: local paths,
``file://``, ``gs://`` (built into TensorFlow), the in-memory ``ram://`` (used by the tests)
and ``s3://`` / ``az://`` / ``hdfs://`` once ``tensorflow-io`` is imported (``_ready`` does that
on first use, or says in one line what to install).

What differs between the two kinds of storage is *commit*: a local ``rename`` is atomic, an
object-store "rename" is a copy plus a delete. So callers write whole objects (one PUT each, which
object stores make visible all at once) and mark completion by writing a small marker object
last; see ``train/checkpoint.py``.
"""
from __future__ import annotations

import io
import os
import re
from typing import List

import tensorflow as tf

from gmeta_tf.atomic_file import replace_file
from gmeta_tf.errors import CheckpointError

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
gfile = tf.io.gfile


def scheme(path: str) -> str:
    """``""`` for a plain local path, else the URI scheme (``gs``, ``s3``, ``ram``, ``file``...)."""
    m = _SCHEME.match(str(path))
    return m.group(1).lower() if m else ""


def is_local(path: str) -> bool:
    """True where ``os.replace`` gives atomic commits (a plain path or ``file://``)."""
    return scheme(path) in ("", "file")


def local_path(path: str) -> str:
    """The OS path of a local run path (``file:///x`` -> ``/x``)."""
    path = str(path)
    return path[len("file://"):] if scheme(path) == "file" else path


def join(base: str, *parts: str) -> str:
    base = str(base)
    if scheme(base):
        return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])
    return os.path.join(base, *parts)


def basename(path: str) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


_PLUGIN_SCHEMES = ("s3", "az", "hdfs", "http", "https")  # provided by tensorflow-io
_ready_schemes = {"", "file"}


def _ready(path: str) -> None:
    """Make sure TensorFlow can reach ``path``'s filesystem (once per scheme): import
    tensorflow-io for the schemes it provides, else fail naming the path and the fix."""
    sch = scheme(path)
    if sch in _ready_schemes:
        return
    if sch not in gfile.get_registered_schemes() and sch in _PLUGIN_SCHEMES:
        try:
            import tensorflow_io  # noqa: F401  (registers its filesystems on import)
        except ImportError:
            raise CheckpointError(
                f"{path}: TensorFlow has no {sch}:// filesystem built in; install the s3 extra "
                f"(pip install 'gmeta-tf[s3]', i.e. tensorflow-io) in the image to use it") from None
    if sch not in gfile.get_registered_schemes():
        known = ", ".join(f"{x}://" for x in gfile.get_registered_schemes() if x) + ", or a local path"
        raise CheckpointError(f"{path}: no filesystem for {sch}:// in this TensorFlow (use {known})")
    _ready_schemes.add(sch)


def _wrap(path: str, what: str, e: Exception) -> CheckpointError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return CheckpointError(f"{path}: cannot {what}: {first}")


def exists(path: str) -> bool:
    _ready(path)
    return gfile.exists(str(path))


def isdir(path: str) -> bool:
    _ready(path)
    return gfile.isdir(str(path))


def makedirs(path: str) -> None:
    _ready(path)
    try:
        gfile.makedirs(str(path))
    except tf.errors.OpError as e:
        raise _wrap(path, "create the directory", e) from None


def listdir(path: str) -> List[str]:
    """Entry names (no trailing ``/``); empty when ``path`` does not exist."""
    _ready(path)
    if not gfile.isdir(str(path)):
        return []
    return sorted(n.rstrip("/") for n in gfile.listdir(str(path)))


def rmtree(path: str) -> None:
    """Remove a directory (or object prefix) and everything under it; missing is fine."""
    _ready(path)
    try:
        if gfile.isdir(str(path)):
            gfile.rmtree(str(path))
        elif gfile.exists(str(path)):
            gfile.remove(str(path))
    except tf.errors.NotFoundError:
        pass


def read_bytes(path: str) -> bytes:
    _ready(path)
    try:
        with gfile.GFile(str(path), "rb") as f:
            return f.read()
    except tf.errors.OpError as e:
        raise _wrap(path, "read", e) from None


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_bytes(path: str, data: bytes) -> None:
    """Write one whole file/object. Locally through a temporary name and ``os.replace``, so a
    reader never sees half a file; on an object store one upload, which is all-or-nothing."""
    path = str(path)
    _ready(path)
    try:
        if is_local(path):
            replace_file(local_path(path), data)
        else:
            if scheme(path) == "ram" and gfile.exists(path):
                # TF's in-memory filesystem appends to an existing file instead of replacing it
                # (object stores replace), so emulate replacement there.
                gfile.remove(path)
            with gfile.GFile(path, "wb") as f:
                f.write(data)
    except (OSError, tf.errors.OpError) as e:
        raise _wrap(path, "write", e) from None


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def npz_bytes(**arrays) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def load_npz(path: str):
    import numpy as np

    return np.load(io.BytesIO(read_bytes(path)))
