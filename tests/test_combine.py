"""``gmeta data combine``: parts of one prepare run → the data set one prepare would have written.

The parts are real ``prepare --part I/3`` outputs of the log the whole prepare reads: each
part's own statistics describe the part alone, so a combine that copied one part's statistics
instead of merging them fails the comparison with the whole.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import List

import numpy as np
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.data_cmd import data
from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.combine import combine
from gmeta_tf.errors import DataError

N_PARTS, SHARDS = 3, 6


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """One prepare of the whole log (``--part 0/1``: the hash assignment the parts share), and the
    same log prepared as N parts (``--part I/N``)."""
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    root = tmp_path_factory.mktemp("combine")
    synth(str(root / "raw"), tasks=400, seed=3)
    cfg = dict(query=4, max_support=8, min_task_size=10, shards=SHARDS, seed=2)
    prepare([str(root / "raw")], str(root / "whole"), PrepareConfig(part="0/1", **cfg))
    for i in range(N_PARTS):
        prepare([str(root / "raw")], str(root / "parts" / f"part{i}"), PrepareConfig(part=f"{i}/{N_PARTS}", **cfg))
    return root / "whole"


@pytest.fixture
def parts(prepared, tmp_path) -> List[Path]:
    """A fresh copy of the parts for each test (tests edit them)."""
    dirs = []
    for i in range(N_PARTS):
        dirs.append(tmp_path / "parts" / f"part{i}")
        shutil.copytree(prepared.parent / "parts" / f"part{i}", dirs[-1])
    return dirs


def _approx(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _approx(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _approx(x, y)
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-9)
    else:
        assert a == b


def test_combined_schema_is_the_whole_prepares(prepared, parts, tmp_path):
    out = tmp_path / "combined"
    s = combine([str(p) for p in reversed(parts)], str(out))  # any order
    whole = json.loads((prepared / fmt.SCHEMA_FILE).read_text())
    got = json.loads((out / fmt.SCHEMA_FILE).read_text())
    assert "part" not in got
    del whole["part"]
    _approx(whole, got)  # every statistic, the splits, the summary, the id count files
    assert s["parts"] == N_PARTS and s["linked"] == 3 * SHARDS and s["copied"] == 0
    assert s["splits"] == {k: {"tasks": v["tasks"], "samples": v["samples"]} for k, v in whole["splits"].items()}
    for col, rel in whole["id_counts"].items():
        with np.load(prepared / rel) as a, np.load(out / got["id_counts"][col]) as b:
            np.testing.assert_array_equal(a["ids"], b["ids"])
            np.testing.assert_array_equal(a["counts"], b["counts"])


def test_shards_are_hard_links_with_the_global_names(parts, tmp_path):
    out = tmp_path / "combined"
    combine([str(p) for p in parts], str(out))
    for split in fmt.SPLITS:
        names = sorted(f.name for f in (out / split).iterdir())
        assert names == [fmt.part_name(s, SHARDS) for s in range(SHARDS)]
        for s, name in enumerate(names):
            src = parts[s % N_PARTS] / split / name
            assert os.stat(src).st_ino == os.stat(out / split / name).st_ino
    schema = fmt.load_schema(str(out))
    assert len(fmt.split_files(str(out), "train", schema)) == SHARDS


def test_copies_where_links_are_impossible(parts, tmp_path, monkeypatch):
    def no_link(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    s = combine([str(p) for p in parts], str(tmp_path / "combined"))
    assert s["linked"] == 0 and s["copied"] == 3 * SHARDS
    f = tmp_path / "combined" / "valid" / fmt.part_name(4, SHARDS)
    assert f.read_bytes() == (parts[1] / "valid" / fmt.part_name(4, SHARDS)).read_bytes()
    assert os.stat(f).st_ino != os.stat(parts[1] / "valid" / fmt.part_name(4, SHARDS)).st_ino


def _edit(part: Path, fn) -> None:
    schema = json.loads((part / fmt.SCHEMA_FILE).read_text())
    fn(schema)
    (part / fmt.SCHEMA_FILE).write_text(json.dumps(schema))


@pytest.mark.parametrize("edit, field", [
    (lambda s: s.update(format_version=2), "format_version"),
    (lambda s: s["part"].update(count=4), "part.count"),
    (lambda s: s["part"].update(index=0), "part.index"),
    (lambda s: s.pop("part"), "'part'"),
    (lambda s: s["support_query"].update(query=5), "support_query"),
    (lambda s: s["dense"].reverse(), "dense"),
    (lambda s: s["categorical"][4].update(hashed=False), "categorical"),
    (lambda s: s.update(time_col=None), "time_col"),
    (lambda s: s.update(target_encoding=[{"column": "item_id"}]), "target_encoding"),
    (lambda s: s["splits"]["train"]["files"].append("train/part-00000-of-00006.parquet"), "splits.train.files"),
])
def test_parts_that_do_not_belong_together_are_refused(parts, tmp_path, edit, field):
    _edit(parts[1], edit)
    out = tmp_path / "combined"
    with pytest.raises(DataError) as e:
        combine([str(p) for p in parts], str(out))
    assert field in str(e.value)
    assert str(parts[1]) in str(e.value) or "format_version" in field  # load_schema names the file
    assert not out.exists() and not list(tmp_path.glob("combined.tmp-*"))


def test_a_missing_or_repeated_part_is_named(parts, tmp_path):
    with pytest.raises(DataError, match=r"part\(s\) 2/3 missing"):
        combine([str(parts[0]), str(parts[1])], str(tmp_path / "a"))
    with pytest.raises(DataError, match="field 'part.index' 1 is also the index of"):
        combine([str(parts[0]), str(parts[1]), str(parts[1])], str(tmp_path / "b"))


def test_a_missing_shard_file_is_named(parts, tmp_path):
    (parts[2] / "test" / fmt.part_name(5, SHARDS)).unlink()
    with pytest.raises(DataError) as e:
        combine([str(p) for p in parts], str(tmp_path / "c"))
    assert "part-00005-of-00006.parquet" in str(e.value)
    assert not (tmp_path / "c").exists()


def test_cli_combine(parts, tmp_path):
    out = tmp_path / "combined"
    r = CliRunner().invoke(data, ["combine", *map(str, parts), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"combined 3 part(s) into {out}" in r.output and "18 hard-linked, 0 copied" in r.output
    again = CliRunner().invoke(data, ["combine", *map(str, parts), "--out", str(out)])
    assert again.exit_code == 2 and again.output.startswith("error: ") and "already exists" in again.output
    bad = CliRunner().invoke(data, ["combine", str(parts[0]), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "missing" in bad.output and "Traceback" not in bad.output


def test_combine_reads_the_parts_schemas_not_their_shards(prepared, parts, tmp_path):
    """Its cost is the distinct ids, not the samples: shards whose bytes are unreadable combine to
    the same statistics (the old combine reread every shard's id, dense and label columns)."""
    for p in parts:
        for f in p.glob("*/part-*.parquet"):
            f.write_bytes(b"not parquet")
    out = tmp_path / "combined"
    combine([str(p) for p in parts], str(out))
    whole = json.loads((prepared / fmt.SCHEMA_FILE).read_text())
    got = json.loads((out / fmt.SCHEMA_FILE).read_text())
    for key in ("categorical", "multi_hot", "dense", "label_stats", "table_stats", "summary"):
        _approx(whole[key], got[key])


def test_a_part_without_its_distinct_ids_is_named(parts, tmp_path):
    (parts[1] / fmt.PART_IDS_DIR / "item_id.npz").unlink()
    with pytest.raises(DataError) as e:
        combine([str(p) for p in parts], str(tmp_path / "c"))
    assert str(parts[1] / fmt.PART_IDS_DIR / "item_id.npz") in str(e.value)
    assert not (tmp_path / "c").exists()


def test_parts_without_a_train_task_together_are_refused(parts, tmp_path):
    for p in parts:
        _edit(p, lambda s: s["splits"]["train"].update(tasks=0))
    with pytest.raises(DataError, match="no train task together"):
        combine([str(p) for p in parts], str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("edit, field", [
    (lambda s: s["part"].pop("train_samples"), "field 'part.train_samples' is missing"),
    (lambda s: s["part"]["dense"].pop(), "field 'part.dense' must list one entry per feature"),
    (lambda s: s["part"]["dense"][1].pop("m2"), "field 'part.dense[1]' lacks m2"),
    (lambda s: s["part"]["label"].pop("mean"), "field 'part.label' lacks mean"),
])
def test_a_part_whose_statistics_are_incomplete_is_named(parts, tmp_path, edit, field):
    _edit(parts[2], edit)
    with pytest.raises(DataError) as e:
        combine([str(p) for p in parts], str(tmp_path / "c"))
    assert field in str(e.value) and str(parts[2] / fmt.SCHEMA_FILE) in str(e.value), str(e.value)
    assert not (tmp_path / "c").exists()
