"""The out-of-core prepare engine (``prepare.engine=duckdb``) writes what the in-memory one writes.

Every output Parquet column (exactly), every ``.npz`` table and ``schema.json`` (floats to 1e-9
relative: DuckDB sums in another order) are compared between the two engines on synthetic data
(time and random splits, multi-hot, target encoding), on data with bad rows, on CSV whose column
types change after the first block, and on files that mix string and integer ids. Then
``--part I/N``: the parts' shard files add up to the one-machine ``--part 0/1`` output.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.data_cmd import data
from gmeta_tf.config.schema import ConfigError, PrepareConfig
from gmeta_tf.data import ooc, parts
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.ooc_input import open_all
from gmeta_tf.data.prepare import prepare
from gmeta_tf.data.read_input import resolve_inputs, resolve_mapping
from gmeta_tf.data.synth import synth
from gmeta_tf.errors import DataError


def _close(a, b, path="schema"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a} != {b}"
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {a} != {b}"
    else:
        assert a == b and type(a) is type(b), f"{path}: {a!r} != {b!r}"


def _files(root: Path):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def assert_same_output(a: Path, b: Path) -> None:
    """Two prepared directories hold the same files with the same contents."""
    assert _files(a) == _files(b)
    for rel in _files(a):
        if rel.endswith(".parquet"):
            ta, tb = pq.read_table(a / rel), pq.read_table(b / rel)
            assert ta.schema.equals(tb.schema), rel
            assert ta.num_rows == tb.num_rows and ta.num_rows > 0, rel
            for name in ta.column_names:
                assert ta[name].equals(tb[name]), f"{rel}: column {name} differs"
            assert pq.ParquetFile(a / rel).metadata.num_row_groups == pq.ParquetFile(b / rel).metadata.num_row_groups
        elif rel.endswith(".npz"):
            za, zb = np.load(a / rel), np.load(b / rel)
            assert sorted(za.files) == sorted(zb.files), rel
            for k in za.files:
                assert za[k].dtype == zb[k].dtype, (rel, k)
                np.testing.assert_allclose(za[k], zb[k], rtol=1e-12, err_msg=f"{rel}:{k}")
                if za[k].dtype.kind == "i":
                    np.testing.assert_array_equal(za[k], zb[k])
    _close(json.loads((a / fmt.SCHEMA_FILE).read_text()), json.loads((b / fmt.SCHEMA_FILE).read_text()))


def _both(inputs, tmp_path: Path, cfg: PrepareConfig, name: str = "o"):
    mem = tmp_path / f"{name}-memory"
    ooc = tmp_path / f"{name}-duckdb"
    r_mem = prepare([str(i) for i in inputs], str(mem), dataclasses.replace(cfg, engine="memory"))
    r_ooc = prepare([str(i) for i in inputs], str(ooc), dataclasses.replace(cfg, engine="duckdb",
                                                                           memory_limit="256MiB"))
    r_mem.pop("out"), r_ooc.pop("out")
    assert r_mem == r_ooc
    assert_same_output(mem, ooc)
    return mem, ooc, r_ooc


@pytest.fixture(scope="module")
def synth_small(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ooc") / "raw"
    synth(str(out), tasks=150, seed=3, rows_per_file=2500)  # several input files
    return out


@pytest.mark.parametrize("split_by", ["time", "random"])
def test_engines_agree_on_synth_data(synth_small, tmp_path, split_by):
    cfg = PrepareConfig(query=4, max_support=8, min_task_size=30, max_task_size=150, valid_frac=0.15,
                        test_frac=0.25, shards=3, rows_per_group=7, seed=5, split_by=split_by,
                        target_encoding=["item_id"], target_encoding_prior=3.0)
    mem, _, r = _both([synth_small], tmp_path, cfg)
    schema = json.loads((mem / fmt.SCHEMA_FILE).read_text())
    # the comparison covers what it should: multi-hot, hashed ids, target encoding, truncation
    assert schema["multi_hot"] and any(c["hashed"] for c in schema["categorical"])
    assert schema["target_encoding"] and r["samples_truncated"] > 0 and r["dropped"]["too_large"] > 0


def test_the_same_input_gives_the_same_schema_every_run(synth_small, tmp_path):
    """The dense and label moments come from one scan on one thread: a parallel scan added its
    threads' partial sums in the order they finished (last digits differed run to run)."""
    cfg = PrepareConfig(query=4, max_support=8, min_task_size=30, max_task_size=150, shards=3, rows_per_group=7,
                        seed=5)
    got = set()
    for i in range(4):
        prepare([str(synth_small)], str(tmp_path / f"p{i}"), cfg)
        schema = json.loads((tmp_path / f"p{i}" / fmt.SCHEMA_FILE).read_text())
        got.add(json.dumps([schema["dense"], schema["label_stats"]]))
    assert len(got) == 1, got


