"""The task hash of ``prepare --part`` (``data/parts.py``): vectorized, and the same for a task
wherever and however its id arrives.

It is pinned to a plain-Python reference of the documented hash (FNV-1a over the seed's 8
little-endian bytes and the id's UTF-8 bytes, then the first two outputs of splitmix64), so a
change of it (which would reshuffle every data set prepared in parts) fails here.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import parts
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.prepare import prepare

U64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _reference(task_id: str, seed: int):
    h = 0xCBF29CE484222325
    for byte in (seed & U64).to_bytes(8, "little") + task_id.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & U64

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        return z ^ (z >> 31)

    a, b = mix((h + GAMMA) & U64), mix((h + 2 * GAMMA) & U64)
    return (a >> 11) / float(1 << 53), b


IDS = ["", "u", "u1", "user_0000012", "héllo wörld", "日本語のユーザー", "12", "-3", "x" * 300, "a\0b"]


@pytest.mark.parametrize("seed", [0, 5, -1, 2**63 + 17])
def test_hash_is_the_documented_one(seed):
    u, h = parts.task_hashes(IDS, seed)
    assert u.dtype == np.float64 and h.dtype == np.uint64
    for i, task in enumerate(IDS):
        ru, rh = _reference(task, seed)
        assert int(h[i]) == rh, task
        assert u[i] == ru, task


def test_same_ids_same_values_in_any_pieces_order_and_container():
    rng = np.random.default_rng(0)
    ids = [f"user{int(x)}" for x in rng.integers(0, 10**9, 5000)] + IDS
    u, h = parts.task_hashes(pa.array(ids), 7)
    perm = rng.permutation(len(ids))
    cuts = np.sort(rng.choice(np.arange(1, len(ids)), 9, replace=False))
    for piece in np.split(perm, cuts):  # shuffled pieces, as batches and files bring them
        pu, ph = parts.task_hashes(np.array(ids, dtype=object)[piece], 7)
        np.testing.assert_array_equal(ph, h[piece])
        np.testing.assert_array_equal(pu, u[piece])
    # a sliced Arrow array (offset into its buffers), a chunked one, large_string
    arr = pa.array(ids)
    np.testing.assert_array_equal(parts.task_hashes(arr.slice(100, 50), 7)[1], h[100:150])
    chunked = pa.chunked_array([arr.slice(0, 10), arr.slice(10)])
    np.testing.assert_array_equal(parts.task_hashes(chunked, 7)[1], h)
    np.testing.assert_array_equal(parts.task_hashes(arr.cast(pa.large_string()), 7)[1], h)
    assert parts.task_hashes([], 7)[1].size == 0
    # another seed, other values
    assert (parts.task_hashes(arr, 8)[1] != h).mean() > 0.99


def test_integer_ids_hash_as_their_string_forms():
    ints = [0, 7, -3, 2**40, -(2**63), 2**63 - 1, 10**12]
    want = parts.task_hashes([str(i) for i in ints], 3)
    for given in (ints, np.array(ints, np.int64), pa.array(ints, pa.int64()), pa.array(ints[:3], pa.int32())):
        got = parts.task_hashes(given, 3)
        n = len(given)
        np.testing.assert_array_equal(got[1], want[1][:n])
        np.testing.assert_array_equal(got[0], want[0][:n])


def test_values_are_uniform():
    """The finaliser spreads FNV's weak low bits: ids differing in one character fill the
    shards and the split interval evenly."""
    u, h = parts.task_hashes([f"u{i}" for i in range(120_000)], 1)
    counts = np.bincount((h % np.uint64(12)).astype(np.int64), minlength=12)
    assert np.abs(counts / 10_000 - 1).max() < 0.03, counts
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.abs(hist / 12_000 - 1).max() < 0.03, hist
    assert np.unique(h).size == h.size
    # a and b are not the same bits: the split does not decide the shard
    test = u < 0.25
    by_shard = np.bincount((h[test] % np.uint64(4)).astype(np.int64), minlength=4)
    assert np.abs(by_shard / (test.sum() / 4) - 1).max() < 0.05, by_shard


def _log(path: Path, as_str: bool) -> None:
    n, users = 1200, 40
    tasks = [(i * 7919) % users * 1001 - 5000 for i in range(n)]  # negative and positive ids
    pq.write_table(pa.table({
        "u": pa.array([str(t) for t in tasks] if as_str else tasks),
        "y": pa.array([float((i * 13) % 3 == 0) for i in range(n)]),
        "t": pa.array(list(range(n))),
        "item": pa.array([i % 17 for i in range(n)]),
    }), path)


def test_a_log_with_integer_task_ids_is_split_as_its_string_form(tmp_path):
    """prepare names an integer task 12 "12": the integer log and the string log give the same
    tasks in the same shards of the same splits, in every part."""
    _log(tmp_path / "int.parquet", False)
    _log(tmp_path / "str.parquet", True)
    base = dict(task_col="u", label_col="y", label_kind="click", time_col="t", categorical=["item"], query=3,
                max_support=8, min_task_size=5, shards=4, seed=11, valid_frac=0.2, test_frac=0.2)
    tasks = {}
    for kind in ("int", "str"):
        for i in range(2):
            out = tmp_path / f"{kind}{i}"
            prepare([str(tmp_path / f"{kind}.parquet")], str(out), PrepareConfig(part=f"{i}/2", **base))
            schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
            for split in fmt.SPLITS:
                for rel in schema["splits"][split]["files"]:
                    tasks[(kind, rel)] = pq.read_table(out / rel).column(fmt.TASK_ID).to_pylist()
    str_keys = sorted(k[1] for k in tasks if k[0] == "str")
    assert str_keys == sorted(k[1] for k in tasks if k[0] == "int") and len(str_keys) == 12
    for rel in str_keys:
        assert tasks[("int", rel)] == tasks[("str", rel)], rel
    assert sum(len(tasks[("str", rel)]) for rel in str_keys) == 40
    assert "-5000" in {t for rel in str_keys for t in tasks[("str", rel)]}
