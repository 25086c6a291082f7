"""Hot/cold split pieces in one process: the sketch, the selection, the profile file, and a
training step with hot rows against the same step on plain TFRA tables."""
import json

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.data.id_profile import (
    PROFILE_JSON,
    CountMinSketch,
    TableProfile,
    TopKHeap,
    load_profile,
    profile_ids,
    write_profile,
)
from gmeta_tf.embedding.hot.rows import HotRows
from gmeta_tf.embedding.hot.select import HotSet, select_hot
from gmeta_tf.embedding.hot_cold import HotColdTable
from gmeta_tf.embedding.optimizers import row_bytes
from gmeta_tf.errors import DataError
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync


def _zipf_stream(n=60_000, a=1.2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.zipf(a, size=n) * 7919 + 13).astype(np.int64)  # spread ids over a large space


def test_count_min_never_undercounts_and_heap_finds_heavy_hitters():
    stream = _zipf_stream()
    sketch, heap = CountMinSketch(width=1 << 10, depth=4, seed=3), TopKHeap(k=50)
    for chunk in np.array_split(stream, 20):
        u, c = np.unique(chunk, return_counts=True)
        sketch.add(u, c)
        heap.offer(sketch, u)
    ids, true = np.unique(stream, return_counts=True)
    est = sketch.query(ids)
    assert np.all(est >= true)  # count-min never undercounts
    # ... and overcounts by little with this width: e/width of the stream bounds most errors
    assert np.mean(est - true <= np.e / (1 << 10) * stream.size) > 0.95
    # The true top 20 are well separated from the rest in a Zipf stream: all must be in the heap.
    order = np.argsort(-true, kind="stable")
    top_ids, top_est = heap.top(sketch)
    assert set(ids[order[:20]].tolist()) <= set(top_ids.tolist())
    assert np.all(np.diff(top_est) <= 0)  # reported in decreasing estimate


def test_profile_exact_and_sketch_agree_on_top_ids(prepared_2500, tmp_path):
    exact = profile_ids(prepared_2500, exact_max_ids=1 << 20)
    sketched = profile_ids(prepared_2500, exact_max_ids=1000, top_k=2000)
    assert exact["item_id"].method == "exact" and sketched["item_id"].method == "sketch"
    assert exact["device"].method == sketched["device"].method == "exact"  # 10 ids: small table
    for t in exact:
        assert exact[t].lookups == sketched[t].lookups > 0
        assert np.all(np.diff(exact[t].counts) <= 0)
    e, s = exact["item_id"], sketched["item_id"]
    assert set(e.ids[:20].tolist()) == set(s.ids[:20].tolist())
    truth = dict(zip(e.ids.tolist(), e.counts.tolist()))
    assert all(c >= truth[i] for i, c in zip(s.ids[:200].tolist(), s.counts[:200].tolist()))
    # Coverage curve ends at 100% for an exact table that recorded every id.
    assert e.coverage(len(e.ids)) == pytest.approx(1.0)
    # "Complete" (every train id recorded) only for exact counts over the whole split.
    assert e.complete and exact["device"].complete and not s.complete
    assert not any(p.complete for p in profile_ids(prepared_2500, sample=0.5).values())
    dims = {t: 16 for t in exact}
    hs = select_hot(exact, dims, "adam", 10**9)
    assert all(hs.local_only.values())  # everything fits: no table needs the PS in training
    hs = select_hot(exact, dims, "adam", 200_000)
    assert hs.local_only["device"] and not hs.local_only["item_id"]

    write_profile(tmp_path, exact, {"sample": 1.0})
    back = load_profile(tmp_path / "id_profile.npz")
    assert np.array_equal(back["item_id"].ids, e.ids) and back["item_id"].lookups == e.lookups
    summary = json.loads((tmp_path / PROFILE_JSON).read_text())
    assert summary["tables"]["item_id"]["coverage"][str(len(e.ids))] == pytest.approx(1.0)


def test_missing_profile_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="gmeta data profile"):
        load_profile(tmp_path / "id_profile.npz")


