"""``model.hot_sync_every``: the hot tier syncing every k steps (``embedding/hot/stale.py``), in one
process: the config, a window of one step being the every-step update bit for bit, what a sync
computes, and (trainer) a checkpoint between syncs closing the window so a resumed run is the
straight one. The two-worker run is in tests/test_hot_split_distributed.py."""
import json

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_hot_split_resume import _ckpt_tables

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.data.id_profile import write_profile
from gmeta_tf.embedding.hot.rows import HotRows
from gmeta_tf.embedding.hot.select import HotSet
from gmeta_tf.embedding.optimizers import row_update
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.trainer import train


def test_config_key():
    assert load_config(None).model.hot_sync_every == 1
    assert load_config(None, ["model.hot_sync_every=4", "hot.budget=1MiB"]).model.hot_sync_every == 4
    for bad in ("0", "-2", "1.5", "true"):
        with pytest.raises(ConfigError, match="model.hot_sync_every"):
            load_config(None, [f"model.hot_sync_every={bad}", "hot.budget=1MiB"])
    with pytest.raises(ConfigError, match="model.hot_sync_every.*hot.budget is 0"):
        load_config(None, ["model.hot_sync_every=4"])
    with pytest.raises(ConfigError, match="model.hot_sync_every.*model.hot_split is false"):
        load_config(None, ["model.hot_sync_every=4", "hot.budget=1MiB", "model.hot_split=false"])
    # k = 1 goes with any tier setting (it is the default)
    assert load_config(None, ["model.hot_sync_every=1", "model.hot_split=false"]).model.hot_sync_every == 1


TCFG = TrainConfig(optimizer="adam", embedding_optimizer="adam", embedding_learning_rate=0.05)


def _setup(k, n_batches, optimizer="adam", prefetch=True):
    """A model on plain (one-process) tables with every batch's ids present, half of item's ids
    and all of city's hot, and its step; the hot rows loaded."""
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in range(1, n_batches + 1)]
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=False), schema)
    for table, name in zip(model.tables, model.table_names):
        part = "cat" if name in model.cat_names else "multi"
        ids = np.unique(np.concatenate([b[w][part][name].numpy().ravel() for b in batches
                                        for w in ("support", "query")]))
        ids = ids[ids >= 0]
        vals = np.random.default_rng(len(ids)).normal(scale=0.3, size=(len(ids), 4)).astype(np.float32)
        table.variable.upsert(tf.constant(ids), tf.constant(vals))
    tcfg = TrainConfig(optimizer="adam", embedding_optimizer=optimizer, embedding_learning_rate=0.05)
    dense_opt, emb_opt = make_optimizers(tcfg)
    ids = {"item": np.arange(0, 50, 2, dtype=np.int64), "city": np.arange(5, dtype=np.int64),
           "tags": np.zeros(0, np.int64)}
    hs = HotSet(ids, {t: 0 for t in ids}, {t: 1 for t in ids}, 0, 1, local_only={"city": True})
    rows = model.embeddings.use_hot(HotRows(model.tables, hs, LocalSync(), optimizer, tcfg.embedding_learning_rate,
                                            {"item": 100, "city": 100, "tags": 300}, prefetch=prefetch,
                                            sync_every=k))
    step = TrainStep(model, MetaConfig(algo="maml", inner_steps=1, inner_lr=0.3), dense_opt, emb_opt, LocalSync())
    rows.load(emb_opt)
    return batches, rows, step, emb_opt


def _hot_state(rows):
    return {t.name: (t.values.numpy(), {s: v.numpy() for s, v in rows.opt.slots[t.name].items()})
            for t in rows.tables}


