"""Write one local file whole, so a reader never sees half of it.

Every small file a reader may open while it is being rewritten (a checkpoint's table files and
``meta.json`` through ``storage``, ``placement.yaml``, ``schema.json``'s table statistics, the
cost model, the id profile, a PS's ready file) goes through ``replace_file``: the bytes go to a
temporary sibling (same filesystem), which ``os.replace`` then moves into place atomically. A
failed write removes the temporary file and leaves the old one as it was. Directories are
committed the same way by ``data/atomic.py`` (outputs of ``prepare``) and ``train/checkpoint.py``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union


def replace_file(path: Union[str, Path], data: Union[bytes, str]) -> None:
    path = str(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
