"""A rendered TFJob, run for real on one machine: every replica it describes becomes a process.

Each process gets what the training operator would give that pod — ``TF_CONFIG`` (cluster +
task), the container's env and command — with service addresses mapped to loopback ports and
the ConfigMap / checkpoint volume mapped to local directories. No ``horovodrun``: workers form
the Horovod ring through the Gloo rendezvous worker 0 hosts, as in the cluster.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import LAUNCH_LOCAL_SETS, LAUNCH_LOCAL_STEPS, free_ports, rank_summaries, run_gmeta

from gmeta_tf import exit_codes
from gmeta_tf.config.loader import load_config
from gmeta_tf.evaluation.evaluate import evaluate
from gmeta_tf.train.model_build import CONFIG_FILE
from gmeta_tf.train.trained_run import load_trained
from launch.k8s_render import render_manifests, validate_tfjob
from launch.local_cluster import LocalCluster
from ps.server import wait_ready

pytestmark = pytest.mark.integration  # TFJob pods emulated as real processes

AUC_TOLERANCE = 0.03  # emulated TFJob against `gmeta launch local`, same shape and steps


@pytest.fixture(scope="module")
def data_dir(prepared_2500):
    return prepared_2500


def _container(tfjob, replica):
    spec = tfjob["spec"]["tfReplicaSpecs"][replica]
    (container,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
    return spec["replicas"], container


def _local_argv(command, mounts):
    """The container command with mount paths mapped to local directories."""
    gmeta = str(Path(sys.executable).with_name("gmeta"))
    out = []
    for arg in command:
        for src, dst in mounts.items():
            if arg.startswith(src):
                arg = dst + arg[len(src):]
        out.append(arg)
    assert out[0] == "gmeta"
    return [gmeta, *out[1:]]


def _auc(run_dir):
    cfg, model, _ = load_trained(run_dir)
    return evaluate(model, cfg, cfg.meta.algo)["auc"]


def _run_tfjob(configmap, tfjob, tmp_path, mounts, fault=None, pod_env=None):
    """Start every replica of ``tfjob`` as a local process, as the operator would; wait for the
    workers. Returns their exit codes and every pod's log lines. ``fault(pods)`` runs once every
    pod is started (it may kill one); ``pod_env(replica, index)``: more environment for that pod."""
    conf_dir = Path(mounts["/etc/gmeta"])
    conf_dir.mkdir(parents=True, exist_ok=True)
    for key, text in configmap["data"].items():
        (conf_dir / key).write_text(text)

    n_ps, ps_container = _container(tfjob, "PS")
    n_workers, worker_container = _container(tfjob, "Worker")
    ps_ports, worker_ports = free_ports(n_ps), free_ports(n_workers)
    health_ports, (rdv_port,) = free_ports(n_ps), free_ports(1)
    cluster_spec = {"ps": [f"127.0.0.1:{p}" for p in ps_ports], "worker": [f"127.0.0.1:{p}" for p in worker_ports]}

    cluster = LocalCluster(log=lambda m: None)
    try:
        pods = []
        for replica, count, container in (("ps", n_ps, ps_container), ("worker", n_workers, worker_container)):
            for i in range(count):
                env = {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
                env["TF_CONFIG"] = json.dumps({"cluster": cluster_spec, "task": {"type": replica, "index": i}})
                # One host for every pod: distinct loopback ports instead of pod IPs.
                env["GMETA_RENDEZVOUS_PORT"] = str(rdv_port)
                env["GMETA_GLOO_IFACE"] = "lo"
                if replica == "ps":
                    env["GMETA_HEALTH_PORT"] = str(health_ports[i])
                env.update(pod_env(replica, i) if pod_env is not None else {})
                cluster.env.update(env)
                argv = _local_argv([*container["command"], *container.get("args", [])], mounts)
                pods.append(cluster.spawn(f"{replica}-{i}", argv, prefix=f"{replica}{i}"))
            if replica == "ps":  # every PS pod starts at once, as the operator starts them
                for i in range(n_ps):
                    wait_ready(f"http://127.0.0.1:{health_ports[i]}/ready", 120, pods[i].proc)
        workers = [p for p in pods if p.name.startswith("worker")]
        if fault is not None:
            fault(pods)
        deadline = time.monotonic() + 500
        codes = [w.proc.wait(timeout=max(1.0, deadline - time.monotonic())) for w in workers]
        lines = "\n".join(line for p in pods for line in p.lines)
    finally:
        cluster.teardown()
    return codes, lines


def _comparable(cfg) -> dict:
    """What decides the trained model (data, model, meta-learning, training, hot rows), without
    what differs between two launches of one job: where the data is, the cluster's addresses."""
    from dataclasses import asdict

    out = {k: v for k, v in asdict(cfg).items() if k in ("data", "model", "meta", "train", "hot")}
    out["data"].pop("path")
    return out


