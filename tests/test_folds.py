"""Cross-validation folds over users (``prepare.folds``): the K preparations partition the users.

``make quality`` prepares folds 0..K-1 of MovieLens and pools the test users of all of them, so
every user must be a test user exactly once, and within a fold no user may be in two splits
(a valid or test user seen in training would not be a cold user).
"""
from __future__ import annotations

import numpy as np
import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.data.split import assign_splits

pytestmark = pytest.mark.fast


def _splits(layout):
    return {name: {int(t) for _, a, b in ranges for t in layout.order[a:b]} for name, ranges in layout.shards.items()}


@pytest.mark.parametrize("n_tasks,folds", [(610, 5), (23, 3), (100, 10)])
def test_folds_partition_the_users(n_tasks, folds):
    codes = np.arange(n_tasks)
    names = np.array([f"user{i}" for i in codes])
    every = set(codes.tolist())
    tested, validated = [], []
    for fold in range(folds):
        layout = assign_splits(codes, names, 0.1, 0.2, 1, seed=0, folds=folds, fold=fold)
        s = _splits(layout)
        assert s["train"].isdisjoint(s["valid"]) and s["train"].isdisjoint(s["test"])
        assert s["valid"].isdisjoint(s["test"])
        assert s["train"] | s["valid"] | s["test"] == every  # nobody dropped
        assert layout.counts == {k: len(v) for k, v in s.items()}
        assert abs(len(s["test"]) - n_tasks / folds) < 1 and len(s["valid"]) == round(0.1 * n_tasks)
        tested.extend(s["test"])
        validated.extend(s["valid"])
    assert sorted(tested) == sorted(every)  # every user is a test user exactly once
    assert len(set(validated)) == len(validated)  # and a valid user in at most one fold


def test_folds_depend_on_the_ids_and_seed_not_the_input_order():
    codes = np.arange(50)
    names = np.array([f"u{i:02d}" for i in codes])
    perm = np.random.default_rng(0).permutation(50)
    a = _splits(assign_splits(codes, names, 0.1, 0.2, 1, seed=0, folds=5, fold=2))
    b = _splits(assign_splits(perm, names, 0.1, 0.2, 1, seed=0, folds=5, fold=2))
    c = _splits(assign_splits(codes, names, 0.1, 0.2, 1, seed=1, folds=5, fold=2))
    assert a == b and a["test"] != c["test"]


def test_fold_keys_are_checked():
    assert load_config(None, ["prepare.folds=5", "prepare.fold=4"]).prepare.fold == 4
    with pytest.raises(ConfigError, match="prepare.fold'"):
        load_config(None, ["prepare.folds=5", "prepare.fold=5"])
    with pytest.raises(ConfigError, match="prepare.folds"):
        load_config(None, ["prepare.folds=1"])
    with pytest.raises(ConfigError, match="prepare.valid_frac"):
        load_config(None, ["prepare.folds=2", "prepare.valid_frac=0.5"])
