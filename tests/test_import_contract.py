"""The architecture contract (``.importlinter``, docs/architecture.md) holds.

``make test`` and ``make lint`` run ``lint-imports`` too; this test keeps the contract in any
``pytest`` run (and in ``make test-fast``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([str(exe), "--no-cache", "--config", str(config)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_layers_contract_is_kept():
    r = _lint_imports(ROOT / ".importlinter", ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout and "KEPT" in r.stdout


def test_the_contract_catches_an_upward_import(tmp_path):
    # The same contract over a copy of two layers with one import going up: it must break.
    pkg = tmp_path / "gmeta_tf"
    for sub in ("config", "data"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config" / "schema.py").write_text("from gmeta_tf.data import prepare  # noqa\n")
    (pkg / "data" / "prepare.py").write_text("")
    cfg = tmp_path / "contract.ini"
    cfg.write_text("[importlinter]\nroot_packages =\n    gmeta_tf\n\n[importlinter:contract:layers]\n"
                   "name = up\ntype = layers\nlayers =\n    gmeta_tf.data\n    gmeta_tf.config\n")
    r = _lint_imports(cfg, tmp_path)
    assert r.returncode != 0 and "gmeta_tf.config.schema -> gmeta_tf.data.prepare" in r.stdout, r.stdout
