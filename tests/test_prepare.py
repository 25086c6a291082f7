"""``prepare``: nothing lost or duplicated, values intact, honest splits, clear errors."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.data_cmd import data
from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import prepare as prepare_mod
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.convert import hash_unique
from gmeta_tf.data.prepare import prepare
from gmeta_tf.errors import DataError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, synth_dir):
    cfg = PrepareConfig(query=4, max_support=8, min_task_size=30, max_task_size=150,
                        valid_frac=0.15, test_frac=0.25, shards=3, rows_per_group=7, seed=5)
    out = tmp_path_factory.mktemp("prep") / "prepared"
    summary = prepare([str(synth_dir)], str(out), cfg)
    return out, cfg, summary


def _all_rows(split_table, out):
    return {s: split_table(out, s) for s in fmt.SPLITS}


def _expected_kept(inp, cfg):
    """Reference implementation (slow, obvious): per user, sort by (ts, row), keep the last
    query + max_support rows of users whose size is within [min, max]."""
    users = inp.column("user_id").to_numpy()
    ts = inp.column("ts").to_numpy()
    kept, truncated, too_small, too_large, last_q = set(), 0, 0, 0, {}
    for u in np.unique(users):
        rows = np.flatnonzero(users == u)
        if rows.size < cfg.min_task_size:
            too_small += 1
            continue
        if rows.size > cfg.max_task_size:
            too_large += 1
            continue
        rows = rows[np.lexsort((rows, ts[rows]))]
        keep = rows[-(cfg.query + cfg.max_support):]
        truncated += rows.size - keep.size
        kept.update(keep.tolist())
        last_q[str(u)] = set(rows[-cfg.query:].tolist())
    return kept, truncated, too_small, too_large, last_q


def test_round_trip_keeps_every_sample_exactly_once(prepared, synth_dir, read_table, split_table):
    out, cfg, summary = prepared
    inp = read_table(synth_dir)
    kept, truncated, too_small, too_large, last_q = _expected_kept(inp, cfg)
    tables = _all_rows(split_table, out)
    idx = np.concatenate([np.concatenate(t.column(fmt.SAMPLE_INDEX).to_pylist()) for t in tables.values()])
    assert idx.size == len(set(idx.tolist()))  # no duplicates
    assert set(idx.tolist()) == kept  # nothing lost
    assert summary["samples_truncated"] == truncated > 0
    assert summary["dropped"] == {"too_small": too_small, "too_large": too_large}
    assert too_small > 0 and too_large > 0
    assert summary["input_rows"] == inp.num_rows
    assert summary["tasks_in"] == 200
    assert summary["samples"] == len(kept)
    for t in tables.values():
        for row in t.to_pylist():
            assert row[fmt.N_QUERY] == cfg.query
            assert row[fmt.N_SUPPORT] >= 1 and row[fmt.N_SUPPORT] <= cfg.max_support
            si = row[fmt.SAMPLE_INDEX]
            assert len(si) == row[fmt.N_SUPPORT] + row[fmt.N_QUERY]
            # support and query are disjoint; the query is the task's last Q samples by time
            assert set(si[: row[fmt.N_SUPPORT]]).isdisjoint(si[row[fmt.N_SUPPORT]:])
            assert set(si[row[fmt.N_SUPPORT]:]) == last_q[row[fmt.TASK_ID]]
            assert max(row["support.time"]) <= min(row["query.time"])


def test_values_match_input_rows(prepared, synth_dir, read_table, split_table):
    out, cfg, _ = prepared
    inp = read_table(synth_dir).to_pydict()
    dev_hash = {d: int(fmt.hash_strings([d])[0]) for d in set(inp["device"])}
    checked = 0
    for split in fmt.SPLITS:
        for row in split_table(out, split).slice(0, 4).to_pylist():
            s = row[fmt.N_SUPPORT]
            for which, rows in (("support", row[fmt.SAMPLE_INDEX][:s]), ("query", row[fmt.SAMPLE_INDEX][s:])):
                assert all(str(inp["user_id"][r]) == row[fmt.TASK_ID] for r in rows)
                assert row[f"{which}.label"] == [float(inp["click"][r]) for r in rows]
                assert row[f"{which}.time"] == [inp["ts"][r] for r in rows]
                assert row[f"{which}.cat.item_id"] == [inp["item_id"][r] for r in rows]
                assert row[f"{which}.cat.hour"] == [inp["hour"][r] for r in rows]
                assert row[f"{which}.cat.device"] == [dev_hash[inp["device"][r]] for r in rows]
                assert row[f"{which}.multi.item_tags"] == [inp["item_tags"][r] for r in rows]
                want = np.array([[inp[c][r] for c in ("price", "item_age_days", "user_activity")] for r in rows],
                                dtype=np.float32)
                np.testing.assert_array_equal(np.array(row[f"{which}.dense"], dtype=np.float32), want)
                checked += len(rows)
    assert checked > 100


def test_output_schema_and_types(prepared):
    out, _, _ = prepared
    t = pq.read_table(out / "train" / fmt.part_name(0, 3))
    sch = t.schema
    assert sch.field(fmt.TASK_ID).type == pa.string()
    assert sch.field(fmt.N_SUPPORT).type == pa.int32()
    assert sch.field("support.label").type == pa.list_(pa.float32())
    assert sch.field("query.dense").type == pa.list_(pa.list_(pa.float32()))
    assert sch.field("support.cat.device").type == pa.list_(pa.int64())
    assert sch.field("query.multi.item_tags").type == pa.list_(pa.list_(pa.int64()))
    assert sch.field(fmt.SAMPLE_INDEX).type == pa.list_(pa.int64())
    assert sch.field("support.time").type == pa.list_(pa.int64())
    assert all(len(d) == 3 for d in t.column("support.dense").to_pylist()[0])
    md = pq.ParquetFile(out / "train" / fmt.part_name(0, 3)).metadata
    assert md.num_row_groups >= 2
    assert all(md.row_group(i).num_rows <= 7 for i in range(md.num_row_groups))


def test_splits_are_disjoint_by_task_and_shards_cover_them(prepared, split_table):
    out, _, summary = prepared
    schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
    ids = {s: split_table(out, s).column(fmt.TASK_ID).to_pylist() for s in fmt.SPLITS}
    assert set(ids["test"]).isdisjoint(ids["train"]) and set(ids["test"]).isdisjoint(ids["valid"])
    assert set(ids["valid"]).isdisjoint(ids["train"])
    k = summary["tasks_kept"]
    assert len(ids["test"]) == round(k * 0.25) and len(ids["valid"]) == round(k * 0.15)
    for split in fmt.SPLITS:
        info = schema["splits"][split]
        assert info["files"] == [f"{split}/{fmt.part_name(i, 3)}" for i in range(3)]
        per_shard = [pq.read_table(out / f).column(fmt.TASK_ID).to_pylist() for f in info["files"]]
        assert all(len(p) > 0 for p in per_shard)
        assert sum(map(len, per_shard)) == len(set().union(*per_shard)) == info["tasks"] == len(ids[split])
        assert info["samples"] == summary["splits"][split]["samples"]
        # Two ranks read disjoint shards that together cover the split.
        r0 = fmt.shard_files(info["files"], 0, 2)
        r1 = fmt.shard_files(info["files"], 1, 2)
        assert set(r0).isdisjoint(r1) and set(r0) | set(r1) == set(info["files"])


def test_schema_statistics(prepared, split_table):
    out, cfg, summary = prepared
    schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
    assert schema["format_version"] == fmt.FORMAT_VERSION
    assert schema["task_col"] == "user_id" and schema["time_col"] == "ts"
    assert schema["label"] == {"name": "click", "kind": "click"}
    assert schema["support_query"] == {"query": 4, "max_support": 8, "split_by": "time"}
    assert schema["summary"]["tasks_kept"] == summary["tasks_kept"]
    tables = [split_table(out, s) for s in fmt.SPLITS]

    def values(col):
        return np.concatenate([np.concatenate(t.column(f"{w}.{col}").to_pylist()) for t in tables
                               for w in fmt.SETS])

    cats = {c["name"]: c for c in schema["categorical"]}
    for name in ("item_id", "item_category", "hour", "device"):
        assert cats[name]["cardinality"] == np.unique(values(f"cat.{name}")).size
        assert cats[name]["pooling"] == 1.0
    assert cats["device"]["hashed"] is True and cats["item_id"]["hashed"] is False
    assert cats["hour"]["cardinality"] == 24 and cats["device"]["cardinality"] == 10
    (tags,) = schema["multi_hot"]
    lists = [x for t in tables for w in fmt.SETS for task in t.column(f"{w}.multi.item_tags").to_pylist() for x in task]
    assert tags["cardinality"] == len({i for x in lists for i in x})
    assert tags["pooling"] == pytest.approx(np.mean([len(x) for x in lists]))
    assert tags["max_len"] == max(map(len, lists))
    train = split_table(out, "train")
    dense = np.array([d for w in fmt.SETS for task in train.column(f"{w}.dense").to_pylist() for d in task])
    assert [d["name"] for d in schema["dense"]] == ["price", "item_age_days", "user_activity"]
    np.testing.assert_allclose([d["mean"] for d in schema["dense"]], dense.mean(0), rtol=1e-5)
    np.testing.assert_allclose([d["std"] for d in schema["dense"]], dense.std(0), rtol=1e-4)
    labels = np.concatenate([np.concatenate(train.column(f"{w}.label").to_pylist()) for w in fmt.SETS])
    assert schema["label_stats"]["mean"] == pytest.approx(labels.mean())


def test_random_split_is_seeded_and_disjoint(synth_dir, tmp_path, split_table, small_cfg):
    cfg = dataclasses.replace(small_cfg, split_by="random", time_col=None)
    a = prepare([str(synth_dir)], str(tmp_path / "a"), cfg)
    prepare([str(synth_dir)], str(tmp_path / "b"), cfg)
    c = prepare([str(synth_dir)], str(tmp_path / "c"), dataclasses.replace(cfg, seed=6))
    ta, tb = split_table(tmp_path / "a", "train"), split_table(tmp_path / "b", "train")
    assert ta.equals(tb)
    assert not split_table(tmp_path / "c", "train").column(fmt.TASK_ID).equals(ta.column(fmt.TASK_ID))
    assert a["samples_truncated"] == c["samples_truncated"] > 0
    for row in ta.to_pylist():
        s = row[fmt.N_SUPPORT]
        assert row[fmt.N_QUERY] == 4 and set(row[fmt.SAMPLE_INDEX][:s]).isdisjoint(row[fmt.SAMPLE_INDEX][s:])


def test_string_hashing_is_stable():
    import hashlib

    want = int.from_bytes(hashlib.blake2b(b"dev_3", digest_size=8).digest(), "little") & (2**63 - 1)
    ids, nulls = hash_unique(pa.array(["dev_3", None, "dev_3", "x"]))
    assert ids[0] == ids[2] == want == fmt.hash_strings(["dev_3"])[0]
    assert ids[3] == fmt.hash_strings(["x"])[0]
    assert nulls.tolist() == [False, True, False, False]


# ------------------------------------------------------------------------ CSV input


def test_csv_with_explicit_mapping(tmp_path, csv_data, csv_cfg, split_table, hash_of):
    rows = csv_data.rows()
    src = csv_data.write(tmp_path / "events.csv", rows)
    out = tmp_path / "out"
    s = prepare([str(src)], str(out), csv_cfg)
    assert s["tasks_kept"] == 12 and s["splits"]["test"]["tasks"] == 3 and s["samples"] == 12 * 10
    schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
    cats = {c["name"]: c for c in schema["categorical"]}
    assert cats["city"]["hashed"] and cats["city"]["cardinality"] == 5
    assert not cats["item"]["hashed"]
    assert schema["multi_hot"][0]["hashed"] is False
    for split in fmt.SPLITS:
        for task in split_table(out, split).to_pylist():
            n = task[fmt.N_SUPPORT]
            idx = task[fmt.SAMPLE_INDEX]
            for which, rr in (("support", idx[:n]), ("query", idx[n:])):
                assert [rows[r]["uid"] for r in rr] == [task[fmt.TASK_ID]] * len(rr)
                assert task[f"{which}.label"] == [float(rows[r]["y"]) for r in rr]
                assert task[f"{which}.cat.city"] == [hash_of(rows[r]["city"]) for r in rr]
                assert task[f"{which}.cat.item"] == [int(rows[r]["item"]) for r in rr]
                assert task[f"{which}.multi.tags"] == [[int(x) for x in rows[r]["tags"].split("|")] for r in rr]
                np.testing.assert_allclose([d[0] for d in task[f"{which}.dense"]],
                                           [float(rows[r]["x1"]) for r in rr], rtol=1e-6)
            times = [int(rows[r]["when"]) for r in idx]
            assert times == sorted(times)  # support then query, each in time order
            all_times = sorted(int(r["when"]) for r in rows if r["uid"] == task[fmt.TASK_ID])
            assert times[n:] == all_times[-2:]


def test_cli_prepare_with_mapping_config_and_overrides(tmp_path, csv_data):
    src = csv_data.write(tmp_path / "events.csv", csv_data.rows())
    conf = tmp_path / "c.yaml"
    conf.write_text("prepare:\n  query: 3\n  shards: 2\n  min_task_size: 5\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(data, [
        "prepare", "--input", str(src), "--out", str(out), "--config", str(conf),
        "--task-col", "uid", "--label-col", "y", "--label-kind", "click", "--time-col", "when",
        "--categorical", "city, item", "--multi-hot", "tags", "--dense", "x1,x2",
        "--query", "2", "--valid-frac", "0.25", "--test-frac", "0.25", "--set", "prepare.seed=3",
    ])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("prepared 12 tasks (train 6 / valid 3 / test 3), 144 samples from 144 input rows")
    assert "too_small=0" in r.output and "nan_label=0" in r.output
    schema = json.loads((out / fmt.SCHEMA_FILE).read_text())
    assert schema["support_query"]["query"] == 2  # the flag beats the config file
    assert len(schema["splits"]["train"]["files"]) == 2  # the config file beats the default
    assert [c["name"] for c in schema["categorical"]] == ["city", "item"]


# ---------------------------------------------------------------------- bad input


def _bad(tmp_path, csv_data, csv_cfg, mutate, **cfg_changes):
    rows = csv_data.rows()
    mutate(rows)
    src = csv_data.write(tmp_path / "bad.csv", rows)
    out = tmp_path / "out"
    with pytest.raises(DataError) as e:
        prepare([str(src)], str(out), dataclasses.replace(csv_cfg, **cfg_changes))
    assert not out.exists() and not list(tmp_path.glob("out.tmp-*"))
    return str(e.value), src


def _set(row, col, value):
    def f(rows):
        rows[row][col] = value
    return f


@pytest.mark.parametrize(
    "row,col,value,words",
    [
        (7, "y", "", ["row 7", "'y'", "NaN/null"]),
        (7, "y", "nan", ["row 7", "'y'", "NaN/null"]),
        (9, "y", "2", ["row 9", "'y'", "not 0 or 1", "2.0"]),
        (5, "item", "-3", ["row 5", "'item'", "negative", "-3"]),
        (6, "city", "", ["row 6", "'city'", "null"]),
        (4, "x1", "nan", ["row 4", "'x1'", "NaN"]),
        (3, "tags", "1|-2", ["row 3", "'tags'", "negative"]),
        (8, "when", "", ["row 8", "'when'", "time is null"]),
        (2, "uid", "", ["row 2", "'uid'", "task id is null"]),
    ],
)
def test_bad_rows_raise_with_file_row_and_column(tmp_path, csv_data, csv_cfg, row, col, value, words):
    msg, src = _bad(tmp_path, csv_data, csv_cfg, _set(row, col, value))
    assert str(src) in msg
    assert f"(line {row + 2})" in msg
    for w in words:
        assert w in msg, msg
    assert "--on-bad-rows skip" in msg


@pytest.mark.parametrize(
    "mutate,words",
    [
        (lambda rows: [r.update(y="yes") for r in rows], ["'y'", "type string", "expected a number"]),
        (lambda rows: [r.update(x2=f"v{i}") for i, r in enumerate(rows)], ["'x2'", "dense", "expected a number"]),
        (lambda rows: rows[10].update(item="2.5"), ["row 10", "'item'", "non-integer", "2.5"]),
    ],
)
def test_wrong_types_are_errors_even_with_skip(tmp_path, csv_data, csv_cfg, mutate, words):
    for policy in ("error", "skip"):
        msg, src = _bad(tmp_path, csv_data, csv_cfg, mutate, on_bad_rows=policy)
        assert str(src) in msg
        for w in words:
            assert w in msg, msg


def test_missing_column(tmp_path, csv_data, csv_cfg):
    msg, src = _bad(tmp_path, csv_data, csv_cfg, lambda rows: None, dense=["x1", "price"])
    assert str(src) in msg and "missing column(s) 'price'" in msg and "uid" in msg


def test_empty_unreadable_and_absent_inputs(tmp_path, csv_cfg, csv_data):
    header_only = tmp_path / "h.csv"
    header_only.write_text(",".join(csv_data.header) + "\n")
    zero = tmp_path / "zero.csv"
    zero.write_text("")
    garbage = tmp_path / "g.parquet"
    garbage.write_bytes(b"this is not parquet at all")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    cases = [
        (header_only, "has no rows"),
        (zero, "cannot read"),
        (garbage, "cannot read"),
        (tmp_path / "nope.csv", "does not exist"),
        (empty_dir, "no .parquet or .csv files"),
    ]
    for path, words in cases:
        with pytest.raises(DataError) as e:
            prepare([str(path)], str(tmp_path / "out"), csv_cfg)
        assert str(path) in str(e.value) and words in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


def test_mapping_problems(tmp_path, csv_data, csv_cfg):
    src = csv_data.write(tmp_path / "e.csv", csv_data.rows())
    cases = [
        (dict(task_col=None), "no task col given: pass --task-col (no columns.json"),
        (dict(label_kind=None), "--label-kind"),
        (dict(categorical=["city", "x1"]), "'x1' is listed as both categorical and dense"),
        (dict(time_col=None), "split_by=time needs a time column"),
        (dict(dense=["y"]), "label column 'y' cannot also be a feature"),
    ]
    for change, words in cases:
        with pytest.raises(DataError, match=None) as e:
            prepare([str(src)], str(tmp_path / "out"), dataclasses.replace(csv_cfg, **change))
        assert words in str(e.value), str(e.value)


def test_split_and_shard_count_errors(tmp_path, csv_data, csv_cfg):
    msg, _ = _bad(tmp_path, csv_data, csv_cfg, lambda rows: None, shards=4)
    assert "split 'valid' has 3 task(s), fewer than --shards 4" in msg
    msg, _ = _bad(tmp_path, csv_data, csv_cfg, lambda rows: None, valid_frac=0.01)
    assert "split 'valid' would get no tasks" in msg
    msg, _ = _bad(tmp_path, csv_data, csv_cfg, lambda rows: None, min_task_size=13)
    assert "no tasks left after filtering (too_small=12, too_large=0)" in msg


def test_skip_policy_counts_rows_per_reason(tmp_path, csv_data, csv_cfg, split_table):
    rows = csv_data.rows()
    bad = {3: ("y", ""), 15: ("y", "nan"), 20: ("y", "3"), 30: ("item", "-1"), 31: ("item", "-7"),
           40: ("city", ""), 50: ("x1", "nan"), 51: ("x2", ""), 60: ("when", ""), 70: ("tags", "4|-1")}
    for r, (c, v) in bad.items():
        rows[r][c] = v
    rows[80]["y"] = ""
    rows[80]["x1"] = "nan"  # two problems, counted once (under the first reason)
    src = csv_data.write(tmp_path / "bad.csv", rows)
    s = prepare([str(src)], str(tmp_path / "out"), dataclasses.replace(csv_cfg, on_bad_rows="skip"))
    assert s["rows_skipped"] == {"null_task": 0, "nan_label": 3, "bad_label": 1, "null_id": 1,
                                 "negative_id": 3, "nan_dense": 2, "null_time": 1}
    schema = json.loads((tmp_path / "out" / fmt.SCHEMA_FILE).read_text())
    assert schema["summary"]["rows_skipped"] == s["rows_skipped"]
    idx = {i for sp in fmt.SPLITS for t in split_table(tmp_path / "out", sp).column(fmt.SAMPLE_INDEX).to_pylist()
           for i in t}
    dropped = set(bad) | {80}
    assert idx.isdisjoint(dropped)
    assert s["input_rows"] == len(rows)
    assert s["samples"] + s["samples_truncated"] == len(rows) - len(dropped)


def test_parquet_negative_id_and_float_ids(tmp_path):
    n = 40
    t = pa.table({
        "task": pa.array([i % 2 for i in range(n)]),
        "label": pa.array([1.0, 0.0] * (n // 2)),
        "cat": pa.array([float(i) for i in range(n)]),  # integral floats are fine
        "t": pa.array(list(range(n))),
    })
    f = tmp_path / "a.parquet"
    pq.write_table(t, f)
    cfg = PrepareConfig(task_col="task", label_col="label", label_kind="click", categorical=["cat"], time_col="t",
                        query=2, min_task_size=3, valid_frac=0.0, test_frac=0.0, shards=1)
    s = prepare([str(f)], str(tmp_path / "ok"), cfg)
    assert s["splits"]["train"]["tasks"] == 2 and s["splits"]["valid"] == {"tasks": 0, "samples": 0}
    t2 = t.set_column(2, "cat", pa.array([i if i != 33 else -4 for i in range(n)]))
    pq.write_table(t2, f)
    with pytest.raises(DataError, match=r"a.parquet: row 33: categorical column 'cat': id is negative"):
        prepare([str(f)], str(tmp_path / "bad"), cfg)


def test_global_row_numbers_across_files(tmp_path, csv_data, csv_cfg, split_table):
    rows = csv_data.rows()
    a = csv_data.write(tmp_path / "a.csv", rows[:50])
    b = csv_data.write(tmp_path / "b.csv", rows[50:])
    s = prepare([str(a), str(b)], str(tmp_path / "out"), csv_cfg)
    assert s["input_rows"] == len(rows)
    for sp in fmt.SPLITS:
        for task in split_table(tmp_path / "out", sp).to_pylist():
            assert [rows[i]["uid"] for i in task[fmt.SAMPLE_INDEX]] == [task[fmt.TASK_ID]] * len(task[fmt.SAMPLE_INDEX])
    rows[60]["y"] = ""
    b = csv_data.write(tmp_path / "b.csv", rows[50:])
    with pytest.raises(DataError, match=r"b.csv: row 10 \(line 12\)"):
        prepare([str(a), str(b)], str(tmp_path / "out2"), csv_cfg)


# ---------------------------------------------------------------------- CLI & atomicity


def test_cli_errors_are_one_line(tmp_path, csv_data):
    rows = csv_data.rows()
    rows[7]["y"] = ""
    src = csv_data.write(tmp_path / "bad.csv", rows)
    args = ["prepare", "-i", str(src), "--out", str(tmp_path / "out"), "--task-col", "uid", "--label-col", "y",
            "--label-kind", "click", "--time-col", "when", "--min-task-size", "3", "--query", "2",
            "--shards", "1"]
    r = CliRunner().invoke(data, args)
    assert r.exit_code == 2
    assert r.output.startswith("error: ") and r.output.count("\n") == 1
    assert "bad.csv: row 7" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp-*"))
    r = CliRunner().invoke(data, args + ["--on-bad-rows", "skip"])
    assert r.exit_code == 0 and "nan_label=1" in r.output
    r = CliRunner().invoke(data, args[:-2] + ["--shards", "0"])  # config validation, same format
    assert r.exit_code == 2 and r.output.startswith("error: config key 'prepare.shards'")
    r = CliRunner().invoke(data, args)  # OUT now exists
    assert r.exit_code == 2 and "already exists" in r.output


def test_synth_output_prepares_without_mapping_via_cli(synth_dir, tmp_path):
    r = CliRunner().invoke(data, ["prepare", "--input", str(synth_dir), "--out", str(tmp_path / "p"),
                                  "--min-task-size", "30", "--query", "4", "--shards", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p" / fmt.SCHEMA_FILE).read_text())["label"]["name"] == "click"


def test_failed_prepare_leaves_nothing_and_keeps_existing_out(tmp_path, csv_data, csv_cfg, monkeypatch):
    src = csv_data.write(tmp_path / "e.csv", csv_data.rows())
    out = tmp_path / "out"

    def boom(*a, **k):
        raise DataError("disk full (simulated)")

    monkeypatch.setattr(prepare_mod, "_write_schema", boom)
    with pytest.raises(DataError, match="simulated"):
        prepare([str(src)], str(out), csv_cfg)
    assert not out.exists() and not list(tmp_path.glob("out.*"))

    out.mkdir()
    (out / "marker").write_text("old")
    with pytest.raises(DataError, match="already exists"):
        prepare([str(src)], str(out), csv_cfg)
    with pytest.raises(DataError, match="simulated"):
        prepare([str(src)], str(out), csv_cfg, overwrite=True)
    assert (out / "marker").read_text() == "old" and sorted(p.name for p in out.iterdir()) == ["marker"]
    assert not list(tmp_path.glob("out.*"))

    monkeypatch.undo()
    prepare([str(src)], str(out), csv_cfg, overwrite=True)
    assert not (out / "marker").exists() and (out / fmt.SCHEMA_FILE).is_file()
    assert not list(tmp_path.glob("out.*"))


def test_input_inside_output_is_refused(tmp_path, csv_data, csv_cfg):
    out = tmp_path / "out"
    out.mkdir()
    src = csv_data.write(out / "e.csv", csv_data.rows())
    with pytest.raises(DataError, match="inside the output directory"):
        prepare([str(src)], str(out), csv_cfg, overwrite=True)
    assert src.exists()


def test_dense_free_and_hashed_multi_hot(tmp_path):
    t = pa.table({
        "u": pa.array(["a"] * 10 + ["b"] * 10 + ["c"] * 10),
        "r": pa.array([float(i % 5 + 1) for i in range(30)]),
        "tags": pa.array([["x", "y"] if i % 2 else ["z"] for i in range(30)], pa.list_(pa.string())),
    })
    f = tmp_path / "r.parquet"
    pq.write_table(t, f)
    cfg = PrepareConfig(task_col="u", label_col="r", label_kind="rating", multi_hot=["tags"], split_by="random",
                        query=2, min_task_size=3, valid_frac=0.0, test_frac=0.34, shards=1)
    s = prepare([str(f)], str(tmp_path / "o"), cfg)
    assert s["splits"]["train"]["tasks"] == 2 and s["splits"]["test"]["tasks"] == 1
    schema = json.loads((tmp_path / "o" / fmt.SCHEMA_FILE).read_text())
    assert schema["multi_hot"][0]["hashed"] is True and schema["multi_hot"][0]["cardinality"] == 3
    assert schema["dense"] == [] and schema["time_col"] is None
    row = pq.read_table(tmp_path / "o" / "train" / fmt.part_name(0, 1)).to_pylist()[0]
    assert row["support.dense"][0] == [] and "support.time" not in row
    hx = int(fmt.hash_strings(["x"])[0])
    assert any(hx in ids for ids in row["support.multi.tags"] + row["query.multi.tags"])