def test_engines_agree_with_folds_and_no_target_encoding(synth_small, tmp_path):
    cfg = PrepareConfig(query=4, max_support=64, min_task_size=24, shards=2, folds=3, fold=1, valid_frac=0.1)
    _both([synth_small], tmp_path, cfg)


def test_engines_agree_on_bad_rows_skipped(tmp_path, csv_data, csv_cfg):
    rows = csv_data.rows(n_users=16, per_user=14)
    bad = {3: ("y", ""), 15: ("y", "nan"), 20: ("y", "3"), 30: ("item", "-1"), 31: ("item", "-7"),
           40: ("city", ""), 50: ("x1", "nan"), 51: ("x2", ""), 60: ("when", ""), 70: ("tags", "4|-1"),
           90: ("uid", ""), 120: ("tags", "")}
    for r, (c, v) in bad.items():
        rows[r][c] = v
    a = csv_data.write(tmp_path / "a.csv", rows[:100])
    b = csv_data.write(tmp_path / "b.csv", rows[100:])
    cfg = dataclasses.replace(csv_cfg, on_bad_rows="skip", rows_per_group=3)
    _, _, r = _both([a, b], tmp_path, cfg)
    assert sum(r["rows_skipped"].values()) == len(bad) - 1  # an empty multi-hot cell is no bad row
    for split_by in ("random",):
        _both([a, b], tmp_path, dataclasses.replace(cfg, split_by=split_by), name=split_by)


def test_bad_row_is_reported_after_structural_errors_as_in_memory(tmp_path, csv_data, csv_cfg):
    """``on_bad_rows=error``: a bad row early and a non-integer id in a later batch give the same
    error as the in-memory engine (which converts every column before it reports bad rows)."""
    rows = csv_data.rows()
    rows[2]["y"] = ""
    a = csv_data.write(tmp_path / "a.csv", rows[:60])
    rows2 = rows[60:]
    rows2[5]["item"] = "2.5"
    b = csv_data.write(tmp_path / "b.csv", rows2)
    msgs = []
    for engine in ("memory", "duckdb"):
        with pytest.raises(DataError) as e:
            prepare([str(a), str(b)], str(tmp_path / engine), dataclasses.replace(csv_cfg, engine=engine))
        msgs.append(str(e.value))
        assert not (tmp_path / engine).exists() and not list(tmp_path.glob(f"{engine}.tmp-*"))
    assert msgs[0] == msgs[1] and "b.csv: row 5" in msgs[1] and "non-integer" in msgs[1]


