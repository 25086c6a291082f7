"""``model.max_rows``: a table keeps at most N rows while training sees ever more ids; its optimizer
slots and update counts follow it, and a resumed run evicts exactly as an uninterrupted one."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.embedding.table_files import read_table

SETS = ["data.tasks_per_batch=8", "data.support=8", "data.query=8", "data.shuffle_buffer=64",
        "model.embedding_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[16]", "train.log_every=10",
        "train.eval_every=0", "train.checkpoint_every=10"]
MAX_ROWS = 300


def test_evict_removes_the_least_updated_rows_smallest_id_first_with_their_slots():
    table = EmbeddingTable("t", 2, ["/CPU:0"], "evict-test", 0.1, seed=0, counted=True)
    keys = tf.constant([10, 11, 12, 13, 14], tf.int64)
    table.variable.upsert(keys, tf.ones([5, 2]))
    table.frequency.upsert(keys, tf.constant([[3], [1], [1], [5], [2]], tf.int32))
    assert table.evict(3, optimizer=None) == 2
    left, _ = table.export()
    assert sorted(left.tolist()) == [10, 13, 14]  # counts 1 and 1 went; of two ties, both were below the bar
    table.frequency.upsert(tf.constant([10, 13, 14], tf.int64), tf.constant([[2], [5], [2]], tf.int32))
    assert table.evict(2, optimizer=None) == 1
    assert sorted(table.export()[0].tolist()) == [13, 14]  # a tie at count 2: the smaller id 10 goes
    assert sorted(table.frequency.export()[0].numpy().tolist()) == [13, 14]
    assert table.evict(2, optimizer=None) == 0


def test_max_rows_names_its_key():
    with pytest.raises(ConfigError, match=r"model\.max_rows\.item_id"):
        load_config(None, ["model.max_rows.item_id=0"])


def _cfg(data, *extra):
    return load_config("configs/quickstart.yaml", [f"data.path={data}", *SETS, f"model.max_rows.item_id={MAX_ROWS}",
                                                   *extra])


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"ckpt-{step:08d}"


@pytest.fixture(scope="module")
def ten_steps(prepared_kinds, tmp_path_factory) -> Path:
    """A bounded run stopped at step 10 (checkpointed there), trained once for the module: the
    start the resume test continues (from a copy) and the warm start's "yesterday" checkpoint."""
    from gmeta_tf.train.trainer import train

    run = tmp_path_factory.mktemp("bounded") / "ten"
    train(_cfg(prepared_kinds["click"], "train.steps=10"), run)
    return run


@pytest.mark.integration
def test_the_table_stays_bounded_slots_follow_and_the_resume_is_exact(prepared_kinds, ten_steps, tmp_path):
    import shutil

    from gmeta_tf.train.trainer import train

    data = prepared_kinds["click"]
    whole = train(_cfg(data, "train.steps=30"), tmp_path / "whole")
    shutil.copytree(ten_steps, tmp_path / "resumed")  # the first 10 steps, as a run of its own
    resumed = train(_cfg(data, "train.steps=30"), tmp_path / "resumed")
    assert resumed["start_step"] == 10

    seen = set()  # every item id the first 30 steps could have inserted: far more than MAX_ROWS
    for step in (10, 20, 30):
        ckpt = _ckpt(tmp_path / "whole", step)
        keys, _ = read_table(str(ckpt), "item_id")
        assert len(keys) <= MAX_ROWS
        for part in ("m", "v", "frequency"):  # Adam's slots and the update counts hold the same ids
            other, _ = read_table(str(ckpt), f"item_id.{part}")
            assert sorted(other.tolist()) == sorted(keys.tolist()), part
        seen |= set(keys.tolist())
        rows = json.loads((ckpt / "meta.json").read_text())["rows"]
        assert rows["item_id"] == len(keys)
    assert len(seen) > MAX_ROWS  # ids came and went
    assert len(read_table(str(_ckpt(tmp_path / "whole", 30)), "item_category")[0]) > 0  # unbounded tables untouched

    # The resumed run evicted the same rows and trained the same weights.
    assert resumed["dense_digest"] == whole["dense_digest"]
    for name in ("item_id", "item_id.m", "item_id.frequency"):
        a_keys, a_vals = read_table(str(_ckpt(tmp_path / "whole", 30)), name)
        b_keys, b_vals = read_table(str(_ckpt(tmp_path / "resumed", 30)), name)
        ia, ib = np.argsort(a_keys), np.argsort(b_keys)
        np.testing.assert_array_equal(a_keys[ia], b_keys[ib])
        np.testing.assert_array_equal(a_vals[ia], b_vals[ib])


@pytest.mark.integration
def test_two_workers_two_ps_warm_start_and_stay_bounded(prepared_kinds, ten_steps, tmp_path):
    """Real PS processes and ``horovodrun -np 2`` (``gmeta launch local``): the warm start refills
    the PS tables from an embedded run's checkpoint, rank 0 evicts between steps while the other
    rank waits, and both ranks end with the same dense weights."""
    import uuid

    from cluster_helpers import LAUNCH_ID_ENV, processes_with_env, rank_summaries, run_gmeta

    data = prepared_kinds["click"]
    yesterday = ten_steps  # an embedded run's checkpoint at step 10 (read only here)
    run, launch_id = tmp_path / "dist", uuid.uuid4().hex
    sets = [*SETS, f"model.max_rows.item_id={MAX_ROWS}", "train.checkpoint_every=15"]
    args = ["--config", "configs/quickstart.yaml", "--data", str(data), "--out", str(run), "--steps", "30",
            "--warm-start", str(yesterday)]
    for s in sets:
        args += ["--set", s]
    r = run_gmeta(["launch", "local", "--workers", "2", "--ps", "2", "--timeout", "500", *args],
                  timeout=600, env={LAUNCH_ID_ENV: launch_id})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert processes_with_env(LAUNCH_ID_ENV, launch_id) == []
    ranks = rank_summaries(run)
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["warm_start"]["checkpoint"].endswith("ckpt-00000010")
    assert sum(summary["table_rows_per_ps"]["item_id"]) <= MAX_ROWS
    old, _ = read_table(str(_ckpt(yesterday, 10)), "item_id")
    for step in (15, 30):
        keys, _ = read_table(str(_ckpt(run, step)), "item_id")
        assert len(keys) <= MAX_ROWS
        slots, _ = read_table(str(_ckpt(run, step)), "item_id.v")
        assert sorted(slots.tolist()) == sorted(keys.tolist())
    assert set(keys.tolist()) != set(old.tolist())  # trained on: rows came and went
