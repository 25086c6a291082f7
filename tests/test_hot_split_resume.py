"""Checkpoints do not depend on the hot set (embedded mode: the same write-back / load code as
with PS tables, in one process): hot rows reach the checkpoint, a restart loads them from the
tables, and a resumed run may use another budget, or none."""
import json

import numpy as np
import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.data.id_profile import load_profile, write_profile
from gmeta_tf.embedding.hot.rows import HotRows, hot_digest
from gmeta_tf.embedding.hot.select import select_hot
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.trained_run import load_trained
from gmeta_tf.train.trainer import train

pytestmark = pytest.mark.integration  # several trainings to checkpoints


def _cfg(data, hot_profile, budget, steps):
    return load_config("configs/quickstart.yaml", [
        f"data.path={data}", "data.tasks_per_batch=16", f"train.steps={steps}", "train.log_every=10",
        "train.checkpoint_every=20", f"hot.budget={budget}", f"hot.profile={hot_profile}"])


def _ckpt_rows(run, table, ids):
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    data = np.load(ckpt / "tables" / f"{table}.npz")
    pos = {int(k): i for i, k in enumerate(data["keys"])}
    return data["values"][[pos[int(i)] for i in ids]]


def test_checkpoint_holds_hot_rows_and_resume_may_change_the_budget(prepared_2500, hot_profile, tmp_path):
    run = tmp_path / "run"
    train(_cfg(prepared_2500, hot_profile, "1MiB", 20), run)
    rank0 = json.loads((run / "ranks" / "rank0.json").read_text())
    assert rank0["hot_rows"] > 0 and rank0["hot_ps_mismatches"] == 0

    cfg = load_config(run / "config.yaml")
    dims = {t: cfg.model.embedding_dim for t in load_profile(hot_profile)}
    hot = select_hot(load_profile(hot_profile), dims, "adam", cfg.hot.budget_bytes)
    rows = {t: (ids, _ckpt_rows(run, t, ids)) for t, ids in hot.ids.items() if len(ids)}
    assert hot_digest(rows) == rank0["hot_digest"]  # the checkpoint holds the workers' hot rows

    # A restart with another (smaller) hot set reads its rows from the restored tables.
    _, model, ckpt = load_trained(run)
    small = select_hot(load_profile(hot_profile), dims, "adam", 64 * 1024)
    assert 0 < small.rows < hot.rows
    rows = HotRows(model.tables, small, LocalSync(), "adam", 0.01, {t: 512 for t in dims})
    rows.load(ckpt.emb_opt)
    for table in rows.tables:
        np.testing.assert_array_equal(table.values.numpy(), _ckpt_rows(run, table.name, table.hot_ids))
        for slot, var in rows.opt.slots[table.name].items():  # with their optimizer state
            ck = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
            data = np.load(ck / "tables" / f"{table.name}.{slot}.npz")
            pos = {int(k): i for i, k in enumerate(data["keys"])}
            np.testing.assert_array_equal(var.numpy(), data["values"][[pos[int(i)] for i in table.hot_ids]])

    # Resume the run with a smaller budget, then with the split off: both continue from the tables.
    s = train(_cfg(prepared_2500, hot_profile, "64KiB", 30), run)
    assert s["start_step"] == 20
    r = json.loads((run / "ranks" / "rank0.json").read_text())
    assert r["hot_rows"] == small.rows and r["hot_ps_mismatches"] == 0
    s = train(_cfg(prepared_2500, hot_profile, 0, 40), run)
    assert s["start_step"] == 30 and "hot_digest" not in json.loads((run / "ranks" / "rank0.json").read_text())


def test_local_only_table_meeting_an_unprofiled_id_is_a_clear_error(prepared_2500, hot_profile, tmp_path):
    from gmeta_tf.errors import DataError

    # A profile that claims to be complete for 'device' but lacks its hottest id (stale data).
    profiles = load_profile(hot_profile)
    dev = profiles["device"]
    assert dev.complete
    dev.ids, dev.counts = dev.ids[1:], dev.counts[1:]
    stale = tmp_path / "stale"
    stale.mkdir()
    write_profile(stale, profiles, {"sample": 1.0})
    with pytest.raises(DataError, match="step 1: hot table device: an id outside the hot set.*gmeta data profile"):
        train(_cfg(prepared_2500, stale / "id_profile.npz", "1MiB", 5), tmp_path / "run")


def _ckpt_tables(run):
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    out = {}
    for f in sorted((ckpt / "tables").glob("*.npz")):
        data = np.load(f)
        order = np.argsort(data["keys"])
        out[f.name] = (data["keys"][order], data["values"][order])
    return out


def test_prefetch_on_or_off_checkpoints_the_same_tables(prepared_2500, hot_profile, tmp_path):
    """The trainer with cold rows read ahead / written behind (one worker) checkpoints what TFRA's
    shadow path does: every rank's pending write lands before the export, and the patch of
    rows two consecutive batches share keeps the training exact."""
    runs = {}
    for prefetch in (True, False):
        run = tmp_path / f"prefetch-{prefetch}"
        cfg = _cfg(prepared_2500, hot_profile, "64KiB", 30)
        cfg.hot.prefetch = prefetch
        runs[prefetch] = (train(cfg, run), _ckpt_tables(run))
    (s_on, on), (s_off, off) = runs[True], runs[False]
    assert [h["loss"] for h in s_on["history"]] == pytest.approx([h["loss"] for h in s_off["history"]], rel=1e-4)
    assert on.keys() == off.keys() and len(on) > 0
    for name in on:
        assert np.array_equal(on[name][0], off[name][0]), name
        np.testing.assert_allclose(on[name][1], off[name][1], atol=1e-5, err_msg=name)