def test_rendered_tfjob_trains_like_launch_local(data_dir, tmp_path, launch_local_2w2ps, launch_local_2w2ps_auc):
    """The rendered job against the session's `gmeta launch local` run of the same config
    (tests/conftest.py), checked to be the same config before their models are compared."""
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data_dir}", f"train.steps={LAUNCH_LOCAL_STEPS}",
                                                  *LAUNCH_LOCAL_SETS])
    configmap, tfjob = render_manifests(cfg, image="gmeta-tf:test", workers=2, ps=2, gpus_per_worker=0,
                                        name="emu", checkpoint_pvc="ckpt", data=str(data_dir))
    validate_tfjob(tfjob)
    conf_dir, ckpt_dir = tmp_path / "etc-gmeta", tmp_path / "ckpt"
    ckpt_dir.mkdir()
    codes, lines = _run_tfjob(configmap, tfjob, tmp_path, {"/etc/gmeta": str(conf_dir), "/ckpt": str(ckpt_dir)})
    assert codes == [0, 0], lines[-4000:]
    (run_dir,) = [p for p in ckpt_dir.iterdir() if p.is_dir()]
    ranks = rank_summaries(run_dir)
    assert sorted(ranks) == [0, 1] and ranks[0]["dense_digest"] == ranks[1]["dense_digest"]

    local = launch_local_2w2ps[0]
    assert _comparable(load_config(str(conf_dir / "config.yaml"))) == _comparable(load_config(str(local / CONFIG_FILE)))
    auc_job, auc_local = _auc(run_dir), launch_local_2w2ps_auc  # local's, evaluated once a session
    print(f"test AUC of the TFJob {auc_job:.4f}, of launch local {auc_local:.4f}")  # shown with -s
    assert abs(auc_job - auc_local) <= AUC_TOLERANCE, (auc_job, auc_local)


def test_rendered_tfjob_with_checkpoint_uri_writes_and_resumes_there(data_dir, tmp_path):
    """``--checkpoint-uri``: no volume in the manifest; the URI reaches every pod as ``--out``
    and the run directory (config, checkpoints with the PS tables, summaries) is written through
    ``gmeta_tf.storage``. A ``file://`` URI stands in for the bucket here (the object-store commit
    itself is tested in-process on ``ram://``: tests/test_checkpoint.py, test_train_eval.py).
    A second start of the same job -- a restarted pod set -- resumes from the URI."""
    from gmeta_tf import storage

    uri = f"file://{tmp_path}/bucket/runs/emu-uri"
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data_dir}", "train.steps=20",
                                                  "train.checkpoint_every=10", "data.tasks_per_batch=8",
                                                  "train.log_every=10"])
    configmap, tfjob = render_manifests(cfg, image="gmeta-tf:test", workers=2, ps=1, gpus_per_worker=0,
                                        name="emu-uri", checkpoint_uri=uri, data=str(data_dir))
    validate_tfjob(tfjob)
    for replica in ("PS", "Worker"):
        pod = tfjob["spec"]["tfReplicaSpecs"][replica]["template"]["spec"]
        assert not any("persistentVolumeClaim" in v for v in pod.get("volumes", []))
    mounts = {"/etc/gmeta": str(tmp_path / "etc-gmeta")}
    codes, lines = _run_tfjob(configmap, tfjob, tmp_path, mounts)
    assert codes == [0, 0], lines[-4000:]
    assert storage.listdir(storage.join(uri, "checkpoints")) == ["ckpt-00000010", "ckpt-00000020", "latest"]
    ranks = rank_summaries(Path(storage.local_path(uri)))
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"] and ranks[0]["steps"] == 20
    _, model, _ = load_trained(uri)
    assert all(t.size() > 0 for t in model.tables)  # the PS tables were exported into the bucket

    codes, lines = _run_tfjob(configmap, tfjob, tmp_path, mounts)
    assert codes == [0, 0], lines[-4000:]
    assert "resumed from" in lines and "at step 20" in lines
    assert rank_summaries(Path(storage.local_path(uri)))[0]["start_step"] == 20


