"""The hot tier with ``data.min_id_count``: the hot set is chosen over the ids the reader emits.

Meta-IO reads every id seen fewer than k times in the train split as ``RARE_ID``
(``metaio/rare_ids.py``), while the id profile lists the raw ids. A hot set taken from the raw
profile held rare ids the reader never emits and missed ``RARE_ID``, which it emits often; with a
budget holding every profiled id the table was served without the PS (``local_only``) and the
first step met ``RARE_ID`` outside the hot set (a ``HotSetMissError``).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.id_profile import TableProfile, profile_ids, write_profile
from gmeta_tf.embedding.hot.select import select_hot
from gmeta_tf.metaio import rare_ids

R = fmt.RARE_ID


def _data(root, ids, counts):
    """A prepared-looking dir with just the schema keys ``frequent_ids`` reads: one table 'item'."""
    root.mkdir(parents=True)
    (root / "id_counts").mkdir()
    np.savez(root / "id_counts" / "item.npz", ids=np.asarray(ids, np.int64), counts=np.asarray(counts, np.int64))
    return {"categorical": [{"name": "item"}], "multi_hot": [], "id_counts": {"item": "id_counts/item.npz"}}


def _profile(ids, counts, complete=True):
    order = np.lexsort((np.asarray(ids), -np.asarray(counts)))
    return TableProfile("item", "exact", np.asarray(ids, np.int64)[order], np.asarray(counts, np.int64)[order],
                        int(np.sum(counts)), len(ids), complete=complete)


@pytest.mark.fast
def test_pooled_profile_holds_only_emitted_ids_and_rare_id_with_the_summed_count(tmp_path):
    ids, counts = [10, 11, 12, 13, 14, 15], [9, 5, 2, 1, 1, 1]  # k=2: 13, 14, 15 are rare (3 lookups)
    schema = _data(tmp_path / "d", ids, counts)
    raw = {"item": _profile(ids, counts)}
    got = rare_ids.pooled_profiles(raw, str(tmp_path / "d"), schema, {"item": 2})["item"]
    assert got.ids.tolist() == [10, 11, R, 12] and got.counts.tolist() == [9, 5, 3, 2]
    assert got.lookups == raw["item"].lookups and got.complete  # every train lookup is still counted
    # What the reader emits for each profiled id is the set the pooled profile lists, no more.
    emitted = set(rare_ids.remap(np.asarray(ids, np.int64), rare_ids.frequent_ids(
        str(tmp_path / "d"), schema, {"item": 2})["item"]).tolist())
    assert set(got.ids.tolist()) == emitted
    # Without the key the profile is the raw one.
    assert rare_ids.pooled_profiles(raw, str(tmp_path / "d"), schema, {})["item"] is raw["item"]


@pytest.mark.fast
def test_hot_set_never_holds_an_id_the_reader_cannot_emit(tmp_path):
    ids, counts = [10, 11, 12, 13, 14, 15], [9, 5, 2, 1, 1, 1]
    schema = _data(tmp_path / "d", ids, counts)
    raw = {"item": _profile(ids, counts)}
    pooled = rare_ids.pooled_profiles(raw, str(tmp_path / "d"), schema, {"item": 2})
    for budget in (10**9, 2 * 16 * 4 * 3):  # every row; two rows (dim 16, adam: value + 2 slots)
        hs = select_hot(pooled, {"item": 16}, "adam", budget)
        assert not set(hs.ids["item"].tolist()) & {13, 14, 15}  # rare: the reader never emits them
    everything = select_hot(pooled, {"item": 16}, "adam", 10**9)
    assert R in everything.ids["item"].tolist() and everything.local_only["item"]
    assert everything.coverage("item") == 1.0
    assert select_hot(pooled, {"item": 16}, "adam", 2 * 16 * 4 * 3).ids["item"].tolist() == [10, 11]
    # RARE_ID is a row like any other: below hot.min_count it is not hot, and then the table
    # cannot be served without the PS (the reader emits RARE_ID).
    few = select_hot(pooled, {"item": 16}, "adam", 10**9, min_count=4)
    assert R not in few.ids["item"].tolist() and not few.local_only["item"]
    # No rare id in the train split: RARE_ID is still emitted (an unseen validation id), with no
    # train lookup, so it is never hot and the table keeps its PS path.
    schema = _data(tmp_path / "e", ids, counts)
    none = rare_ids.pooled_profiles(raw, str(tmp_path / "e"), schema, {"item": 1})
    assert none["item"].ids.tolist() == [10, 11, 12, 13, 14, 15, R] and none["item"].counts[-1] == 0
    hs = select_hot(none, {"item": 16}, "adam", 10**9)
    assert R not in hs.ids["item"].tolist() and not hs.local_only["item"]


@pytest.fixture(scope="module")
def rare_data(tmp_path_factory):
    """A small prepared click set (synth 150 users) with its id profile beside the data."""
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    root = tmp_path_factory.mktemp("rarehot")
    synth(str(root / "raw"), tasks=150, seed=3)
    prepare([str(root / "raw")], str(root / "prep"),
            PrepareConfig(query=4, max_support=12, min_task_size=8, valid_frac=0.15, test_frac=0.2, shards=1, seed=1))
    write_profile(root / "prep", profile_ids(root / "prep"), {"sample": 1.0})
    return root / "prep"


def _cfg(data, steps, k=3, select="count", eval_every=0):
    return load_config("configs/quickstart.yaml", [
        f"data.path={data}", "data.tasks_per_batch=8", "data.support=12", "data.query=4",
        f"data.min_id_count.item_id={k}", f"data.min_id_count.item_tags={k}",
        f"train.steps={steps}", "train.log_every=10", "train.checkpoint_every=1000", f"train.eval_every={eval_every}",
        "hot.budget=256MiB", f"hot.select={select}"])


@pytest.mark.integration
def test_choose_hot_set_uses_the_emitted_ids(rare_data):
    from gmeta_tf.embedding.hot.rows import choose_hot_set, hot_profiles

    cfg = _cfg(rare_data, 10)
    schema = json.loads((rare_data / fmt.SCHEMA_FILE).read_text())
    frequent = rare_ids.frequent_ids(str(rare_data), schema, cfg.data.min_id_count)
    profiles = hot_profiles(cfg)
    dims = {t: 16 for t in profiles}
    bounds = {t: 1000 for t in profiles}
    for select in ("count", "bytes"):
        hs = choose_hot_set(_cfg(rare_data, 10, select=select), profiles, dims, bounds, workers=1)
        for t in ("item_id", "item_tags"):
            got = hs.ids[t]
            assert R in got.tolist(), (select, t)  # the synthetic Zipf tail makes RARE_ID frequent
            assert np.isin(got[got != R], frequent[t]).all(), (select, t)


def _unseen_ids(cfg, hot_set) -> dict:
    """Per local-only table, the ids of the valid split outside its hot set (new users' ids)."""
    from gmeta_tf.metaio.reader import make_dataset

    out = {}
    for batch in make_dataset(str(cfg.data.path), "valid", cfg.data, training=False):
        for t in (t for t, only in hot_set.local_only.items() if only):
            for which in ("support", "query"):
                part = batch[which]["cat" if t in batch[which]["cat"] else "multi"][t].numpy().ravel()
                part = part[part >= 0]
                out.setdefault(t, set()).update(part[~np.isin(part, hot_set.ids[t])].tolist())
    return out


@pytest.mark.integration
def test_train_with_hot_split_and_min_id_count_learns_and_validates(rare_data, tmp_path):
    """The budget holds every train id, so tables are served without the PS; validation meets
    new users' ids outside the hot set (user_city: no min_id_count pools them into RARE_ID). It
    used to fail at the first validation (a raw InvalidArgumentError); now each validation scores
    them as ``gmeta eval`` does, on the checkpoint's PS tables with no hot tier: same metrics."""
    from gmeta_tf.embedding.hot.rows import choose_hot_set, hot_profiles, touched_bounds
    from gmeta_tf.evaluation.evaluate import evaluate
    from gmeta_tf.train.trained_run import load_trained
    from gmeta_tf.train.trainer import train

    cfg = _cfg(rare_data, 60, eval_every=30)
    schema = json.loads((rare_data / fmt.SCHEMA_FILE).read_text())
    cat = [c["name"] for c in schema["categorical"]]
    multi = [c["name"] for c in schema["multi_hot"]]
    profiles = hot_profiles(cfg)
    hs = choose_hot_set(cfg, profiles, {t: 16 for t in profiles}, touched_bounds(cat, multi, cfg.data), workers=1)
    unseen = _unseen_ids(cfg, hs)
    assert unseen.get("user_city"), unseen  # what this test is about: local-only, with new ids to score

    s = train(cfg, tmp_path / "run")
    rank0 = json.loads((tmp_path / "run" / "ranks" / "rank0.json").read_text())
    assert rank0["hot_rows"] > 0 and rank0["hot_ps_mismatches"] == 0
    losses = [h["loss"] for h in s["history"]]
    assert losses[-1] < losses[0], losses
    assert [v["step"] for v in s["validation"]] == [30, 60], s["validation"]
    metric, last = s["best"]["metric"], s["validation"][-1]
    run_cfg, model, _ = load_trained(tmp_path / "run", checkpoint="latest")
    assert not any(type(t).__name__ == "HotColdTable" for t in model.tables)  # gmeta eval: no hot tier
    got = evaluate(model, run_cfg, run_cfg.meta.algo, split="valid", with_baselines=False)
    assert got[metric] == pytest.approx(last[metric], abs=1e-5), (got, last)
    # The export's model (static tables from the same checkpoint's files) scores them so too.
    from gmeta_tf.export.checkpoint_reader import pick_checkpoint
    from gmeta_tf.export.frozen_model import FrozenModel

    frozen = FrozenModel(run_cfg, schema, pick_checkpoint(str(tmp_path / "run"), "latest"))
    got = evaluate(frozen, run_cfg, run_cfg.meta.algo, split="valid", with_baselines=False)
    assert got[metric] == pytest.approx(last[metric], abs=1e-5), (got, last)


@pytest.mark.integration
def test_profile_command_prints_the_hot_set_over_emitted_ids(rare_data, tmp_path):
    import re

    from cli_helpers import profile_a_copy

    data, r = profile_a_copy(rare_data, tmp_path / "prep",
                             ["--set", "hot.budget=256MiB", "--set", "data.min_id_count.item_id=3"])
    assert r.exit_code == 0, r.output
    schema = json.loads((data / fmt.SCHEMA_FILE).read_text())
    frequent = rare_ids.frequent_ids(str(data), schema, {"item_id": 3})["item_id"]
    rows = int(re.search(r"item_id\s+([\d,]+) rows", r.output).group(1).replace(",", ""))
    assert rows == frequent.size + 1  # the frequent ids and RARE_ID, every one looked up in training