def _profiles():
    rng = np.random.default_rng(0)
    out = {}
    for name, n in (("a", 3000), ("b", 40), ("c", 500)):
        counts = np.sort(rng.zipf(1.3, size=n))[::-1].astype(np.int64)
        out[name] = TableProfile(name, "exact", np.arange(n, dtype=np.int64) * 3, counts, int(counts.sum()), n)
    return out


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_selection_respects_budget_with_slots_and_coverage_grows(optimizer):
    profiles, dims = _profiles(), {"a": 16, "b": 16, "c": 8}
    previous = -1.0
    for budget in [0, 500, 4_000, 20_000, 100_000, 10**9]:
        hs = select_hot(profiles, dims, optimizer, budget)
        used = sum(len(hs.ids[t]) * row_bytes(dims[t], optimizer) for t in dims)
        assert used == hs.bytes_used <= budget
        assert hs.total_coverage >= previous
        previous = hs.total_coverage
        for t in dims:  # a prefix of each table's ranking
            assert np.array_equal(hs.ids[t], profiles[t].ids[: len(hs.ids[t])])
    assert previous == pytest.approx(1.0)  # a huge budget takes every profiled row
    assert row_bytes(16, "adam") == 16 * 4 * 3 and row_bytes(16, "adagrad") == 16 * 4 * 2
    assert select_hot(profiles, dims, optimizer, 0).rows == 0


def test_budget_config_parsing():
    assert load_config(None, ["hot.budget=256MiB"]).hot.budget_bytes == 256 * 2**20
    assert load_config(None, ["hot.budget=2KB"]).hot.budget_bytes == 2000
    assert load_config(None).hot.budget_bytes == 0  # off by default
    with pytest.raises(ConfigError, match="hot.budget"):
        load_config(None, ["hot.budget=lots"])
    with pytest.raises(ConfigError, match="hot.min_count"):
        load_config(None, ["hot.min_count=0"])


def _model_with_rows(schema, batches, bp_v2=False, fuse=False):
    # TFRA's per-table path, where cold rows are read ahead (fused: tests/test_fused_tables.py)
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=fuse), schema,
                 bp_v2=bp_v2)
    for table, name in zip(model.tables, model.table_names):
        part = "cat" if name in model.cat_names else "multi"
        ids = np.unique(np.concatenate([b[w][part][name].numpy().ravel() for b in batches for w in ("support", "query")]))
        ids = ids[ids >= 0]
        vals = np.random.default_rng(len(ids)).normal(scale=0.3, size=(len(ids), 4)).astype(np.float32)
        table.variable.upsert(tf.constant(ids), tf.constant(vals))
    return model


def _state(model, emb_opt):
    out = {}
    for t in model.storage_tables():
        slots = {s.name.rsplit("/", 1)[-1]: s for s in t.slot_variables(emb_opt.for_shadow(t.shadow))}
        for key, var in {"value": t.variable, **slots}.items():
            keys, vals = var.export()
            order = np.argsort(keys.numpy())
            out[f"{t.name}/{key}"] = (keys.numpy()[order], vals.numpy()[order])
    out["dense"] = {k: v.numpy() for k, v in model.dense_variables.items()}
    return out


# Each case builds, profiles and traces two models (about 25 s on 2 cores): the integration tier.
@pytest.mark.parametrize("optimizer,adapt,prefetch,bp_v2", [
    pytest.param("adam", "top", True, True, marks=pytest.mark.integration),
    pytest.param("adagrad", "dense+embedding", True, False, marks=pytest.mark.integration),
    pytest.param("adam", "top", False, False, marks=pytest.mark.integration)])