def _kill_after_checkpoint_20(run_dir, pods, name: str) -> None:
    """SIGKILL pod ``name`` once the checkpoint at step 20 is complete (its meta.json written)."""
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "ckpt-00000020" / "meta.json").exists():
        assert time.monotonic() < deadline, "no checkpoint at step 20"
        time.sleep(0.2)
    (pod,) = [p for p in pods if p.name == name]
    os.kill(pod.proc.pid, signal.SIGKILL)


def test_a_lost_ps_pod_exits_retryable_and_the_restarted_pods_resume(data_dir, tmp_path):
    """The PS pod is killed (SIGKILL, as a node loss does) after the checkpoint at step 20: every
    worker exits with a code the rendered ``restartPolicy: ExitCode`` retries (128-255), and the
    pod set the operator starts again resumes from that checkpoint and finishes."""

    cfg = load_config("configs/quickstart.yaml", [f"data.path={data_dir}", "train.steps=2000",
                                                  "train.checkpoint_every=20", "data.tasks_per_batch=8",
                                                  "train.log_every=20"])
    configmap, tfjob = render_manifests(cfg, image="gmeta-tf:test", workers=2, ps=1, gpus_per_worker=0,
                                        name="emu-fault", checkpoint_pvc="ckpt", data=str(data_dir))
    policy = {tfjob["spec"]["tfReplicaSpecs"][r]["restartPolicy"] for r in ("PS", "Worker")}
    assert policy == {"ExitCode"}
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    mounts = {"/etc/gmeta": str(tmp_path / "etc-gmeta"), "/ckpt": str(ckpt_dir)}
    run_dir = ckpt_dir / "emu-fault"

    def kill_ps_after_checkpoint_20(pods):
        _kill_after_checkpoint_20(run_dir, pods, "ps-0")

    codes, lines = _run_tfjob(configmap, tfjob, tmp_path, mounts, fault=kill_ps_after_checkpoint_20)
    assert all(128 <= c <= 255 for c in codes), (codes, lines[-4000:])  # ExitCode retries these
    assert "lost ps:0" in lines, lines[-4000:]
    done = max(int(p.name[5:13]) for p in (run_dir / "checkpoints").glob("ckpt-*") if (p / "meta.json").exists())
    # the operator's restart: the same pods again (a PS with no tables), the same run directory
    configmap["data"]["config.yaml"] = configmap["data"]["config.yaml"].replace("steps: 2000", f"steps: {done + 4}")
    codes, lines = _run_tfjob(configmap, tfjob, tmp_path, mounts)
    assert codes == [0, 0], lines[-4000:]
    assert f"at step {done}" in lines, lines[-4000:]
    assert rank_summaries(run_dir)[0]["last_step"] == done + 4