@pytest.mark.parametrize("optimizer,prefetch", [("adam", True), ("adagrad", False)])
def test_window_of_one_step_is_the_every_step_update(optimizer, prefetch):
    """k = 1 (the every-step path, as before the key) against k = 3 stepped only at multiples of
    3, i.e. every step closes a window of one step: same losses, rows and slots, bit for bit
    for Adam. Adagrad's ``g / sqrt(acc)`` becomes ``g * rsqrt(acc)`` (Grappler), whose
    vectorised kernel differs from the scalar one by an ulp, and the window lists the touched
    rows sorted where the every-step path lists them by first appearance: so 1e-6 there."""
    out = []
    for k in (1, 3):
        batches, rows, step, _ = _setup(k, 4, optimizer, prefetch)
        assert (rows.window is None) == (k == 1)
        losses = [float(step.step(b, nxt, step=k * (i + 1))["loss"])
                  for i, (b, nxt) in enumerate(zip(batches, batches[1:] + [None]))]
        assert not rows.window_open
        out.append((losses, _hot_state(rows)))
    (l1, s1), (l3, s3) = out
    same = np.testing.assert_array_equal if optimizer == "adam" else (
        lambda a, b, err_msg: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=err_msg))
    if optimizer == "adam":
        assert l1 == l3
    else:
        assert l1 == pytest.approx(l3, rel=1e-6)
    for t in s1:
        same(s1[t][0], s3[t][0], err_msg=t)
        for s in s1[t][1]:
            same(s1[t][1][s], s3[t][1][s], err_msg=f"{t}/{s}")
    # ... and the rows did train (a no-op tier would pass the comparison too)
    _, fresh, _, _ = _setup(1, 1, optimizer, prefetch)
    assert not np.array_equal(s1["item"][0], _hot_state(fresh)["item"][0])


def test_forced_sync_between_syncs_is_one_step_from_the_anchor():
    """k = 4, three local steps, then the sync a checkpoint forces: every touched row is back
    at its last-sync value and slots, moved by one Adam step with the window's summed gradient
    and t = the last step; untouched rows never moved; the window is empty after."""
    batches, rows, step, emb_opt = _setup(4, 4)
    anchor = _hot_state(rows)
    for n, (b, nxt) in enumerate(zip(batches[:3], batches[1:4]), start=1):
        assert np.isfinite(float(step.step(b, nxt, step=n)["loss"]))
        assert rows.window_open
    local = _hot_state(rows)
    w = rows.window
    acc = {t: w.acc[t].numpy() for t in rows.names}
    touched = {t: w.touched[t].numpy() for t in rows.names}
    counters = {t.name: int(emb_opt.for_shadow(t.base.shadow).iterations.numpy()) for t in rows.tables}
    assert set(counters.values()) == {3}
    for t in rows.names:
        assert touched[t].any(), t
        assert t != "item" or not touched[t].all()  # three batches touch some of item's hot rows, not all
        # each rank trained its replica locally: touched rows moved, the others not
        assert not np.array_equal(local[t][0][touched[t]], anchor[t][0][touched[t]]), t
        np.testing.assert_array_equal(local[t][0][~touched[t]], anchor[t][0][~touched[t]])

    assert rows.sync_now(emb_opt) is True
    synced = _hot_state(rows)
    for t in rows.names:
        u = np.flatnonzero(touched[t])
        want_w, want_slots = row_update("adam", rows.lr, tf.constant(anchor[t][0][u]),
                                        {s: tf.constant(v[u]) for s, v in anchor[t][1].items()},
                                        tf.constant(acc[t][u]), counters[t] - 1)
        np.testing.assert_allclose(synced[t][0][u], want_w.numpy(), rtol=1e-6, atol=1e-7, err_msg=t)
        for s in want_slots:
            np.testing.assert_allclose(synced[t][1][s][u], want_slots[s].numpy(), rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(synced[t][0][~touched[t]], anchor[t][0][~touched[t]])
        assert not np.array_equal(synced[t][0][u], local[t][0][u])  # the local steps were undone
        np.testing.assert_array_equal(w.anchor[t].numpy(), synced[t][0])  # the new anchor
        assert not w.acc[t].numpy().any() and not w.touched[t].numpy().any()
    assert not rows.window_open and rows.sync_now(emb_opt) is False  # nothing left to close
    # The step closing the next window (step 4) exchanges only that window's step.
    step.step(batches[3], None, step=4)
    assert not rows.window_open


class _FourRanks(LocalSync):
    size = 4


def test_exchange_is_sized_by_the_rows_a_window_touches(tmp_path):
    """The dense / sparse choice counts the rows a window of k steps is expected to touch: more
    than one step's (a window's steps touch different rare rows), at most k times as many."""
    from gmeta_tf.data.id_profile import TableProfile
    from gmeta_tf.embedding.hot.rows import expected_touched, touched_bounds

    def profile(name, counts):
        counts = np.asarray(counts, np.int64)
        return TableProfile(name=name, method="exact", ids=np.arange(len(counts), dtype=np.int64), counts=counts,
                            lookups=int(counts.sum()), distinct=len(counts), complete=True)

    profiles = {"item": profile("item", [1_000_000] + [1] * 49), "city": profile("city", [10] * 5),
                "tags": profile("tags", [10] * 20)}
    write_profile(tmp_path, profiles, {"sample": 1.0})
    sets = ["hot.budget=1MiB", f"hot.profile={tmp_path / 'id_profile.npz'}", "hot.prefetch=false",
            f"data.path={tmp_path / 'no-data'}"]
    modes = {}
    for k in (1, 8):
        schema = tiny_schema("click")
        model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=False), schema)
        cfg = load_config(None, [*sets, f"model.hot_sync_every={k}"])
        rows = model.embeddings.add_hot_tier(cfg, _FourRanks(), log=lambda m: None)
        assert rows.sync_every == k
        modes[k] = rows.grad_sync.modes
    bounds = touched_bounds(["item", "city"], ["tags"], cfg.data)
    one = expected_touched(cfg, profiles, rows.hot_set.ids, bounds)
    window = expected_touched(cfg, profiles, rows.hot_set.ids, bounds, steps=8)
    assert one["item"] < window["item"] <= 8 * one["item"]
    assert window["city"] == pytest.approx(5, abs=1e-6)  # a window cannot touch more than all rows
    # item: a step touches ~1 of 50 rows (gathered); a window of 8 ~5.7, still fewer bytes gathered
    assert modes[1]["item"] == modes[8]["item"] == "sparse"