def test_step_with_hot_rows_matches_plain_tables(optimizer, adapt, prefetch, bp_v2):
    """Same rows, same batches: hot rows trained locally end up where the PS path puts them, and
    so do cold rows read one step ahead and written one step behind (prefetch): the patch of
    rows two consecutive batches share makes that exact for one worker. With bp_v2 tables the
    write is a delta, so a second flush must write nothing."""
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in (1, 2, 3)]
    meta = MetaConfig(algo="maml", inner_steps=1, inner_lr=0.3, adapt=adapt)
    tcfg = TrainConfig(optimizer="adam", embedding_optimizer=optimizer, embedding_learning_rate=0.05)
    results = []
    for hot in (False, True):
        model = _model_with_rows(schema, batches, bp_v2=bp_v2)
        dense_opt, emb_opt = make_optimizers(tcfg)
        rows = None
        if hot:  # half of item's ids; every city id (no PS lookups at all); no tag (a plain table)
            ids = {"item": np.arange(0, 50, 2, dtype=np.int64), "city": np.arange(5, dtype=np.int64),
                   "tags": np.zeros(0, np.int64)}
            hs = HotSet(ids, {k: 0 for k in ids}, {k: 1 for k in ids}, 0, 1, local_only={"city": True})
            rows = model.embeddings.use_hot(HotRows(model.tables, hs, LocalSync(), optimizer,
                                                    tcfg.embedding_learning_rate,
                                                    {"item": 100, "city": 100, "tags": 300}, prefetch=prefetch))
            assert [type(t).__name__ for t in model.tables] == ["HotColdTable", "HotColdTable", "EmbeddingTable"]
        step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
        if rows is not None:
            assert [t.local_only for t in rows.tables] == [False, True]
            # city's shadow has no TFRA apply; with prefetch, item's cold rows have none either
            assert len(step.shadows) == (1 if prefetch else 2) and step.prefetching == prefetch
        if rows is not None:
            rows.load(emb_opt)
        losses = [float(step.step(b, nxt)["loss"]) for b, nxt in zip(batches, batches[1:] + [None])]
        if rows is not None and prefetch:  # consecutive batches share cold rows: the patch is exercised
            cold = [set(rows.tables[0].cold_ids([b[w]["cat"]["item"] for w in ("support", "query")]).numpy())
                    for b in batches]
            assert cold[0] & cold[1]
        if rows is not None:
            stale = rows.ps_mismatches()
            rows.write_back(emb_opt)
            assert stale > 0 and rows.ps_mismatches() == 0
            rows.flush()  # nothing pending any more: a no-op (bp_v2: no delta counted twice)
        results.append((losses, _state(model, emb_opt), rows))
    (loss_plain, plain, _), (loss_hot, hot, rows) = results
    hot_ids = {t.name: t.hot_ids for t in rows.tables}
    np.testing.assert_allclose(loss_hot, loss_plain, rtol=1e-5)
    assert plain.keys() == hot.keys()
    for k in plain:
        if k == "dense":
            for name in plain[k]:
                np.testing.assert_allclose(hot[k][name], plain[k][name], atol=1e-5, err_msg=name)
        else:
            # Hot ids never in a batch are written back too (with their initial value).
            extra = hot_ids.get(k.split("/")[0], np.zeros(0, np.int64))
            assert np.array_equal(hot[k][0], np.union1d(plain[k][0], extra)), k
            keep = np.isin(hot[k][0], plain[k][0])
            np.testing.assert_allclose(hot[k][1][keep], plain[k][1], atol=1e-5, err_msg=k)


def test_hot_lookup_equals_plain_lookup_and_pads_are_zero():
    schema = tiny_schema("click")
    batch = random_batch(schema, T=3, seed=5)
    model = _model_with_rows(schema, [batch])
    base = model.tables[0]
    table = HotColdTable(base, np.array([3, 7, 11, 49, 1000], np.int64))  # 1000: hot, never looked up
    table.values.assign(base.variable.lookup(tf.constant(table.hot_ids)))
    ids = [batch["support"]["cat"]["item"], batch["query"]["cat"]["item"]]
    a, b = base.lookup_unique(ids, trainable=False), table.lookup_unique(ids, trainable=False)
    assert np.array_equal(a.index.numpy(), b.index.numpy())
    np.testing.assert_array_equal(a.rows.numpy(), b.rows.numpy())
    flat = tf.concat([tf.reshape(x, [-1]) for x in ids], 0).numpy()
    assert (flat < 0).any()  # the batch has pads, and they map to zero rows
    assert not b.rows.numpy()[b.index.numpy()[flat < 0]].any()


def test_budget_zero_is_the_plain_path(tmp_path):
    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1), schema)
    before = list(model.tables)
    # No profile needed (this one does not exist), nothing wrapped, no hot variables in the step.
    cfg = load_config(None, ["hot.budget=0", f"hot.profile={tmp_path / 'missing.npz'}"])
    assert model.embeddings.add_hot_tier(cfg, LocalSync()) is None
    assert model.tables == before
    dense_opt, emb_opt = make_optimizers(cfg.train)
    step = TrainStep(model, MetaConfig(), dense_opt, emb_opt, LocalSync())
    assert step.hot_vars == [] and step.shadows == model.trainable_shadows()
    with pytest.raises(DataError, match="missing.npz"):
        model.embeddings.add_hot_tier(load_config(None, ["hot.budget=1MiB", f"hot.profile={tmp_path / 'missing.npz'}"]),
                                      LocalSync())


