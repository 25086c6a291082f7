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


TFRA = "tensorflow_recommenders_addons"
# TFRA is imported by one module, gmeta_tf/embedding/tfra.py (which imports it without Keras 3);
# its internals are known to the embedding package alone, and the PS loads its kernels through it.
TFRA_ALLOWED = ("gmeta_tf/embedding/tfra.py:",)


def tfra_importers(root: Path, folders=("gmeta_tf", "launch", "ps", "bench")) -> list:
    """Every ``path:line`` under ``root`` that imports TFRA (``import``, ``from``, or
    ``importlib.import_module`` / ``__import__`` of a constant name)."""
    import ast

    found = []
    for folder in folders:
        for f in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(f.read_text(), str(f))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module]
                elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                      and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__")):
                    names = [str(node.args[0].value)]
                if any(n == TFRA or n.startswith(TFRA + ".") for n in names):
                    found.append(f"{f.relative_to(root).as_posix()}:{node.lineno}")
    return found


def test_only_gmeta_tf_embedding_tfra_imports_tfra():
    outside = [hit for hit in tfra_importers(ROOT) if not hit.startswith(TFRA_ALLOWED)]
    assert outside == [], f"TFRA imported outside gmeta_tf/embedding/tfra.py: {outside}"
    assert any(hit.startswith("gmeta_tf/embedding/tfra.py:") for hit in tfra_importers(ROOT))


def test_the_tfra_check_catches_every_import_form(tmp_path):
    (tmp_path / "gmeta_tf" / "model").mkdir(parents=True)
    (tmp_path / "gmeta_tf" / "model" / "a.py").write_text(
        f"import {TFRA} as tfra\nfrom {TFRA}.dynamic_embedding import Variable\n"
        f"import importlib\nimportlib.import_module('{TFRA}')\n")
    (tmp_path / "gmeta_tf" / "model" / "b.py").write_text("import tensorflow\nNAMES = {'" + TFRA + "'}\n")
    hits = tfra_importers(tmp_path, folders=("gmeta_tf",))
    assert hits == ["gmeta_tf/model/a.py:1", "gmeta_tf/model/a.py:2", "gmeta_tf/model/a.py:4"]
