"""Write an output directory all-or-nothing.

Why: a crashed or failed ``prepare``/``synth`` must never leave a directory that *looks*
complete (a reader would silently train on half the shards). Everything is written into a
temporary sibling (same filesystem, so the final ``rename`` is atomic), and only a finished
directory is moved into place. With ``overwrite`` an existing output is replaced only after
the new one is complete, and it is left untouched when anything fails before that.

A write that fails (a full disk, a file-size limit) is a ``DataError`` naming the path, and
the temporary directory goes with it. A process killed outright cannot clean up, so the next
run removes the ``.tmp-<pid>`` / ``.old-<pid>`` siblings whose process is gone.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gmeta_tf.errors import DataError
from gmeta_tf.process import pid_alive


def check_target(out: Path, overwrite: bool) -> None:
    """Refuse early (before any work) when ``out`` exists and may not be replaced."""
    if out.exists() and not out.is_dir():
        raise DataError(f"output {out} exists and is not a directory")
    if out.exists() and not overwrite:
        raise DataError(f"output directory {out} already exists; pass --overwrite to replace it")


def temp_path(out: Path) -> Path:
    return out.parent / f"{out.name}.tmp-{os.getpid()}"


def remove_stale(out: Path) -> None:
    """Remove what killed runs left next to ``out`` (their pid no longer exists)."""
    if not out.parent.is_dir():
        return
    pattern = re.compile(re.escape(out.name) + r"\.(?:tmp|old)-(\d+)")
    for entry in out.parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def atomic_dir(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a temp dir to fill; on success it becomes ``out``, on failure it is removed."""
    out = Path(out)
    check_target(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    tmp = temp_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        check_target(out, overwrite)  # someone may have created it meanwhile
        _commit(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
        raise DataError(
            f"cannot write {e.filename or out}: {e.strerror or str(e).splitlines()[0]}; nothing was written to {out}"
            + ("; free disk space (or raise the quota / file-size limit) and re-run" if full else "")) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _commit(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.parent / f"{out.name}.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
