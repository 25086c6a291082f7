"""The hot set chosen by bytes (embedding/hot/by_bytes.py): the per-row rule on hand-computed
cases, the selection it gives on a Zipf profile, and ``model.hot_split: auto`` following it."""
import math

import numpy as np
import pytest
from synthetic_batch import tiny_schema

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, ModelConfig
from gmeta_tf.data.id_profile import TableProfile, write_profile
from gmeta_tf.embedding.hot.auto import allreduce_bytes, hot_touched
from gmeta_tf.embedding.hot.by_bytes import RowRuleError, cold_bytes, dense_bytes, paying_rows, sparse_bytes, table_pay
from gmeta_tf.embedding.hot.select import select_hot
from gmeta_tf.embedding.hot.sync import choose_mode
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync

pytestmark = pytest.mark.fast


def _profile(name, counts):
    counts = np.asarray(counts, np.int64)
    return TableProfile(name=name, method="exact", ids=np.arange(len(counts), dtype=np.int64), counts=counts,
                        lookups=int(counts.sum()), distinct=len(counts), complete=True)


def _p_for(x, n):
    """The per-lookup probability that makes ``n p = x`` expected touches of a row in a step."""
    return np.array([x / n])


def test_a_row_touched_every_step_pays_at_two_workers_by_hand():
    # dim 16, float32: cold = q1·2·(16·4 + 8) = 144 B; sparse = 2·1·qk·(16·4 + 4) = 136 B;
    # dense = 2·2·(1/2)·17·4 = 136 B. Touched surely (n p = 50): q1 = qk = 1.
    p, n = _p_for(50.0, 512), 512
    assert cold_bytes(p, n, 16)[0] == pytest.approx(144.0)
    assert sparse_bytes(p, n, 16, workers=2, every=1)[0] == pytest.approx(136.0)
    assert dense_bytes(16, workers=2, every=1) == pytest.approx(136.0)
    got = table_pay("t", np.array([1000]), 1000, 50.0, 16, workers=2, every=1)
    assert got.rows == 1 and got.saved_bytes == pytest.approx(8.0)
    # the same row at 4 workers: sparse 2·3·68 = 408, dense 2·2·(3/4)·68 = 204, both above 144
    assert table_pay("t", np.array([1000]), 1000, 50.0, 16, workers=4, every=1).rows == 0
    # one worker: nothing crosses a link, the row pays its whole cold cost
    one = table_pay("t", np.array([1000]), 1000, 50.0, 16, workers=1, every=1)
    assert (one.rows, one.mode, one.hot_bytes) == (1, "local", 0.0) and one.saved_bytes == pytest.approx(144.0)


def test_a_rare_row_stays_cold():
    # n p = 0.01: cold = 144·q, sparse at W=4 = 408·qk, qk ≈ k·q: sparse/cold ≈ 2.83 at any k;
    # dense 204/k is far above 144·q ≈ 1.43 B
    for k in (1, 4, 16):
        got = table_pay("t", np.array([1]), 51_200, 512.0, 16, workers=4, every=k)
        assert got.rows == 0, k
    q = -math.expm1(-0.01)
    assert cold_bytes(_p_for(0.01, 512), 512, 16)[0] == pytest.approx(144 * q)


def test_raising_k_turns_a_borderline_row_hot():
    # n p = 1: q1 = 0.632, cold = 91.0 B. W = 4, k = 1: sparse 408·0.632 = 258, dense 204: cold.
    # k = 4: dense 204/4 = 51 < 91: hot (sparse: 2·3·68·0.982/4 = 100 > 91 would not pay).
    n, counts, lookups = 512.0, np.array([1]), 512
    q1 = -math.expm1(-1.0)
    assert cold_bytes(np.array([1 / 512]), n, 16)[0] == pytest.approx(144 * q1)
    assert table_pay("t", counts, lookups, n, 16, workers=4, every=1).rows == 0
    got = table_pay("t", counts, lookups, n, 16, workers=4, every=4)
    assert (got.rows, got.mode) == (1, "dense")
    assert got.hot_bytes == pytest.approx(51.0) and got.cold_bytes == pytest.approx(144 * q1)
    assert sparse_bytes(np.array([1 / 512]), n, 16, 4, 4)[0] == pytest.approx(2 * 3 * 68 * -math.expm1(-4.0) / 4)


def test_bfloat16_moves_the_thresholds_as_the_formula_says():
    # dense at W=2, k=1: hot iff q1·2·(16b + 8) > 2·(16+1)·b: q1 > 136/144 = 0.944 (float32),
    # q1 > 68/80 = 0.85 (bfloat16). A row with q1 = 0.9 flips.
    p, n = _p_for(math.log(10.0), 512), 512  # q1 = 0.9
    assert cold_bytes(p, n, 16, 4)[0] == pytest.approx(129.6) and dense_bytes(16, 2, 1, 4) == pytest.approx(136.0)
    assert cold_bytes(p, n, 16, 2)[0] == pytest.approx(72.0) and dense_bytes(16, 2, 1, 2) == pytest.approx(68.0)
    # sparse at W=3, k=2: hot iff 2·q1/q2 = 2/(1 + e^-x) > 2·(16b + 4)/(16b + 8): x > ln(1/0.0588) = 2.83
    # (float32), x > ln 9 = 2.20 (bfloat16). At x = 2.5 the row is cold in float32, hot in bfloat16.
    p = _p_for(2.5, 512)
    assert cold_bytes(p, n, 16, 4)[0] < sparse_bytes(p, n, 16, 3, 2, 4)[0]
    assert cold_bytes(p, n, 16, 2)[0] > sparse_bytes(p, n, 16, 3, 2, 2)[0]
    for b, x in ((4, math.log(1 / (2 / (2 * 68 / 72) - 1))), (2, math.log(9.0))):  # at the threshold: equal
        assert cold_bytes(_p_for(x, 512), n, 16, b)[0] == pytest.approx(sparse_bytes(_p_for(x, 512), n, 16, 3, 2, b)[0])