def test_every_part_names_every_bad_row_of_the_input(tmp_path, csv_data, csv_cfg):
    """A part drops other parts' rows only after checking them: each part reports the first bad row
    of the whole input (the in-memory engine's message), and counts every skipped row."""
    rows = csv_data.rows(n_users=16, per_user=14)
    bad = {3: ("y", ""), 15: ("y", "nan"), 20: ("y", "3"), 30: ("item", "-1"), 50: ("x1", "nan"),
           90: ("uid", ""), 150: ("when", "")}
    for r, (c, v) in bad.items():
        rows[r][c] = v
    a = csv_data.write(tmp_path / "a.csv", rows[:100])
    b = csv_data.write(tmp_path / "b.csv", rows[100:])
    c = csv_data.write(tmp_path / "c.csv", [dict(r, uid="") for r in rows[:3]])  # a batch without any task
    files = [str(a), str(b), str(c)]
    cfg = dataclasses.replace(csv_cfg, shards=4, valid_frac=0.0, test_frac=0.0)
    with pytest.raises(DataError) as e:
        prepare(files, str(tmp_path / "mem"), dataclasses.replace(cfg, engine="memory"))
    want = str(e.value)
    assert "a.csv: row 3" in want, want
    uid = [r["uid"] for r in rows]
    skip = dataclasses.replace(cfg, on_bad_rows="skip")
    whole = prepare(files, str(tmp_path / "whole"), dataclasses.replace(skip, part="0/1"))
    n_bad = len(bad) + 3
    spooled = 0
    for i in range(4):
        with pytest.raises(DataError) as e:
            prepare(files, str(tmp_path / f"e{i}"), dataclasses.replace(cfg, part=f"{i}/4"))
        assert str(e.value) == want, i
        r = prepare(files, str(tmp_path / f"s{i}"), dataclasses.replace(skip, part=f"{i}/4"))
        assert r["rows_skipped"] == whole["rows_skipped"] and sum(r["rows_skipped"].values()) == n_bad
        assert r["input_rows"] == len(rows) + 3
        spooled += r["part_rows"]
    assert spooled == whole["part_rows"] == len(rows) - len(bad)
    # the bad rows lie in several parts' tasks, so each part named and counted others' rows
    assert len(set(parts.shard_of([uid[r] for r in bad if uid[r]], skip.seed, 4).tolist())) >= 2


def test_csv_types_settled_over_the_whole_file(tmp_path):
    """``read_csv`` infers a column over the whole file; a streamed read sees one block at a time."""
    n = 60_000  # more than one 1 MiB block
    rng = np.random.default_rng(0)
    users = rng.integers(0, 400, n)
    lines = ["u,y,t,item,score,tags"]
    for i in range(n):
        item = str(int(rng.integers(0, 1000))) if i < n - 10 else f"sku{i}"  # strings only at the end
        score = str(int(rng.integers(0, 9))) if i < n - 5 else "0.5"  # floats only at the end
        tags = "|".join(str(int(x)) for x in rng.integers(0, 30, 2)) if i < n - 3 else "a|b"
        lines.append(f"u{users[i]},{int(rng.random() < 0.3)},{i},{item},{score},{tags}")
    src = tmp_path / "big.csv"
    src.write_text("\n".join(lines) + "\n")
    cfg = PrepareConfig(task_col="u", label_col="y", label_kind="click", time_col="t", categorical=["item"],
                        multi_hot=["tags"], dense=["score"], query=4, max_support=16, min_task_size=20,
                        shards=2, rows_per_group=50)
    mem, _, _ = _both([src], tmp_path, cfg)
    schema = json.loads((mem / fmt.SCHEMA_FILE).read_text())
    assert schema["categorical"][0]["hashed"] and schema["multi_hot"][0]["hashed"]


