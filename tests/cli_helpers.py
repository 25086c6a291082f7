"""Running ``gmeta`` in-process on a copy of shared prepared data (the copy is the test's own)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import List, Tuple


def profile_a_copy(src: Path, dest: Path, args: List[str]) -> Tuple[Path, object]:
    """``gmeta data profile DEST ARGS`` on a copy of ``src`` at ``dest``: (dest, click's result)."""
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli

    shutil.copytree(src, dest)
    return dest, CliRunner().invoke(cli, ["data", "profile", str(dest), *args])
