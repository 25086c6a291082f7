"""The hybrid trainer with real processes: PS servers, Horovod ranks over Gloo, on loopback.

No mocks: ``gmeta ps serve`` processes hold the TFRA tables, ``horovodrun -np 2`` (or ranks
started by hand with their own Gloo rendezvous, as Kubernetes pods start) trains against them.
Every process is bounded by a time-out and torn down in ``finally``.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import (
    LAUNCH_ID_ENV,
    LAUNCH_LOCAL_SETS,
    LAUNCH_LOCAL_STEPS,
    LocalCluster,
    free_ports,
    processes_with_env,
    rank_summaries,
    run_gmeta,
    start_ranks_manually,
    stop_manual_ranks,
)

from gmeta_tf.cluster.tf_config import parse_tf_config
from gmeta_tf.errors import ClusterError
from gmeta_tf.evaluation.evaluate import evaluate
from gmeta_tf.train.trained_run import load_trained

pytestmark = pytest.mark.integration  # real PS processes and horovodrun

# Test-task AUC of 2 workers (T=16 each) against 1 process (T=32): same total batch, same steps.
AUC_TOLERANCE = 0.03


@pytest.fixture(scope="module")
def data_dir(prepared_2500):
    return prepared_2500


def _args(data_dir, run_dir, steps, T, *sets):
    args = ["--config", "configs/quickstart.yaml", "--data", str(data_dir), "--out", str(run_dir),
            "--steps", str(steps), "--set", f"data.tasks_per_batch={T}"]
    for s in sets:
        args += ["--set", s]
    return args


def _eval_auc(run_dir):
    cfg, model, _ = load_trained(run_dir)
    return evaluate(model, cfg, cfg.meta.algo)["auc"]


def _straight_args(data_dir, run_dir):
    """The settings of the session's uninterrupted 2-worker run (``launch_local_2w2ps``)."""
    return _args(data_dir, run_dir, LAUNCH_LOCAL_STEPS, 16, *LAUNCH_LOCAL_SETS)


def test_launch_local_two_workers_two_ps(data_dir, tmp_path, launch_local_2w2ps, launch_local_2w2ps_auc):
    run, stdout, launch_id = launch_local_2w2ps  # `gmeta launch local --workers 2 --ps 2`, once a session
    assert "[ps0]" in stdout and "[ps1]" in stdout and "aggregate tasks/s" in stdout
    assert processes_with_env(LAUNCH_ID_ENV, launch_id) == []  # no orphans

    ranks = rank_summaries(run)
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]  # bit-identical replicas
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["ranks"] == 2 and summary["ps"] == 2
    for table, rows in summary["table_rows_per_ps"].items():
        assert len(rows) == 2 and min(rows) > 0, (table, rows)  # row-sharded over both PS

    single = tmp_path / "single"
    r = run_gmeta(["train", *_args(data_dir, single, LAUNCH_LOCAL_STEPS, 32)], timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    auc_dist, auc_single = launch_local_2w2ps_auc, _eval_auc(single)
    print(f"test AUC of 2 workers {auc_dist:.4f}, of 1 {auc_single:.4f}")  # shown with -s
    assert abs(auc_dist - auc_single) <= AUC_TOLERANCE, (auc_dist, auc_single)
    assert auc_dist > 0.58  # and it learned something


def test_killed_ps_fails_clearly_and_resume_matches_uninterrupted(data_dir, tmp_path, launch_local_2w2ps,
                                                                 launch_local_2w2ps_auc):
    run = tmp_path / "interrupted"
    args = _straight_args(data_dir, run)
    cluster = LocalCluster(log=lambda m: None)
    try:
        cluster.start_ps(2)
        victim = cluster.ps_children()[1]
        out = {}

        def kill_after_first_checkpoint():
            deadline = time.monotonic() + 300
            while not (run / "checkpoints" / "ckpt-00000020" / "meta.json").exists():
                if time.monotonic() > deadline:
                    return
                time.sleep(0.2)
            os.killpg(victim.proc.pid, signal.SIGKILL)
            out["killed_at"] = time.monotonic()

        import threading
        killer = threading.Thread(target=kill_after_first_checkpoint)
        killer.start()
        # The documented cluster line: horovodrun -np N -H host:k --gloo gmeta train --ps ...
        gmeta = str(Path(sys.executable).with_name("gmeta"))
        code = cluster.run_workers(2, [gmeta, "train", *args, "--ps", ",".join(cluster.ps_addresses)],
                                   timeout_s=400)
        killer.join()
        ended = time.monotonic()
        lines = "\n".join(c for ch in cluster.children for c in ch.lines)
    finally:
        cluster.teardown()
    assert "killed_at" in out, lines[-3000:]
    assert code not in (0, 124), lines[-3000:]
    print(f"the workers exited {ended - out['killed_at']:.1f} s after the kill")  # shown with -s
    assert ended - out["killed_at"] < 120  # failed, did not hang
    assert f"lost ps:1 ({cluster.ps_addresses[1]})" in lines, lines[-3000:]
    assert "Traceback" not in "\n".join(line for line in lines.splitlines() if "lost ps:" in line)

    # Fresh PS processes (new ports); the same --out resumes from the last complete checkpoint.
    r = run_gmeta(["launch", "local", "--workers", "2", "--ps", "2", "--timeout", "400", *args], timeout=500)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "resumed from" in r.stdout and "at step 20" in r.stdout
    assert all(s["start_step"] == 20 for s in rank_summaries(run).values())

    # the same settings, uninterrupted (tests/conftest.py: launch_local_2w2ps, its AUC evaluated once)
    auc_resumed, auc_straight = _eval_auc(run), launch_local_2w2ps_auc
    print(f"test AUC resumed {auc_resumed:.4f}, straight {auc_straight:.4f}")  # shown with -s
    assert abs(auc_resumed - auc_straight) <= AUC_TOLERANCE, (auc_resumed, auc_straight)


@pytest.mark.parametrize("delays", [[3.0, 0.0], [0.0, 0.0]], ids=["rank1-first", "simultaneous"])
def test_rank_start_order_never_crashes_a_ps(data_dir, tmp_path, delays):
    run = tmp_path / "order"
    cluster = LocalCluster(log=lambda m: None)
    try:
        cluster.start_ps(2)
        procs = start_ranks_manually(cluster, _args(data_dir, run, 10, 8), 2, delays)
        codes = [p.wait(timeout=300) for p in procs]
        ps_alive = [c.proc.poll() is None for c in cluster.ps_children()]
        lines = "\n".join(c for ch in cluster.children for c in ch.lines)
    finally:
        stop_manual_ranks(cluster)
        cluster.teardown()
    errors = "\n".join(line for line in lines.splitlines() if "Error" in line or "error:" in line)
    assert ps_alive == [True, True], errors[-3000:]
    assert codes == [0, 0], errors[-3000:]
    ranks = rank_summaries(run)
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]


