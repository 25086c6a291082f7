"""A failed command never damages a run; a damaged run is named and survived; data must match.

In-process training on tiny data (``tiny_data``): each fault is injected into a copy of one run
trained to step 30 (checkpoints at 10, 20, 30), and the next command must either resume to
exactly the result of an uninterrupted run or fail with one line saying what to do.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from fault_helpers import TINY_SETS

from gmeta_tf.cli.main import cli
from gmeta_tf.config.loader import load_config
from gmeta_tf.data.prepare import prepare
from gmeta_tf.train.trainer import train

SEED = int(os.environ.get("GMETA_FAULT_SEED", "0"))


def _cfg(data, steps, *sets):
    return load_config(None, [f"data.path={data}", f"train.steps={steps}", *TINY_SETS, *sets])


def _sets(*extra):
    return [a for s in [*TINY_SETS, *extra] for a in ("--set", s)]


def _gmeta(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def base_run(tiny_data, tmp_path_factory):
    """A run at step 30 and the dense digest an uninterrupted 40-step run ends with."""
    root = tmp_path_factory.mktemp("base")
    train(_cfg(tiny_data, 30), root / "run")
    straight = train(_cfg(tiny_data, 40), root / "straight")
    return root / "run", straight["dense_digest"]


@pytest.fixture
def run(base_run, tmp_path):
    shutil.copytree(base_run[0], tmp_path / "run")
    return tmp_path / "run"


def _ckpt(run, step):
    return run / "checkpoints" / f"ckpt-{step:08d}"


# -- 1. a failed resume leaves the run as it was ------------------------------------------------
def test_refused_resume_leaves_config_and_eval_intact(run, tiny_data):
    before = (run / "config.yaml").read_bytes()
    r = _gmeta("train", "--out", run, "--steps", 40, "--data", tiny_data, *_sets("model.embedding_dim=4"))
    assert r.exit_code == 2, r.output
    assert "does not match this model" in r.output and "Traceback" not in r.output
    assert (run / "config.yaml").read_bytes() == before  # the refused config was not written
    r = _gmeta("eval", "--run", run)
    assert r.exit_code == 0, r.output
    # each checkpoint keeps the config it was made with, covered by its checksums
    meta = json.loads((_ckpt(run, 30) / "meta.json").read_text())
    assert (_ckpt(run, 30) / "config.yaml").read_bytes() == before
    assert "config.yaml" in meta["files"]


@pytest.mark.parametrize("key", ["meta.inner_lr", "train.learning_rate"])
def test_infinite_rates_are_refused_by_key_everywhere(run, key):
    r = _gmeta("eval", "--run", run, "--set", f"{key}=.inf")
    assert r.exit_code == 2 and f"config key '{key}': must be a finite number" in r.output, r.output
    before = (run / "config.yaml").read_bytes()
    r = _gmeta("train", "--out", run, "--steps", 40, "--set", f"{key}=.nan")
    assert r.exit_code == 2 and key in r.output, r.output
    assert (run / "config.yaml").read_bytes() == before


# -- 2. a damaged checkpoint is named and skipped ---------------------------------------------
def _truncate(f: Path):
    f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 2)])


def _flip_byte(f: Path):
    data = bytearray(f.read_bytes())
    i = random.Random(SEED).randrange(len(data))
    data[i] ^= 0xFF
    f.write_bytes(bytes(data))


DAMAGE = {
    "truncated-table": (lambda c: sorted((c / "tables").glob("*.npz"))[0], _truncate),
    "flipped-byte-dense": (lambda c: sorted(c.glob("dense.data-*"))[0], _flip_byte),
    "garbage-meta": (lambda c: c / "meta.json", lambda f: f.write_text("{not json")),
    "missing-dense-index": (lambda c: c / "dense.index", lambda f: f.unlink()),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_and_resumes_exactly(run, base_run, damage):
    pick, hurt = DAMAGE[damage]
    victim = pick(_ckpt(run, 30))
    hurt(victim)
    logs = []
    summary = train(_cfg(load_config(run / "config.yaml").data.path, 40), run, _log_runtime(logs))
    text = "\n".join(logs)
    assert f"checkpoint {_ckpt(run, 30)} is damaged" in text, text
    assert victim.name in text or "meta.json" in text, text  # names the file at fault
    assert f"falling back to the newest intact checkpoint {_ckpt(run, 20)}" in text, text
    assert summary["start_step"] == 20
    assert summary["dense_digest"] == base_run[1]  # same result as never interrupted


def test_every_checkpoint_damaged_says_what_to_do(run):
    for c in (run / "checkpoints").glob("ckpt-*"):
        _truncate(sorted((c / "tables").glob("*.npz"))[0])
    r = _gmeta("eval", "--run", run)
    assert r.exit_code == 2, r.output
    assert "every checkpoint is damaged" in r.output and "--no-resume" in r.output, r.output
    assert "Traceback" not in r.output


def _log_runtime(logs):
    from gmeta_tf.train.trainer import Runtime

    return Runtime(log=logs.append)


# -- 3. data that does not match the model is refused ---------------------------------------------
def _reprepare(tiny_data, tmp_path, columns_edit, table_edit=None):
    raw = tmp_path / "raw2"
    raw.mkdir()
    src = Path(str(tiny_data).replace("prepared", "raw"))
    cols = json.loads((src / "columns.json").read_text())
    columns_edit(cols)
    (raw / "columns.json").write_text(json.dumps(cols))
    for f in sorted(src.glob("*.parquet")):
        t = pq.read_table(f)
        pq.write_table(table_edit(t) if table_edit else t, raw / f.name)
    schema = json.loads((tiny_data / "schema.json").read_text())
    cfg = load_config(None, [f"prepare.query={schema['support_query']['query']}",
                             f"prepare.max_support={schema['support_query']['max_support']}",
                             "prepare.min_task_size=12", "prepare.valid_frac=0.1", "prepare.test_frac=0.2",
                             "prepare.shards=2"]).prepare
    prepare([str(raw)], str(tmp_path / "prepared2"), cfg)
    return tmp_path / "prepared2"


def _ids_as_strings(t: pa.Table) -> pa.Table:
    i = t.schema.get_field_index("item_id")
    return t.set_column(i, "item_id", pa.array([str(v) for v in t.column(i).to_pylist()]))


MISMATCH = {
    "dense-reordered": (lambda c: c["dense"].reverse(), None,
                        "dense features are in another order"),
    "ids-as-strings": (lambda c: None, _ids_as_strings,
                       "categorical feature 'item_id' was int when trained, is hashed here"),
}


@pytest.mark.parametrize("case", sorted(MISMATCH))
def test_eval_and_resume_refuse_data_that_does_not_match(run, tiny_data, tmp_path, case):
    edit_cols, edit_table, words = MISMATCH[case]
    other = _reprepare(tiny_data, tmp_path, edit_cols, edit_table)
    r = _gmeta("eval", "--run", run, "--set", f"data.path={other}")
    assert r.exit_code == 2, r.output
    assert "cannot evaluate" in r.output and words in r.output, r.output
    before = (run / "config.yaml").read_bytes()
    r = _gmeta("train", "--out", run, "--steps", 40, "--data", other, *_sets())
    assert r.exit_code == 2 and "cannot resume" in r.output and words in r.output, r.output
    assert (run / "config.yaml").read_bytes() == before
    # the matching data still evaluates, and eval.json says which data it scored
    r = _gmeta("eval", "--run", run)
    assert r.exit_code == 0, r.output
    scored = json.loads((run / "eval.json").read_text())["data"]
    assert scored["path"] == str(tiny_data) and len(scored["fingerprint"]["sha256"]) == 64
    assert scored["checkpoint"].endswith("ckpt-00000030")


# -- 7. small ones ------------------------------------------------------------------------------
def test_relative_data_path_is_stored_absolute(tiny_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_data.parent)
    train(_cfg(os.path.relpath(tiny_data, tiny_data.parent), 10), tmp_path / "rel")
    assert load_config(tmp_path / "rel" / "config.yaml").data.path == str(tiny_data)
    monkeypatch.chdir(tmp_path)
    r = _gmeta("eval", "--run", tmp_path / "rel")
    assert r.exit_code == 0, r.output


def test_resume_past_the_requested_steps_is_refused(run, tiny_data):
    before = (run / "config.yaml").read_bytes()
    r = _gmeta("train", "--out", run, "--steps", 10, "--data", tiny_data, *_sets())
    assert r.exit_code == 2, r.output
    assert "at step 30, past train.steps=10: nothing to train" in r.output, r.output
    assert "trained" not in r.output
    assert (run / "config.yaml").read_bytes() == before
