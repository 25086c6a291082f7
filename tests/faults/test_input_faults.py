"""Faults around ``gmeta data prepare`` and the config: full disk, killed prepare, bad numbers
and names, start-up noise. Real processes: the CLI in a subprocess, a real file-size limit."""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError

REPO = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("GMETA_FAULT_SEED", "0"))
GMETA = [sys.executable, "-m", "gmeta_tf.cli.main"]
PREPARE_SETS = ["prepare.query=4", "prepare.max_support=8", "prepare.min_task_size=12", "prepare.shards=2"]


def _prepare_argv(raw, out):
    argv = [*GMETA, "data", "prepare", "--input", str(raw), "--out", str(out)]
    for s in PREPARE_SETS:
        argv += ["--set", s]
    return argv


def _run(argv, timeout=300, **kw):
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kw)


def _raw(tiny_data):
    return Path(str(tiny_data).replace("prepared", "raw"))


def _full_disk(limit_bytes):
    """In the child only: files may not grow past ``limit_bytes`` (writes fail with EFBIG, as
    on a full disk they fail with ENOSPC); SIGXFSZ ignored so the write returns the error."""
    def setup():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return setup


@pytest.mark.integration
def test_full_disk_during_prepare_is_one_line_and_leaves_nothing(tiny_data, tmp_path):
    out = tmp_path / "prepared"
    r = _run(_prepare_argv(_raw(tiny_data), out), preexec_fn=_full_disk(20_000))
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and err[-1].startswith("error: cannot write "), r.stderr
    assert str(out) in err[-1] and "free disk space" in err[-1], err[-1]
    assert sorted(os.listdir(tmp_path)) == []  # neither the output nor a temporary directory
    r = _run(_prepare_argv(_raw(tiny_data), out))  # space again: the same command works
    assert r.returncode == 0, r.stderr


@pytest.mark.integration
def test_killed_prepare_leaves_nothing_the_next_one_keeps(tiny_data, tmp_path):
    """kill -9 at a random point of a prepare; the next prepare cleans its temporary directory
    and writes exactly what an uninterrupted prepare writes."""
    out = tmp_path / "prepared"
    proc = subprocess.Popen(_prepare_argv(_raw(tiny_data), out), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        # until it started writing; a prepare that finished between two looks (a tiny data set on
        # a loaded box) is handled below, not waited for until the deadline
        while not list(tmp_path.glob("prepared.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(random.Random(SEED).uniform(0.0, 0.5))
        proc.send_signal(signal.SIGKILL)  # nothing if it already finished (and was reaped by poll)
    finally:
        proc.kill()
        proc.wait()
    if out.exists():  # it finished before the kill: make it a kill between start and commit
        out.rename(tmp_path / f"prepared.tmp-{proc.pid}")
    assert list(tmp_path.glob("prepared.tmp-*")), "the kill left no temporary directory to clean"
    r = _run(_prepare_argv(_raw(tiny_data), out))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prepared"]  # the stale one is gone
    expected = json.loads((tiny_data / "schema.json").read_text())
    got = json.loads((out / "schema.json").read_text())
    assert got["splits"] == expected["splits"] and got["summary"] == expected["summary"]


# -- 6. numbers as a user writes them ----------------------------------------------------------
@pytest.mark.parametrize("text, value", [("1e-4", 1e-4), ("3e-3", 3e-3), ("2E-5", 2e-5), ("1.5e-3", 1.5e-3)])
def test_exponent_floats_are_floats_in_set_and_yaml(tmp_path, text, value):
    assert load_config(None, [f"train.learning_rate={text}"]).train.learning_rate == value
    f = tmp_path / "c.yaml"
    f.write_text(f"train:\n  learning_rate: {text}\n")
    assert load_config(f).train.learning_rate == value


@pytest.mark.parametrize("item", ["train.learning_rate=.inf", "meta.inner_lr=-.inf", "eval.finetune_lr=.nan",
                                  "train.embedding_learning_rate=.Inf", "cluster.connect_timeout_s=.inf"])
def test_non_finite_floats_fail_naming_the_key(item):
    key = item.split("=")[0]
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config(None, [item])


def test_unknown_key_names_its_section_and_bad_enum_lists_values():
    with pytest.raises(ConfigError, match=r"unknown config key 'model\.embeding_dim' \(section 'model' has: embedding_dim,"):
        load_config(None, ["model.embeding_dim=8"])
    with pytest.raises(ConfigError, match=r"expected one of adam, adagrad, got 'sgd'"):
        load_config(None, ["train.optimizer=sgd"])
    with pytest.raises(ConfigError, match=r"'meta\.adapt': expected one of head, top, dense, dense\+embedding"):
        load_config(None, ["meta.adapt=all"])


# -- 7. no start-up noise, real errors still shown ----------------------------------------------
NOISE = ("Unable to register", "GraphKeys", "_SingleDeviceSaver", "cuda_")


@pytest.mark.integration
def test_commands_print_no_tensorflow_noise_but_real_errors(tiny_data, tmp_path):
    r = _run([*GMETA, "train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "--steps", "2",
              "--set", "data.tasks_per_batch=4", "--set", "train.log_every=1"])
    assert r.returncode == 0, r.stderr
    both = r.stdout + r.stderr
    assert not [w for w in NOISE if w in both], both
    r = _run([*GMETA, "eval", "--run", str(tmp_path / "nope")])
    assert r.returncode == 2 and "not a run directory" in r.stderr, r.stderr
    assert not [w for w in NOISE if w in r.stderr], r.stderr
