"""The scale benchmarks (``bench/table_scale.py``, ``bench/scale.py``) at their smoke sizes, the
cuckoo-table model they compare against, and the bounded table's pre-size they found."""
from __future__ import annotations

import json
import math

import pytest
from synthetic_batch import tiny_schema

from bench.table_scale import cuckoo_model, floor_bytes_per_row
from gmeta_tf.embedding.table import initial_capacity


def test_the_cuckoo_model_follows_libcuckoos_layout():
    # dim 16: a slot holds pair<int64, float[16]> (72 B) plus its partial and occupied bytes
    m = cuckoo_model(1_000_000, initial_capacity(1_000_000), dim=16, slots=2)
    assert m["slot_bytes"] == 74
    assert m["hashpower"] == 19  # 1.5M rows of capacity / 4 slots = 375k buckets -> 2^19
    assert m["load_factor"] == pytest.approx(1e6 / (4 << 19))
    # the row's table and Adam's two slot tables, each with 65,536 64-byte locks
    assert m["model_bytes_per_row"] == pytest.approx(3 * ((4 << 19) * 74 + 65_536 * 64) / 1e6)
    # a table filled past ~95% of its slots doubles
    assert cuckoo_model(40_000, 8192, 16, 2)["hashpower"] == 14
    assert floor_bytes_per_row(16, 2) == 8 + 16 * 4 * 3


def test_a_bounded_table_is_pre_sized_for_max_rows_not_the_data():
    """Every bucket of a cuckoo table's capacity is allocated when it is created: a table bounded
    to 1,000 rows was pre-sized for the data's 1M ids (150 MB for rows it evicts)."""
    from gmeta_tf.config.schema import ModelConfig
    from gmeta_tf.model.dlrm import DLRM

    schema = tiny_schema("click")
    schema["categorical"][0]["cardinality"] = 1_000_000  # item
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], max_rows={"item": 1000}), schema)
    by_name = {t.name: t for t in model.tables}
    assert by_name["item"].variable.init_size == initial_capacity(1000)
    from gmeta_tf.embedding.table import expected_table_rows

    assert expected_table_rows(1_000_000, 1000) == 1000
    assert expected_table_rows(500, 1000) == 500
    assert expected_table_rows(0, 1000) == 1000  # no statistics: the bound
    assert expected_table_rows(1_000_000) == 1_000_000  # unbounded: the data


def test_on_paper_cuts_the_rows_into_parts_of_the_largest_size_measured():
    from bench.scale import Fleet, on_paper

    row = {"rows": 10_000_000, "synth_wall_s": 100.0, "synth_peak_rss_mb": 4096.0, "prepare_wall_s": 300.0,
           "prepare_peak_rss_mb": 20480.0, "train_tasks_per_s": 1000.0, "train_tasks_per_s_2w2ps": 1500.0,
           "eval_users": 30_000, "eval_wall_s": 60.0, "eval_peak_rss_mb": 1024.0}
    small = {**row, "rows": 1_000_000, "synth_wall_s": 1e6}  # not the largest: never read
    got = on_paper({"1000000": small, "10000000": row}, fleet=Fleet(machines=4, cores=16, memory_gb=64, ids=10 ** 8,
                                                                     table_bytes_per_row=400))
    assert got["parts"] == 100 and got["from_rows"] == 10_000_000
    assert got["synth"]["processes_at_once"] == 4 * 12  # 51.2 GB of a machine / 4 GB: 12 of its 16 cores
    assert got["synth"]["hours"] == pytest.approx(math.ceil(100 / 48) * 100 / 3600)
    assert got["prepare"]["processes_at_once"] == 4 * 2  # 20 GB each: 2 at once per machine
    assert got["prepare"]["hours"] == pytest.approx(13 * 300 / 3600)
    assert got["train"]["efficiency_2w2ps"] == 0.75
    assert got["train"]["hours"] == pytest.approx(1e9 / 67 / (4 * 1000 * 0.75) / 3600)
    assert got["tables"]["ps_machines"] == 1  # 37 GB of rows in 51 GB
    assert got["eval"]["users"] == 3_000_000
    assert got["hours"] == pytest.approx(sum(got[s]["hours"] for s in ("synth", "prepare", "train", "eval")))


@pytest.mark.integration  # a fresh process per table, a real PS (about 40 s on 2 cores)
def test_table_scale_smoke_reports_bytes_per_row_above_the_floor_and_bounded_eviction():
    from bench.table_scale import SMOKE_IDS, measure_tables

    got = measure_tables(smoke=True, log=lambda m: None)
    print(json.dumps(got))  # the smoke figures, with -s
    row = got["table"][str(SMOKE_IDS)]
    assert row["floor_bytes_per_row"] == 200
    assert row["rows"] == row["ps_rows"] == SMOKE_IDS
    # the pre-sized buckets alone are more than the floor; what the model of them predicts is
    # most of what the process grew by
    assert row["bytes_per_row"] >= row["floor_bytes_per_row"]
    assert row["ps_bytes_per_row"] >= row["floor_bytes_per_row"]
    assert row["created_bytes_per_row"] >= 0.8 * row["tfra_model_bytes_per_row"]
    ev = got["eviction"][str(SMOKE_IDS)]
    assert ev["ids_fed"] == 3 * ev["max_rows"]
    assert ev["rows_max"] <= ev["max_rows"]
    assert ev["rows_after"] == [ev["max_rows"]] * 4  # the rows, m, v and the update counts
    # fed twice as many ids again after reaching max_rows, the process grew by less than half
    assert ev["rss_growth_after_max_rows"] < 1.5
    assert ev["tfra_model_bytes_per_row"] < ev["tfra_model_bytes_per_row_sized_for_data"]


@pytest.mark.integration  # five gmeta commands, a 2-worker + 2-PS launch among them (minutes)
def test_scale_smoke_reports_every_figure():
    from bench.scale import KEYS, SMOKE_ROWS, measure_scale

    got = measure_scale(smoke=True, log=lambda m: None)
    print(json.dumps(got))
    row = got[str(SMOKE_ROWS)]
    for key in KEYS:
        assert math.isfinite(row[key]) and row[key] > 0, key
    assert abs(row["rows"] - SMOKE_ROWS) < 0.1 * SMOKE_ROWS  # ~67 rows a task
    assert row["eval_users"] > 0
    assert got["on_paper"]["hours"] > 0


def test_the_end_to_end_run_trains_one_epoch_of_the_train_split(tmp_path):
    """scale_100m's one-process run: ceil(train tasks / the quickstart's tasks_per_batch) steps."""
    from bench.scale import epoch_steps

    (tmp_path / "schema.json").write_text(json.dumps({"splits": {"train": {"tasks": 1_000_001}}}))
    assert epoch_steps(tmp_path) == math.ceil(1_000_001 / 32)
    (tmp_path / "schema.json").write_text(json.dumps({"splits": {"train": {"tasks": 5}}}))
    assert epoch_steps(tmp_path) == 1