def _cfg(data, hot_profile, steps, k):
    return load_config("configs/quickstart.yaml", [
        f"data.path={data}", "data.tasks_per_batch=16", f"train.steps={steps}", "train.log_every=10",
        "train.checkpoint_every=10", "hot.budget=1MiB", f"hot.profile={hot_profile}", f"model.hot_sync_every={k}"])


@pytest.mark.integration  # three trainings (60 steps) to checkpoints
def test_checkpoint_between_syncs_syncs_first_and_resume_is_the_straight_run(prepared_2500, hot_profile, tmp_path):
    """k = 4, checkpoints every 10 steps: 10, 30 fall inside a window (10 % 4 = 2), so each
    forces a sync. A run stopped at 10 and resumed to 30 equals the run straight to 30: the
    accumulators are not checkpointed, which is right only because the checkpoint synced."""
    straight = tmp_path / "straight"
    s = train(_cfg(prepared_2500, hot_profile, 30, 4), straight)
    losses = [h["loss"] for h in s["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0], losses  # it trains
    r = json.loads((straight / "ranks" / "rank0.json").read_text())
    assert r["hot_rows"] > 0 and r["hot_ps_mismatches"] == 0

    resumed = tmp_path / "resumed"
    train(_cfg(prepared_2500, hot_profile, 10, 4), resumed)
    s2 = train(_cfg(prepared_2500, hot_profile, 30, 4), resumed)
    assert s2["start_step"] == 10
    assert [h["loss"] for h in s2["history"]] == pytest.approx(losses, rel=1e-6)
    assert json.loads((resumed / "ranks" / "rank0.json").read_text())["hot_digest"] == r["hot_digest"]
    a, b = _ckpt_tables(straight), _ckpt_tables(resumed)
    assert a.keys() == b.keys() and len(a) > 0
    for name in a:
        assert np.array_equal(a[name][0], b[name][0]), name
        np.testing.assert_allclose(a[name][1], b[name][1], rtol=1e-6, atol=1e-7, err_msg=name)