@pytest.mark.parametrize("killed", [0, 1])
def test_a_lost_worker_pod_is_blamed_only_on_what_can_be_asked(data_dir, tmp_path, killed):
    """Pods that share no disk for their status records (each its own ``GMETA_STATUS_DIR``), one
    worker killed (SIGKILL) after the checkpoint at step 20; the PS answers throughout. Worker 1
    asks worker 0's Gloo rendezvous, which worker 0 serves for its life: refused, so worker 0 is
    named and the code is retried (200). Worker 0 has nothing to ask about worker 1: it exits 1
    naming its error, not a guessed 200 (the old rule laid every dropped connection on the peers
    by its type, and a TFJob restarts 200 for ever when the error is the rank's own)."""
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data_dir}", "train.steps=2000",
                                                  "train.checkpoint_every=20", "data.tasks_per_batch=8",
                                                  "train.log_every=20"])
    configmap, tfjob = render_manifests(cfg, image="gmeta-tf:test", workers=2, ps=1, gpus_per_worker=0,
                                        name="emu-lost", checkpoint_pvc="ckpt", data=str(data_dir))
    ckpt_dir = tmp_path / "ckpt"
    ckpt_dir.mkdir()
    mounts = {"/etc/gmeta": str(tmp_path / "etc-gmeta"), "/ckpt": str(ckpt_dir)}
    run_dir = ckpt_dir / "emu-lost"

    def kill_worker_after_checkpoint_20(pods):
        _kill_after_checkpoint_20(run_dir, pods, f"worker-{killed}")

    def own_status_dir(replica, i):
        return {"GMETA_STATUS_DIR": str(tmp_path / f"pod-{replica}-{i}" / "status")}

    codes, lines = _run_tfjob(configmap, tfjob, tmp_path, mounts, fault=kill_worker_after_checkpoint_20,
                              pod_env=own_status_dir)
    survivor = 1 - killed
    assert codes[killed] in (-signal.SIGKILL, 128 + signal.SIGKILL), (codes, lines[-4000:])
    if killed == 0:
        assert codes[survivor] == exit_codes.CLUSTER_FAULT.code, (codes, lines[-4000:])
        assert "rank 1: worker rank 0 stopped answering in a collective" in lines, lines[-4000:]
        assert "its Gloo rendezvous at 127.0.0.1:" in lines and "refuses connections" in lines, lines[-4000:]
    else:
        assert codes[survivor] == exit_codes.FAILED.code, (codes, lines[-4000:])
        assert "Whether a peer worker was lost cannot be told: no peer's status record is in reach" in lines, \
            lines[-4000:]
    assert "lost ps" not in lines, lines[-4000:]


def test_entrypoint_rejects_missing_or_bad_tf_config(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    r = run_gmeta(["k8s", "entrypoint", "--config", "configs/quickstart.yaml"], timeout=120, env={**env})
    assert r.returncode == 2 and "TF_CONFIG is not set" in r.stderr and "Traceback" not in r.stderr
    r = run_gmeta(["k8s", "entrypoint"], timeout=120, env={"TF_CONFIG": '{"cluster": {}, "task": {"type": "worker"}}'})
    assert r.returncode == 2 and "task.index" in r.stderr and "Traceback" not in r.stderr


# A rank that reaches hvd.init() before worker 0 serves the rendezvous: a TFJob's pods start in any order.
_EARLY_RANK = """
import os, sys
from gmeta_tf.cluster.worker import wait_for_rendezvous
wait_for_rendezvous(dict(os.environ), 60)
import horovod.tensorflow as hvd
hvd.init()
print("size", hvd.size(), flush=True)
"""


def test_a_rank_started_before_the_rendezvous_waits_for_it(tmp_path):
    """Horovod's Gloo store gives up after three refused connections 0.5 s apart and aborts the
    process (http_store.cc); the rank waits for worker 0's rendezvous instead (worker.py)."""
    import subprocess

    from launch.gloo_rendezvous import GlooRendezvous, rank_env

    (port,) = free_ports(1)
    env = {**os.environ, **rank_env(0, ["localhost"], "127.0.0.1", port, "lo")}
    rank = subprocess.Popen([sys.executable, "-c", _EARLY_RANK], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    server = None
    try:
        time.sleep(8)  # the rank imports TF and reaches the rendezvous well before it is served
        assert rank.poll() is None, rank.communicate()[1][-3000:]
        server = GlooRendezvous(["localhost"], port, bind="127.0.0.1").start()
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, err[-3000:]
        assert "size 1" in out
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.communicate()
        if server is not None:
            server.stop()
