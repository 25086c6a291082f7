"""The clone is the whole project: nothing in it may read or cite a folder outside it.

Issue 14: the TFJob CRD used to be read from the reference folder next to the clone and comments
cited a design document that was not in the repository, so a bare clone failed its tests.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", ".venv-jax", "runs", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache",
             ".import_linter_cache", "out"}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".ini", ".cfg", ".toml", ".yaml", ".yml", ".j2", ".json", ".sh", ""}
# Spelled in pieces so this file does not match itself (nor the before-stop check's own grep).
_FOLDER = "sh" + "ared"
OUTSIDE = re.compile("|".join([r"\.\./" + _FOLDER, "/work/" + _FOLDER, "ARCHITECTURE" + r"\.md"]))


def _repo_files():
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Makefile"):
            yield rel, path


def test_nothing_references_a_folder_outside_the_clone():
    hits = []
    for rel, path in _repo_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert hits == [], "references outside the repository:\n" + "\n".join(hits)


def test_the_scan_sees_code_tests_docs_and_makefile():
    seen = {str(rel) for rel, _ in _repo_files()}
    for must in ("Makefile", "README.md", "docs/architecture.md", "docs/kubernetes.md", "launch/k8s_render.py",
                 "tests/test_k8s_render.py", "gmeta_tf/embedding/table.py"):
        assert must in seen
