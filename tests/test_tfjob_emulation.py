"""A rendered TFJob, run for real on one machine: every replica it describes becomes a process.

Each process gets what the training operator would give that pod — ``TF_CONFIG`` (cluster +
task), the container's env and command — with service addresses mapped to loopback ports and
the ConfigMap / checkpoint volume mapped to local directories. No ``horovodrun``: workers form
the Horovod ring through the Gloo rendezvous worker 0 hosts, as in the cluster.
"""
import json
import os
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import free_ports, rank_summaries, run_gmeta

from gmeta_tf.config.loader import load_config
from gmeta_tf.evaluation.evaluate import evaluate
from gmeta_tf.train.trainer import load_trained
from launch.k8s_render import render_manifests, validate_tfjob
from launch.local_cluster import LocalCluster
from ps.server import wait_ready

AUC_TOLERANCE = 0.03  # emulated TFJob against `gmeta launch local`, same shape and steps
STEPS = 150


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


def test_rendered_tfjob_trains_like_launch_local(data_dir, tmp_path):
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data_dir}", f"train.steps={STEPS}",
                                                  "data.tasks_per_batch=16", "train.log_every=50"])
    configmap, tfjob = render_manifests(cfg, image="gmeta-tf:test", workers=2, ps=2, gpus_per_worker=0,
                                        name="emu", checkpoint_pvc="ckpt", data=str(data_dir))
    validate_tfjob(tfjob)
    conf_dir, ckpt_dir = tmp_path / "etc-gmeta", tmp_path / "ckpt"
    conf_dir.mkdir()
    ckpt_dir.mkdir()
    for key, text in configmap["data"].items():
        (conf_dir / key).write_text(text)
    mounts = {"/etc/gmeta": str(conf_dir), "/ckpt": str(ckpt_dir)}

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
                cluster.env.update(env)
                argv = _local_argv([*container["command"], *container.get("args", [])], mounts)
                pods.append(cluster.spawn(f"{replica}-{i}", argv, prefix=f"{replica}{i}"))
                if replica == "ps":
                    wait_ready(f"http://127.0.0.1:{health_ports[i]}/ready", 120, pods[-1].proc)
        workers = [p for p in pods if p.name.startswith("worker")]
        deadline = time.monotonic() + 500
        codes = [w.proc.wait(timeout=max(1.0, deadline - time.monotonic())) for w in workers]
        lines = "\n".join(line for p in pods for line in p.lines)
    finally:
        cluster.teardown()
    assert codes == [0, 0], lines[-4000:]
    (run_dir,) = [p for p in ckpt_dir.iterdir() if p.is_dir()]
    ranks = rank_summaries(run_dir)
    assert sorted(ranks) == [0, 1] and ranks[0]["dense_digest"] == ranks[1]["dense_digest"]

    local = tmp_path / "local"
    r = run_gmeta(["launch", "local", "--workers", "2", "--ps", "2", "--config", str(conf_dir / "config.yaml"),
                   "--out", str(local), "--timeout", "500"], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert abs(_auc(run_dir) - _auc(local)) <= AUC_TOLERANCE


def test_entrypoint_rejects_missing_or_bad_tf_config(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    r = run_gmeta(["k8s", "entrypoint", "--config", "configs/quickstart.yaml"], timeout=120, env={**env})
    assert r.returncode == 2 and "TF_CONFIG is not set" in r.stderr and "Traceback" not in r.stderr
    r = run_gmeta(["k8s", "entrypoint"], timeout=120, env={"TF_CONFIG": '{"cluster": {}, "task": {"type": "worker"}}'})
    assert r.returncode == 2 and "task.index" in r.stderr and "Traceback" not in r.stderr