def test_tables_are_shared_by_name_across_processes_whatever_the_creation_order(tmp_path):
    """The aliasing hazard, across real processes: B creates 'extra' first, then 'emb'."""
    script = tmp_path / "client.py"
    script.write_text('''
import sys, gmeta_tf, tensorflow as tf
ps, order, action = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [ps]}), job_name="worker" + action,
                                          make_master_device_default=False)
from gmeta_tf.embedding.table import EmbeddingTable
tables = {n: EmbeddingTable(n, 2, ["/job:ps/replica:0/task:0/device:CPU:0"], "job", 0.05, 0) for n in order}
if action == "write":
    tables["emb"].variable.upsert(tf.constant([7], tf.int64), tf.constant([[1.5, -2.5]]))
else:
    vals, exists = tables["emb"].lookup_values([7])
    print("EMB", bool(exists[0]), vals[0].tolist(), "EXTRA", tables["extra"].size(), flush=True)
''')
    cluster = LocalCluster(log=lambda m: None)
    try:
        cluster.start_ps(1)
        ps = cluster.ps_addresses[0]
        w = subprocess.run([sys.executable, str(script), ps, "emb", "write"], capture_output=True, text=True, timeout=120)
        assert w.returncode == 0, w.stderr[-2000:]
        r = subprocess.run([sys.executable, str(script), ps, "extra,emb", "read"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        cluster.teardown()
    line = [x for x in r.stdout.splitlines() if x.startswith("EMB")][0]
    assert line == "EMB True [1.5, -2.5] EXTRA 0"


def test_unreachable_ps_is_named(data_dir, tmp_path):
    port = free_ports(1)[0]
    r = run_gmeta(["train", *_args(data_dir, tmp_path / "x", 5, 8, "cluster.connect_timeout_s=2"),
                   "--ps", f"127.0.0.1:{port}"], timeout=120)
    assert r.returncode == 2
    assert f"127.0.0.1:{port}" in r.stderr and "not reachable" in r.stderr and "Traceback" not in r.stderr


def test_ps_serves_from_tf_config_and_stops_on_sigterm(tmp_path):
    grpc, health = free_ports(2)
    tf_config = json.dumps({"cluster": {"ps": [f"127.0.0.1:{grpc}"], "worker": ["127.0.0.1:1"]},
                            "task": {"type": "ps", "index": 0}})
    proc = subprocess.Popen([sys.executable, "-m", "gmeta_tf.cli.main", "ps", "serve", "--health-port", str(health)],
                            env={**os.environ, "TF_CONFIG": tf_config}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        from ps.server import wait_ready
        wait_ready(f"http://127.0.0.1:{health}/ready", 120, proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143  # SIGTERM's own code: a scheduler restarts a PS stopped from outside
    assert f"ps 0 ready at 127.0.0.1:{grpc}" in out and "ps 0 stopped" in out


@pytest.mark.parametrize("raw, words", [
    (None, "TF_CONFIG is not set"),
    ("{not json", "not valid JSON"),
    ('{"cluster": {"ps": ["a:1"]}}', "no 'task'"),
    ('{"cluster": {"ps": ["a"]}, "task": {"type": "ps", "index": 0}}', "host:port"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 3}}', "out of range"),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}', "task.type"),
])
def test_bad_tf_config_is_a_clear_error(raw, words):
    with pytest.raises(ClusterError, match=words):
        parse_tf_config(raw)


def test_several_workers_without_ps_is_refused(data_dir, tmp_path):
    """N Horovod ranks with local tables would each train their own embeddings: refuse it."""
    bin_dir = Path(sys.executable).parent
    r = subprocess.run([str(bin_dir / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", str(bin_dir / "gmeta"),
                        "train", *_args(data_dir, tmp_path / "x", 5, 8)],
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "2 workers but no parameter servers" in out, out[-2000:]
