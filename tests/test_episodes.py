"""Training episodes re-dealt each epoch (data.episodes: resample): nothing lost, nothing made up."""
import numpy as np

from gmeta_tf.config.schema import DataConfig
from gmeta_tf.data.prepare import prepare
from gmeta_tf.metaio import episodes
from gmeta_tf.metaio.reader import make_dataset


def _samples(rb, t):
    """Task ``t``'s samples as sorted tuples of every per-sample column."""
    cols = [c[len("support."):] for c in rb.schema.names if c.startswith("support.") and c != "support.time"]
    rows = []
    for which in ("support", "query"):
        values = [rb.column(f"{which}.{c}")[t].as_py() for c in cols]
        rows += [tuple(map(repr, r)) for r in zip(*values)]
    return sorted(rows)


def test_resample_keeps_every_sample_and_the_query_size(csv_data, csv_cfg, tmp_path, split_table):
    rows = csv_data.rows(n_users=12, per_user=12)
    prepare([str(csv_data.write(tmp_path / "in.csv", rows))], str(tmp_path / "out"), csv_cfg)
    rb = split_table(tmp_path / "out", "train").to_batches()[0]
    out = episodes.resample(rb, np.random.default_rng(0))
    moved = 0
    for t in range(rb.num_rows):
        assert _samples(out, t) == _samples(rb, t)  # same samples, features still aligned
        assert len(out.column("query.label")[t]) == len(rb.column("query.label")[t])
        moved += out.column("query.cat.item")[t].as_py() != rb.column("query.cat.item")[t].as_py()
    assert moved >= rb.num_rows // 2  # the query really changed for most tasks
    again = episodes.resample(rb, np.random.default_rng(0))
    assert again.equals(out)  # a seed re-deals exactly (resume sees the same data)


def test_only_training_batches_are_re_dealt(csv_data, csv_cfg, tmp_path):
    rows = csv_data.rows(n_users=12, per_user=12)
    prepare([str(csv_data.write(tmp_path / "in.csv", rows))], str(tmp_path / "out"), csv_cfg)
    cfg = DataConfig(tasks_per_batch=2, support=8, query=2, episodes="resample", shuffle_buffer=0)
    fixed = DataConfig(tasks_per_batch=2, support=8, query=2, shuffle_buffer=0)

    def first(c, split, training):
        b = next(iter(make_dataset(str(tmp_path / "out"), split, c, training=training)))
        return b["query"]["cat"]["item"].numpy()

    assert not np.array_equal(first(cfg, "train", True), first(fixed, "train", True))
    np.testing.assert_array_equal(first(cfg, "test", False), first(fixed, "test", False))


def test_drawn_support_sizes_are_uniform_subsets_and_seeded(csv_data, csv_cfg, tmp_path, split_table):
    rows = csv_data.rows(n_users=12, per_user=12)
    prepare([str(csv_data.write(tmp_path / "in.csv", rows))], str(tmp_path / "out"), csv_cfg)
    rb = split_table(tmp_path / "out", "train").to_batches()[0]
    full = episodes.resample(rb, np.random.default_rng(0))
    sizes = []
    for seed in range(20):
        out = episodes.resample(rb, np.random.default_rng(seed), draw_support=4)
        for t in range(rb.num_rows):
            k = len(out.column("support.label")[t])
            sizes.append(k)
            assert k >= 1 and k <= min(4, len(full.column("support.label")[t])), (t, k)  # 1..S, never more than it had
            assert len(out.column("query.label")[t]) == len(rb.column("query.label")[t])
            # what it keeps are the task's own samples, features still aligned
            assert set(_samples(out, t)) <= set(_samples(rb, t))
    assert set(sizes) == {1, 2, 3, 4}  # every size in 1..S is drawn
    assert abs(np.mean(sizes) - 2.5) < 0.3
    again = episodes.resample(rb, np.random.default_rng(3), draw_support=4)
    assert again.equals(episodes.resample(rb, np.random.default_rng(3), draw_support=4))  # resume redraws


def test_support_draw_needs_resampled_episodes():
    import pytest

    from gmeta_tf.config.schema import ConfigError

    with pytest.raises(ConfigError, match="data.support_size_draw"):
        DataConfig(support_size_draw="uniform")
    DataConfig(support_size_draw="uniform", episodes="resample")