def test_the_rule_refuses_what_it_cannot_price():
    with pytest.raises(RowRuleError, match="workers >= 1"):
        table_pay("t", np.array([1]), 1, 1.0, 16, workers=0, every=1)


def _zipf(rows=5000, s=1.2, top=1_000_000):
    return np.maximum(1, (top / np.arange(1, rows + 1) ** s)).astype(np.int64)


def test_zipf_selection_is_a_frequency_prefix_that_shrinks_with_workers():
    prof = {"item": _profile("item", _zipf())}
    dims, n = {"item": 16}, {"item": 512.0}
    kept = {}
    for w in (2, 3, 4, 8):
        pay = paying_rows(prof, dims, n, workers=w, every=4)
        hs = select_hot(prof, dims, "adam", 10**9, cap={t: p.rows for t, p in pay.items()})
        assert hs.rows == pay["item"].rows
        np.testing.assert_array_equal(hs.ids["item"], prof["item"].ids[: hs.rows])  # a prefix by count
        kept[w] = hs.rows
    assert kept[2] > kept[3] > kept[4] > kept[8] > 0, kept
    # at k = 1 only two workers' sparse exchange pays (every row, by the key's width), three or more none
    assert paying_rows(prof, dims, n, workers=2, every=1)["item"].rows == 5000
    assert paying_rows(prof, dims, n, workers=3, every=1)["item"].rows == 0
    # the budget still bounds it: a prefix of the paying prefix
    pay = paying_rows(prof, dims, n, workers=4, every=4)
    small = select_hot(prof, dims, "adam", 10 * 16 * 4 * 3, cap={t: p.rows for t, p in pay.items()})
    assert small.rows == 10 < pay["item"].rows


def test_the_rules_bytes_are_the_verdicts_bytes():
    """Summed over the paying rows, the rule's hot cost is what auto counts for the exchange
    (sent and received), in the mode ``sync.choose_mode`` picks for that set."""
    prof = {"item": _profile("item", _zipf())}
    for w, k, b in ((2, 1, 4), (4, 4, 4), (4, 4, 2), (8, 8, 4)):
        got = paying_rows(prof, {"item": 16}, {"item": 512.0}, workers=w, every=k, value_bytes=b)["item"]
        ids = {"item": prof["item"].ids[: got.rows]}
        touched = hot_touched(prof, ids, {"item": 512.0 * k})
        mode = choose_mode(got.rows, 16, touched["item"], w, b)
        assert mode == got.mode, (w, k, b)
        sent = allreduce_bytes({"item": mode}, {"item": got.rows}, {"item": 16}, touched, w, b) / k
        assert 2 * sent == pytest.approx(got.hot_bytes, rel=1e-9)


def test_hot_select_is_checked_and_auto_follows_hot_split():
    from gmeta_tf.embedding.hot.rows import select_by_bytes

    with pytest.raises(ConfigError, match="hot.select.*'often'"):
        load_config(None, ["hot.select=often"])
    assert not select_by_bytes(load_config(None, []))  # hot_split true: by count, as before
    assert select_by_bytes(load_config(None, ["model.hot_split=auto"]))
    assert not select_by_bytes(load_config(None, ["model.hot_split=auto", "hot.select=count"]))
    assert select_by_bytes(load_config(None, ["hot.select=bytes"]))


class _Ranks(LocalSync):
    def __init__(self, size):
        self.size = size


def test_auto_is_off_when_no_row_pays_and_says_so_in_bytes(tmp_path):
    schema = tiny_schema("click")  # item (50 ids), city (5), tags (20, multi-hot)
    write_profile(tmp_path, {"item": _profile("item", [1000] * 50), "city": _profile("city", [10] * 5),
                             "tags": _profile("tags", [10] * 20)}, {"sample": 1.0})
    base = ["hot.budget=1MiB", f"hot.profile={tmp_path / 'id_profile.npz'}", "hot.prefetch=false",
            "model.hot_split=auto", "cluster.link_rate=10kbit", f"data.path={tmp_path / 'no-data'}"]

    def tier(size, *sets):
        model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=False), schema)
        logs = []
        return model.embeddings.add_hot_tier(load_config(None, [*base, *sets]), _Ranks(size), log=logs.append), logs

    # 4 workers syncing every step: no row saves bytes, whatever the link
    rows, logs = tier(4)
    assert rows is None
    verdict = [line for line in logs if line.startswith("hot split auto:")]
    assert verdict and verdict[0].startswith("hot split auto: off (link 10kbit; no row saves bytes"), logs
    assert "0 rows hot" in verdict[0] and "link bytes per worker step" in verdict[0]
    # the same job with a window of 8 steps: the rows a step touches surely (all of them here) pay
    rows, logs = tier(4, "model.hot_sync_every=8")
    assert rows is not None and rows.hot_set.rows == 75
    verdict = [line for line in logs if line.startswith("hot split auto:")][0]
    assert verdict.startswith("hot split auto: on (link 10kbit;") and "75 rows hot" in verdict
