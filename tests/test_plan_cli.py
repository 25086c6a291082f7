"""``gmeta data stats`` and ``gmeta plan`` end to end, the table statistics and placement.yaml."""
import json
import shutil

import numpy as np
import pytest
import yaml
from cluster_helpers import run_gmeta

from gmeta_tf.cli.plan_cmd import parse_size
from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data.prepare import prepare
from gmeta_tf.errors import ClusterError
from gmeta_tf.plan.placement_file import ColumnSplit, check_tasks, read_placement
from gmeta_tf.plan.spec import N_SKEW_BINS, skew_histogram
from gmeta_tf.plan.tables_from_data import tables_from_data

TABLES = ["item_id", "item_category", "user_city", "user_segment", "device", "hour", "item_tags"]


@pytest.fixture(scope="module")
def prepared(synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "prepared"
    prepare([str(synth_dir)], str(out), PrepareConfig(query=4, max_support=8, min_task_size=30, shards=2))
    return out


def test_prepare_records_table_stats_of_the_train_split(prepared, split_table):
    schema = json.loads((prepared / "schema.json").read_text())
    st = schema["table_stats"]
    assert list(st) == TABLES
    train = split_table(prepared, "train")
    n_samples = sum(train["n_support"].to_pylist()) + sum(train["n_query"].to_pylist())
    ids = np.concatenate([np.concatenate([np.asarray(x, np.int64) for x in train[f"{w}.cat.item_id"].to_pylist()])
                          for w in ("support", "query")])
    uniq, counts = np.unique(ids, return_counts=True)
    assert st["item_id"]["rows"] == uniq.size and st["item_id"]["lookups"] == ids.size
    assert st["item_id"]["pooling"] == pytest.approx(1.0)
    np.testing.assert_allclose(st["item_id"]["skew"], skew_histogram(counts), atol=1e-6)
    tags = [t for w in ("support", "query") for s in train[f"{w}.multi.item_tags"].to_pylist() for t in s]
    assert st["item_tags"]["pooling"] == pytest.approx(sum(map(len, tags)) / n_samples)
    assert all(len(v["skew"]) == N_SKEW_BINS and abs(sum(v["skew"]) - 1) < 1e-5 for v in st.values())


@pytest.mark.integration  # runs the gmeta CLI as a subprocess
def test_data_stats_recomputes_and_rewrites_schema(prepared, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(prepared, d)
    schema = json.loads((d / "schema.json").read_text())
    expected = schema.pop("table_stats")
    (d / "schema.json").write_text(json.dumps(schema))
    r = run_gmeta(["data", "stats", str(d), "--set", "model.embedding_dim=24"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in TABLES:
        assert any(line.split()[:1] == [name] and " 24 " in line for line in r.stdout.splitlines()), r.stdout
    again = json.loads((d / "schema.json").read_text())
    assert again["table_stats"] == expected
    assert {k: v for k, v in again.items() if k != "table_stats"} == schema  # nothing else touched
    assert not list(d.glob("*.tmp-*"))


def test_tables_from_data_takes_dim_from_config_and_caps_pooling(prepared):
    cfg = load_config(None, ["model.embedding_dim=12", "data.max_multi_hot=1"])
    tabs = {t.name: t for t in tables_from_data(str(prepared), cfg)}
    assert list(tabs) == TABLES and all(t.dim == 12 for t in tabs.values())
    assert tabs["item_tags"].pooling == 1.0  # capped: the reader keeps 1 id per sample
    assert tabs["item_id"].rows == json.loads((prepared / "schema.json").read_text())["table_stats"]["item_id"]["rows"]


@pytest.mark.integration  # runs the gmeta CLI as a subprocess
def test_plan_cli_writes_placement_and_prints_per_ps_table(prepared, tmp_path):
    out = tmp_path / "placement.yaml"
    r = run_gmeta(["plan", "--data", str(prepared), "--ps", "2", "--mem-per-ps", "64MiB", "--seed", "1",
                   "--config", "configs/quickstart.yaml", "--out", str(out)], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PS", "memory", "pred.", "ms", "tables"]
    assert [line.split()[0] for line in lines[1:3]] == ["0", "1"]
    assert "max predicted cost" in r.stdout and "best baseline" in r.stdout
    placement = read_placement(str(out))
    assert sorted(placement) == sorted(TABLES)
    check_tasks(placement, 2)
    for name in TABLES:  # every table appears in the printed rows of the PS that hold it
        spec = placement[name]
        tasks = [t for c in spec.columns for t in c] if isinstance(spec, ColumnSplit) else spec
        for t in tasks:
            assert name in lines[1 + t], (name, lines)
    # a baseline through the same command; the same seed gives the same file
    again = tmp_path / "again.yaml"
    assert run_gmeta(["plan", "--data", str(prepared), "--ps", "2", "--mem-per-ps", "64MiB", "--seed", "1",
                      "--config", "configs/quickstart.yaml", "--out", str(again)], timeout=120).returncode == 0
    assert yaml.safe_load(again.read_text()) == yaml.safe_load(out.read_text())
    r = run_gmeta(["plan", "--data", str(prepared), "--ps", "3", "--algo", "size-greedy", "--out",
                   str(tmp_path / "g.yaml")], timeout=120)
    assert r.returncode == 0 and "(size-greedy)" in r.stdout, r.stderr[-2000:]


@pytest.mark.integration  # runs the gmeta CLI as a subprocess
def test_plan_cli_infeasible_names_the_table(prepared, tmp_path):
    r = run_gmeta(["plan", "--data", str(prepared), "--ps", "2", "--mem-per-ps", "1KiB", "--out",
                   str(tmp_path / "p.yaml")], timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "table 'item_id'" in r.stderr and "--mem-per-ps" in r.stderr, r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_parse_size():
    assert parse_size("8GiB") == 8 * 2**30 and parse_size("512MiB") == 512 * 2**20
    assert parse_size("2GB") == 2 * 10**9 and parse_size("1000") == 1000 and parse_size("1.5KiB") == 1536
    for bad in ("", "8XB", "GiB", "-1GiB"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)


def test_placement_file_column_blocks_and_errors(tmp_path):
    f = tmp_path / "placement.yaml"
    f.write_text("tables:\n  a: [0, 1]\n  b: {ps: [1]}\n  c: {columns: [[0], [1, 2]]}\n")
    assert read_placement(str(f)) == {"a": [0, 1], "b": [1], "c": ColumnSplit([[0], [1, 2]])}
    with pytest.raises(ClusterError, match=r"table 'c' on PS task\(s\) \[2\], but only 2 PS"):
        check_tasks(read_placement(str(f)), 2)
    for text, words in [("tables:\n  c: {columns: [[0]]}\n", "'columns' needs a list of >= 2 blocks"),
                        ("tables:\n  c: {columns: [[0], []]}\n", r"table 'c' needs .* \(columns\[1\]\)"),
                        ("tables:\n  a: [1, 1]\n", "lists a PS task twice"),
                        ("tables: {a: [0]\n", "not valid YAML")]:
        f.write_text(text)
        with pytest.raises(ClusterError, match=words):
            read_placement(str(f))
