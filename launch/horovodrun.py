"""``horovodrun``, less the Gloo probe it repeats before every launch.

Why: before it starts any rank, ``horovodrun --gloo`` forks a process that imports
``horovod.tensorflow`` (so all of TensorFlow) only to ask whether Horovod was built with Gloo
(``horovod.common.util.gloo_built``): about 3 s of CPU and of wall time at every start and at every
restart of a cluster (docs/startup.md). The answer changes only when Horovod is rebuilt, so here it
is asked once per build of Horovod's extensions and kept in a small file named after that build
(each extension's path, size and mtime). A "yes" is kept; a "no" is never kept, so horovodrun's
own probe runs again and fails with its own message. A cache that cannot be read or written only
means asking every time, as horovodrun does.

Everything else is Horovod's ``run_commandline``, unchanged: the same arguments, rendezvous, rank
environment, output and exit code. ``python -m launch.horovodrun ARGS`` is ``horovodrun ARGS``.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable, List, Optional

CACHE_DIR_ENV = "GMETA_CACHE_DIR"  # default: $XDG_CACHE_HOME/gmeta, else ~/.cache/gmeta


def argv(python: str = sys.executable) -> List[str]:
    """The command that runs ``horovodrun`` this way (arguments follow)."""
    return [python, "-m", "launch.horovodrun"]


def cache_dir(env=os.environ) -> Path:
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV])
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gmeta"


def build_key(horovod_dir: str) -> str:
    """One name per build of Horovod's extensions: a rebuild (or another install) is a new key."""
    parts = []
    for so in sorted(glob.glob(os.path.join(horovod_dir, "*", "mpi_lib*.so"))):
        st = os.stat(so)
        parts.append(f"{so}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def remembered_gloo_built(probe: Callable[..., Optional[bool]], horovod_dir: str,
                          directory: Path) -> Callable[..., Optional[bool]]:
    """``probe`` (Horovod's ``gloo_built``) behind a per-build answer file."""
    path = directory / f"horovod-gloo-{build_key(horovod_dir)}.json"

    def gloo_built(verbose: bool = False) -> Optional[bool]:
        try:
            if json.loads(path.read_text()).get("gloo_built") is True:
                return True
        except (OSError, ValueError, AttributeError):
            pass
        answer = probe(verbose=verbose)
        if answer is True:
            try:
                from gmeta_tf.atomic_file import replace_file

                directory.mkdir(parents=True, exist_ok=True)
                replace_file(path, json.dumps({"gloo_built": True, "horovod": horovod_dir}) + "\n")
            except OSError:
                pass
        return answer

    return gloo_built


def main() -> int:
    import horovod
    from horovod.runner import launch

    launch.gloo_built = remembered_gloo_built(launch.gloo_built, os.path.dirname(horovod.__file__), cache_dir())
    sys.argv[0] = "horovodrun"
    return launch.run_commandline() or 0


if __name__ == "__main__":
    sys.exit(main())