def test_profile_command_writes_files_and_prints_coverage(prepared_2500, tmp_path):
    from cli_helpers import profile_a_copy
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli

    data, r = profile_a_copy(prepared_2500, tmp_path / "prepared", ["--exact-max-ids", "5000", "--set", "hot.budget=1MiB"])
    assert r.exit_code == 0, r.output
    assert "item_id          sketch" in r.output and "device           exact" in r.output
    assert "hot set:" in r.output and "of 1.00 MiB per worker" in r.output
    summary = json.loads((data / PROFILE_JSON).read_text())
    assert summary["tables"]["item_id"]["method"] == "sketch" and summary["exact_max_ids"] == 5000
    assert (data / "id_profile.npz").is_file()
    r = CliRunner().invoke(cli, ["data", "profile", str(data), "--sample", "0"])
    assert r.exit_code == 2 and "--sample" in r.output


def test_prepare_profile_flag_writes_the_profile(synth_dir, tmp_path):
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli

    out = tmp_path / "p"
    r = CliRunner().invoke(cli, ["data", "prepare", "--input", str(synth_dir), "--out", str(out),
                                 "--min-task-size", "30", "--query", "4", "--shards", "2", "--profile"])
    assert r.exit_code == 0, r.output
    profiles = load_profile(out / "id_profile.npz")
    assert set(profiles) == {"item_id", "item_category", "user_city", "user_segment", "device", "hour", "item_tags"}
    assert all(p.lookups > 0 for p in profiles.values())


def test_column_split_tables_stay_wholly_on_the_ps():
    """A table the planner cut into column blocks gets no hot copy (it would need the same cut);
    the other tables still split hot/cold and the step trains."""
    from gmeta_tf.plan.placement_file import ColumnSplit

    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1), schema,
                 placement={"item": ColumnSplit([[0], [0]])})
    ids = {"item": np.arange(0, 50, 2, dtype=np.int64), "city": np.arange(5, dtype=np.int64)}
    hs = HotSet(ids, {k: 0 for k in ids}, {k: 1 for k in ids}, 0, 1)
    rows = model.embeddings.use_hot(HotRows(model.tables, hs, LocalSync(), "adam", 0.05, {"item": 100, "city": 100}))
    assert rows.skipped == ["item"] and rows.names == ["city"]
    # city and tags share the one process and a dim: members of one fused table (fuse_tables: auto)
    assert [type(t).__name__ for t in model.tables] == ["ColumnSplitTable", "HotColdTable", "FusedMember"]
    dense_opt, emb_opt = make_optimizers(TrainConfig())
    step = TrainStep(model, MetaConfig(algo="maml", inner_steps=1, inner_lr=0.3), dense_opt, emb_opt,
                     LocalSync())
    rows.load(emb_opt)
    losses = [float(step.step(random_batch(schema, T=4, seed=s))["loss"]) for s in (1, 2)]
    assert all(np.isfinite(losses))
    assert model.tables[0].parts[0].size() > 0  # the split table trained on its TFRA blocks


def test_prefetch_refuses_a_batch_it_did_not_read_ahead():
    """A step must train the batch the previous step read ahead; any other is refused, not
    trained on another batch's rows."""
    schema = tiny_schema("click")
    b1, b2, b3 = (random_batch(schema, T=4, seed=s) for s in (1, 2, 3))
    model = _model_with_rows(schema, [b1, b2, b3])
    dense_opt, emb_opt = make_optimizers(TrainConfig(embedding_optimizer="adam"))
    ids = {"item": np.arange(0, 50, 2, dtype=np.int64)}
    model.embeddings.use_hot(HotRows(model.tables, HotSet(ids, {"item": 0}, {"item": 1}, 0, 1), LocalSync(),
                                     "adam", 0.05, {"item": 100}))
    step = TrainStep(model, MetaConfig(algo="fomaml"), dense_opt, emb_opt, LocalSync())
    assert step.prefetching
    step.step(b1, b2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="prefetched cold rows belong to another batch"):
        step.step(b3)
    # The refused step wrote nothing half-way: the next call reads its own rows first and trains.
    assert np.isfinite(float(step.step(b3)["loss"]))