def test_mixed_string_and_integer_id_files(tmp_path):
    def table(offset, as_str):
        n = 300
        ids = [i % 37 for i in range(n)]
        return pa.table({
            "u": pa.array([f"u{(i + offset) % 9}" for i in range(n)]),
            "y": pa.array([float(i % 2) for i in range(n)]),
            "t": pa.array(list(range(offset, offset + n))),
            "item": pa.array([str(x) for x in ids] if as_str else ids),
            "tags": pa.array([[x, x + 1] for x in ids], pa.list_(pa.int64())),
        })
    pq.write_table(table(0, False), tmp_path / "a.parquet")
    pq.write_table(table(1000, True), tmp_path / "b.parquet")
    cfg = PrepareConfig(task_col="u", label_col="y", label_kind="click", time_col="t", categorical=["item"],
                        multi_hot=["tags"], query=3, max_support=200, min_task_size=5, valid_frac=0.2,
                        test_frac=0.2, shards=1)
    mem, _, _ = _both([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path, cfg)
    assert json.loads((mem / fmt.SCHEMA_FILE).read_text())["categorical"][0]["hashed"] is True


# ---------------------------------------------------------------------- --part I/N


def _part_cfg(**kw) -> PrepareConfig:
    return PrepareConfig(query=4, max_support=8, min_task_size=30, max_task_size=150, valid_frac=0.15,
                         test_frac=0.25, shards=3, rows_per_group=7, seed=5, **kw)


@pytest.mark.parametrize("split_by", ["time", "random"])
def test_parts_add_up_to_the_one_machine_output(synth_small, tmp_path, split_by):
    whole = tmp_path / "whole"
    r = prepare([str(synth_small)], str(whole), _part_cfg(part="0/1", split_by=split_by))
    assert r["tasks_kept"] > 0
    seen = {}
    for i in range(3):
        out = tmp_path / f"p{i}"
        prepare([str(synth_small)], str(out), _part_cfg(part=f"{i}/3", split_by=split_by))
        schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
        assert schema["part"]["index"] == i and schema["part"]["count"] == 3
        for split in fmt.SPLITS:
            for rel in schema["splits"][split]["files"]:
                assert rel not in seen
                seen[rel] = out
    whole_schema = json.loads((whole / fmt.SCHEMA_FILE).read_text())
    whole_files = [rel for s in fmt.SPLITS for rel in whole_schema["splits"][s]["files"]]
    assert sorted(seen) == sorted(whole_files) and len(whole_files) == 9
    for rel in whole_files:
        assert pq.read_table(seen[rel] / rel).equals(pq.read_table(whole / rel)), rel
    # the additive statistics add up
    parts = [json.loads((tmp_path / f"p{i}" / fmt.SCHEMA_FILE).read_text())["part"] for i in range(3)]
    for key in ("samples", "train_samples"):
        assert sum(p[key] for p in parts) == whole_schema["part"][key]
    n = [p["train_samples"] for p in parts]
    np.testing.assert_allclose(sum(k * p["label"]["mean"] for k, p in zip(n, parts)) / sum(n),
                               whole_schema["part"]["label"]["mean"])
    for c in whole_schema["categorical"] + whole_schema["multi_hot"]:
        union = np.unique(np.concatenate([np.load(tmp_path / f"p{i}" / "part_ids" / f"{c['name']}.npz")["ids"]
                                          for i in range(3)]))
        assert union.size == c["cardinality"]
        np.testing.assert_array_equal(union, np.load(whole / "part_ids" / f"{c['name']}.npz")["ids"])
        counts = {}
        for i in range(3):
            z = np.load(tmp_path / f"p{i}" / "id_counts" / f"{c['name']}.npz")
            for k, n in zip(z["ids"].tolist(), z["counts"].tolist()):
                counts[k] = counts.get(k, 0) + n
        z = np.load(whole / "id_counts" / f"{c['name']}.npz")
        assert counts == dict(zip(z["ids"].tolist(), z["counts"].tolist()))
    # a task's assignment does not depend on the other tasks: splits stay disjoint by task
    ids = {s: {t for rel in whole_schema["splits"][s]["files"]
               for t in pq.read_table(whole / rel).column(fmt.TASK_ID).to_pylist()} for s in fmt.SPLITS}
    assert all(ids.values()) and sum(len(v) for v in ids.values()) == len(set().union(*ids.values()))
    assert sum(len(v) for v in ids.values()) == r["tasks_kept"]
    # the summaries: the parts' own tasks and rows add up to the whole's, the input counts are the whole's
    summaries = [json.loads((tmp_path / f"p{i}" / fmt.SCHEMA_FILE).read_text())["summary"] for i in range(3)]
    ws = whole_schema["summary"]
    for key in ("tasks_in", "tasks_kept", "samples_truncated", "part_rows"):
        assert sum(p[key] for p in summaries) == ws[key], key
    for reason in ws["dropped"]:
        assert sum(p["dropped"][reason] for p in summaries) == ws["dropped"][reason]
    assert all(p["input_rows"] == ws["input_rows"] and p["rows_skipped"] == ws["rows_skipped"] for p in summaries)
    assert ws["part_rows"] == ws["input_rows"] - sum(ws["rows_skipped"].values())


def _task_rows(raw: Path) -> tuple:
    """The input's task ids (Arrow) and rows per task."""
    col = pa.chunked_array([pq.read_table(f, columns=["user_id"]).column(0).combine_chunks()
                            for f in sorted(raw.glob("*.parquet"))]).combine_chunks()
    vc = pc.value_counts(col)
    return vc.field("values"), vc.field("counts").to_numpy()


def test_a_part_spools_only_its_tasks_rows(synth_small, tmp_path):
    """``--part I/N`` drops other parts' rows as it reads: ``summary.part_rows`` (the rows spooled)
    is exactly the input rows of the part's tasks, about 1/N of the input, and the spool holds them."""
    ids, rows = _task_rows(synth_small)
    shard = parts.shard_of(ids, 5, 3)
    total = int(rows.sum())
    got = []
    for i in range(3):
        r = prepare([str(synth_small)], str(tmp_path / f"p{i}"), _part_cfg(part=f"{i}/3"))
        summary = json.loads((tmp_path / f"p{i}" / fmt.SCHEMA_FILE).read_text())["summary"]
        assert summary["input_rows"] == total and r["input_rows"] == total
        assert summary["part_rows"] == int(rows[shard == i].sum())
        assert summary["tasks_in"] == int((shard == i).sum())
        got.append(summary["part_rows"])
    assert sum(got) == total and max(got) < 0.6 * total, got
    # the read stage itself: the spool holds the part's rows only
    cfg = _part_cfg(part="1/3")
    m = resolve_mapping(cfg, [str(synth_small)])
    res = ooc._read(open_all(resolve_inputs([str(synth_small)]), m), m, cfg, tmp_path / "spool.parquet", False)
    assert res.kept_rows == total and res.part_rows == got[1] == pq.read_metadata(tmp_path / "spool.parquet").num_rows
    assert pc.count_distinct(pq.read_table(tmp_path / "spool.parquet").column("name")).as_py() == int((shard == 1).sum())


def _seed_with_an_empty_shard(raw: Path, shards: int, lo: int, hi: int) -> int:
    """A seed under which some shard gets no kept task (so a part of one shard writes nothing)."""
    ids, rows = _task_rows(raw)
    kept = (rows >= lo) & (rows <= hi)
    for seed in range(5, 200):
        if np.bincount(parts.shard_of(ids.filter(pa.array(kept)), seed, shards), minlength=shards).min() == 0:
            return seed
    raise AssertionError("no seed leaves a shard empty")


def test_parts_with_empty_shards_and_a_part_without_tasks(synth_small, tmp_path):
    cfg = dict(min_task_size=90, max_task_size=1000, shards=12, valid_frac=0.2, test_frac=0.2)
    seed = _seed_with_an_empty_shard(synth_small, 12, 90, 1000)
    whole = tmp_path / "whole"
    prepare([str(synth_small)], str(whole),
            PrepareConfig(query=4, max_support=8, rows_per_group=7, seed=seed, part="0/1", **cfg))
    schema = json.loads((whole / fmt.SCHEMA_FILE).read_text())
    rows = {rel: pq.read_metadata(whole / rel).num_rows for s in fmt.SPLITS for rel in schema["splits"][s]["files"]}
    assert len(rows) == 36 and 0 in rows.values() and sum(rows.values()) == schema["summary"]["tasks_kept"]
    empty_parts = [i for i in range(12)
                   if all(n == 0 for rel, n in rows.items() if rel.split("-")[1] == f"{i:05d}")]
    assert empty_parts, rows
    i = empty_parts[0]
    out = tmp_path / "empty"
    r = prepare([str(synth_small)], str(out),
                PrepareConfig(query=4, max_support=8, rows_per_group=7, seed=seed, part=f"{i}/12", **cfg))
    assert r["tasks_kept"] == 0 and r["samples"] == 0
    for s in fmt.SPLITS:
        for rel in json.loads((out / fmt.SCHEMA_FILE).read_text())["splits"][s]["files"]:
            t = pq.read_table(out / rel)
            assert t.num_rows == 0 and t.schema.equals(pq.read_schema(whole / rel))


def test_a_part_that_reads_no_row_of_its_own(tmp_path):
    """A part none of whose tasks is in the input (two tasks, twelve shards) writes empty shards
    with the data set's columns; the whole input's empty-split check stays with ``--part 0/1``."""
    n = 80
    pq.write_table(pa.table({
        "u": pa.array([f"user{i % 2}" for i in range(n)]),
        "y": pa.array([float(i % 2) for i in range(n)]),
        "t": pa.array(list(range(n))),
        "item": pa.array([i % 7 for i in range(n)]),
        "tags": pa.array([[i % 5, 9] for i in range(n)], pa.list_(pa.int64())),
    }), tmp_path / "a.parquet")
    base = dict(task_col="u", label_col="y", label_kind="click", time_col="t", categorical=["item"],
                multi_hot=["tags"], query=3, max_support=8, min_task_size=5, shards=12, seed=1,
                valid_frac=0.0, test_frac=0.0)
    mine = set(parts.shard_of(["user0", "user1"], 1, 12).tolist())
    i = min(set(range(12)) - mine)
    whole = tmp_path / "whole"
    prepare([str(tmp_path / "a.parquet")], str(whole), PrepareConfig(part="0/1", **base))
    out = tmp_path / "none"
    r = prepare([str(tmp_path / "a.parquet")], str(out), PrepareConfig(part=f"{i}/12", **base))
    assert r["tasks_kept"] == 0 and r["tasks_in"] == 0 and r["part_rows"] == 0 and r["input_rows"] == n
    schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
    rel = schema["splits"]["train"]["files"][0]
    assert pq.read_table(out / rel).num_rows == 0
    assert pq.read_schema(out / rel).equals(pq.read_schema(whole / rel))
    # a part may lack a split; the one-machine run still refuses one
    with pytest.raises(DataError, match="split 'valid' would get no tasks"):
        prepare([str(tmp_path / "a.parquet")], str(tmp_path / "w2"),
                PrepareConfig(part="0/1", **{**base, "valid_frac": 0.2}))
    assert not (tmp_path / "w2").exists()
    prepare([str(tmp_path / "a.parquet")], str(tmp_path / "p2"),
            PrepareConfig(part=f"{i}/12", **{**base, "valid_frac": 0.2}))


def test_part_option_errors(synth_small, tmp_path):
    with pytest.raises(ConfigError, match="prepare.part"):
        _part_cfg(part="3/4")  # N > shards
    with pytest.raises(ConfigError, match="prepare.part"):
        _part_cfg(part="2/2")
    with pytest.raises(DataError, match="prepare.engine=duckdb"):
        prepare([str(synth_small)], str(tmp_path / "m"), _part_cfg(part="0/1", engine="memory"))
    r = CliRunner().invoke(data, ["prepare", "-i", str(synth_small), "--out", str(tmp_path / "c"), "--part", "1/9",
                                  "--shards", "3"])
    assert r.exit_code == 2 and "prepare.part" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(data, ["prepare", "-i", str(synth_small), "--out", str(tmp_path / "c"), "--part", "1/3",
                                  "--shards", "3", "--min-task-size", "30", "--query", "4"])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "c" / fmt.SCHEMA_FILE).read_text())["summary"]
    assert f"this part: {summary['tasks_in']:,} tasks, {summary['part_rows']:,} rows" in r.output
    assert json.loads((tmp_path / "c" / fmt.SCHEMA_FILE).read_text())["part"]["index"] == 1


