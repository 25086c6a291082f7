"""The trainer puts every table where placement.yaml says: checked on 2 real PS processes.

The placement mixes all three layouts: a row-split table over both PS, a column-split table
(one block per PS), whole tables on PS 1 and on PS 0. After training (real ``horovodrun``
worker, real ``gmeta ps serve`` processes), a separate client connects to the still-running
PS and reads each table's size *on* each PS through the deterministic shared names: the
planned PS hold rows, the others hold nothing under that name.
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cluster_helpers import GMETA, LocalCluster

from gmeta_tf.plan.placement_file import ColumnSplit, read_placement, write_placement

pytestmark = pytest.mark.integration  # real PS processes and horovodrun

PLACEMENT = {
    "item_id": [0, 1],                            # row-split over both PS
    "item_tags": ColumnSplit([[1], [0]]),         # column halves, block 0 on PS 1
    "user_city": [1],
    "hour": [1],
    "item_category": [0],
    "user_segment": [0],
    # "device" is not named: row-sharded over every PS, as without a placement
}
# storage table -> the PS tasks its rows must be on
EXPECTED = {
    "item_id": [0, 1], "item_tags.c0of2": [1], "item_tags.c1of2": [0], "user_city": [1], "hour": [1],
    "item_category": [0], "user_segment": [0], "device": [0, 1],
}

PROBE = textwrap.dedent('''
    import json, sys
    import gmeta_tf, tensorflow as tf
    ps = sys.argv[1].split(",")
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": ps}), job_name="probe",
                                              make_master_device_default=False)
    from gmeta_tf.embedding.devices import table_devices
    from gmeta_tf.embedding.table import EmbeddingTable
    out = {}
    for name, (tasks, dim) in json.loads(sys.argv[2]).items():
        # the planned PS, and the same shard names on the other PS (which must not hold them)
        other = [1 - t for t in tasks] if len(tasks) == 1 else []
        for label, where in (("planned", tasks), ("other", other)):
            if where:
                t = EmbeddingTable(name, dim, table_devices(2, where), "gmeta", 0.05, 0)
                out.setdefault(name, {})[label] = dict(zip(map(str, where), t.shard_sizes()))
    print("PROBE " + json.dumps(out), flush=True)
''')


def test_trainer_places_tables_per_placement_yaml_on_real_ps(prepared_2500, tmp_path):
    placement = tmp_path / "placement.yaml"
    write_placement(str(placement), PLACEMENT, header="test placement")
    assert read_placement(str(placement)) == PLACEMENT
    run = tmp_path / "run"
    cluster = LocalCluster(log=lambda m: None)
    try:
        cluster.start_ps(2)
        ps = ",".join(cluster.ps_addresses)
        code = cluster.run_workers(1, [*GMETA, "train", "--config", "configs/quickstart.yaml", "--data",
                                       str(prepared_2500), "--out", str(run), "--steps", "12",
                                       "--set", "data.tasks_per_batch=8", "--set", "train.log_every=6",
                                       "--set", f"cluster.placement={placement}",
                                       # one TFRA table per feature: the probe reads each by its name
                                       # (fused tables group only what shares a PS list:
                                       # test_fused_tables.py::test_only_tables_placed_alike_fuse)
                                       "--set", "model.fuse_tables=false", "--ps", ps], timeout_s=400)
        lines = "\n".join(c for ch in cluster.children for c in ch.lines)
        assert code == 0, lines[-4000:]
        dims = {n: [t, 8 if ".c" in n else 16] for n, t in EXPECTED.items()}
        probe = subprocess.run([sys.executable, "-c", PROBE, ps, json.dumps(dims)], capture_output=True,
                               text=True, timeout=180, cwd=Path(__file__).resolve().parents[1])
        assert probe.returncode == 0, probe.stderr[-3000:]
    finally:
        cluster.teardown()
    seen = json.loads([x for x in probe.stdout.splitlines() if x.startswith("PROBE ")][0][6:])
    for name, tasks in EXPECTED.items():
        assert sorted(int(t) for t in seen[name]["planned"]) == tasks
        assert all(rows > 0 for rows in seen[name]["planned"].values()), (name, seen[name])
        assert all(rows == 0 for rows in seen[name].get("other", {}).values()), (name, seen[name])
    # the column halves hold the same ids; the row halves split the ids
    assert seen["item_tags.c0of2"]["planned"]["1"] == seen["item_tags.c1of2"]["planned"]["0"]

    summary = json.loads((run / "train_summary.json").read_text())
    by_task = summary["table_rows_by_ps_task"]
    assert sorted(by_task) == sorted(EXPECTED)
    for name, tasks in EXPECTED.items():
        assert sorted(int(t) for t in by_task[name]) == tasks
        assert by_task[name] == seen[name]["planned"]  # what the worker saw is what the PS hold
    ckpt = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    saved = json.loads((ckpt / "meta.json").read_text())["rows"]
    for name in EXPECTED:  # every block and its Adam slots are in the checkpoint
        assert saved[name] == sum(by_task[name].values()) == saved[f"{name}.m"] == saved[f"{name}.v"]