def _unseen(batch, name, shift, seed=0):
    """``batch`` with about half of feature ``name``'s real ids moved ``shift`` up (ids no
    training batch holds): the new users of a validation or test split."""
    rng = np.random.default_rng(seed)
    out = {**batch}
    for which in ("support", "query"):
        ids = batch[which]["cat"][name].numpy()
        moved = np.where((ids >= 0) & (rng.random(ids.shape) < 0.5), ids + shift, ids)
        out[which] = {**batch[which], "cat": {**batch[which]["cat"], name: tf.constant(moved)}}
    return out


@pytest.mark.parametrize("adapt,fuse", [("top", False), ("dense+embedding", True)])
def test_local_only_tables_score_unseen_ids_as_the_plain_tables_do(adapt, fuse):
    """A budget holding every train id serves a table without the PS (``local_only``), but
    validation and evaluation users bring ids training never saw. Those must score as the plain
    path scores them (the PS row, or zeros for an id the PS does not hold: read-only lookups
    never draw nor insert), before and after adapting: not fail the validation pass. City id 6
    is not a train id but the PS holds a row for it (a warm start from another run's tables):
    the plain path scores it with that row, so the hot path must ask the PS, not assume zeros.
    Fused (every table one TFRA table), the new ids are read in the fused table's one find."""
    from gmeta_tf.evaluation.evaluate import query_predictions

    schema = tiny_schema("click")
    train = random_batch(schema, T=4, seed=1)
    model = _model_with_rows(schema, [train], fuse=fuse)
    city = model.tables[1]
    assert type(city).__name__ == ("FusedMember" if fuse else "EmbeddingTable")
    city.variable.upsert(tf.constant([6], tf.int64), tf.constant([[0.5, -0.5, 0.25, 1.0]], tf.float32))
    valid = _unseen(_unseen(random_batch(schema, T=4, seed=9), "city", 5), "item", 50)
    cfg = load_config(None, [f"meta.adapt={adapt}", "meta.inner_steps=1", "meta.inner_lr=0.3"])

    def scores():
        fn = tf.function(lambda b: query_predictions(model, cfg, b, steps=1, lr=0.3, adapt_set=adapt),
                         autograph=False)
        return [x.numpy() for x in fn(valid)]

    plain = scores()
    train_ids = {n: np.unique(np.concatenate([train[w]["cat"][n].numpy().ravel() for w in ("support", "query")]))
                 for n in ("item", "city")}
    ids = {n: v[v >= 0] for n, v in train_ids.items()}
    hs = HotSet(ids, {k: 0 for k in ids}, {k: 1 for k in ids}, 0, 1, local_only={"item": True, "city": True})
    rows = model.embeddings.use_hot(HotRows(model.tables, hs, LocalSync(), "adam", 0.05, {"item": 100, "city": 100}))
    _, emb_opt = make_optimizers(TrainConfig(embedding_optimizer="adam"))
    model.embeddings.build_slots(emb_opt)
    rows.load(emb_opt)
    seen = {n: np.concatenate([valid[w]["cat"][n].numpy().ravel() for w in ("support", "query")]) for n in ids}
    for n in ids:  # the batch really holds ids outside the hot set (and 6 among city's)
        assert not np.isin(seen[n][seen[n] >= 0], ids[n]).all(), n
    assert 6 in seen["city"] and 6 not in ids["city"]
    if fuse:  # a read-only lookup sends the new ids of item and city with tags' in one find
        from gmeta_tf.embedding.lookup import feature_ids, together

        ids_now = [x[:2] for x in feature_ids(valid, model.cat_names, model.multi_names)]
        assert sorted(together(model.tables, ids_now, False)) == [0, 1, 2]
    hot = scores()
    for a, b in zip(plain, hot):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    assert [int(t.misses.numpy()) for t in rows.tables] == [0, 0]  # nothing counted as a training miss
    assert city.size() == len(train_ids["city"][train_ids["city"] >= 0]) + 1  # read-only: nothing inserted