def test_small_memory_limit_and_a_failure_leaves_nothing(synth_small, tmp_path):
    """A small ``prepare.memory_limit`` is honoured (same output), the work files are gone from a
    finished output, and a run that fails after the spool is written leaves no temp dir behind."""
    cfg = PrepareConfig(query=4, max_support=8, min_task_size=30, max_task_size=150, shards=2, seed=1)
    tight = tmp_path / "tight"
    prepare([str(synth_small)], str(tight), dataclasses.replace(cfg, memory_limit="48MiB"))
    ref = tmp_path / "ref"
    prepare([str(synth_small)], str(ref), dataclasses.replace(cfg, engine="memory"))
    assert_same_output(ref, tight)
    assert not list(tight.rglob("*.raw")) and not (tight / "_prepare_work").exists()
    with pytest.raises(DataError, match="prepare.target_encoding: 'nope'"):
        prepare([str(synth_small)], str(tmp_path / "bad"), dataclasses.replace(cfg, target_encoding=["nope"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref", "tight"]


def test_progress_line_on_a_terminal(synth_small, tmp_path, monkeypatch):
    import io
    import sys

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    prepare([str(synth_small)], str(tmp_path / "o"), PrepareConfig(min_task_size=30, query=4, shards=2),
            progress=True)
    assert "prepare: read" in err.getvalue() and "rows" in err.getvalue()
    err2 = Tty()
    monkeypatch.setattr(sys, "stderr", err2)
    prepare([str(synth_small)], str(tmp_path / "q"), PrepareConfig(min_task_size=30, query=4, shards=2))
    assert err2.getvalue() == ""
