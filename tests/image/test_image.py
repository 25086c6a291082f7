"""The container image of ``make image``, started with podman: what it computes, not that it ran.

``make image-test`` runs this module with ``GMETA_TEST_IMAGE`` naming the image; without it every
test here is skipped (``make test`` builds no image). The tests run in order and share one
directory, mounted at ``/work`` in every container: the demo's prepared data feeds the
distributed run, whose checkpoint is exported, and the export is served.

* the commands the rendered TFJob and InferenceService run exist in the image and answer, as the
  numeric non-root user the TFJob's ``fsGroup`` names; no compiler is left; every shared library
  of the venv resolves; the installed versions are requirements.txt's and the Makefile's Horovod;
* ``gmeta demo`` writes its AUC table, and the printed table matches ``demo_summary.json``;
* ``gmeta ps serve`` in one container, a 1-worker ``gmeta launch local`` in another: the trained
  tables' rows are on that PS task, and the PS exits 0 on SIGTERM as PID 1;
* the rendered TFJob's PS and Worker commands, env and ConfigMap train with ``TF_CONFIG`` in the
  image, and the worker, as PID 1, exits at once on SIGTERM;
* ``gmeta export``, then the InferenceService's own container command (port 8080, the model at
  /mnt/models) answers a predict request from the host with the scores the SavedModel computes
  in the container.

Every container gets a name with this run's prefix and is removed at the end, pass or fail;
every podman call has a time-out; ports are picked free.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("GMETA_TEST_IMAGE", "")
PODMAN = os.environ.get("GMETA_PODMAN", str(ROOT / "launch" / "image" / "podman.sh"))
HERE = Path(__file__).resolve().parent
STEPS = 30

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(not IMAGE, reason="make image-test runs these (GMETA_TEST_IMAGE=IMAGE); make test builds no image"),
]


def podman(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    try:
        got = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"podman {shlex.join(args[:3])} ... still running after {timeout:.0f} s:\n"
                             f"{(e.stdout or b'')[-3000:]!r}") from None
    if check and got.returncode != 0:
        raise AssertionError(f"podman {shlex.join(args)} exited {got.returncode}:\n{got.stdout[-4000:]}\n{got.stderr[-4000:]}")
    return got


class Box:
    """One directory shared by the containers of this run, and the containers' names."""

    def __init__(self, work: Path):
        self.work = work
        self.prefix = f"gmeta-image-test-{uuid.uuid4().hex[:8]}"
        self.names: list[str] = []

    def name(self, role: str) -> str:
        self.names.append(f"{self.prefix}-{role}")
        return self.names[-1]

    def run(self, role: str, argv, *, timeout: float, options=(), check: bool = True) -> subprocess.CompletedProcess:
        """``argv`` in a new container (removed when it ends) with /work and /tests mounted."""
        return podman("run", "--rm", "--name", self.name(role), *self.mounts(), *options, IMAGE, *argv,
                      timeout=timeout, check=check)

    def start(self, role: str, argv, *, options=()) -> str:
        name = self.name(role)
        podman("run", "-d", "--name", name, *self.mounts(), *options, IMAGE, *argv, timeout=60)
        return name

    def mounts(self):
        return ["-v", f"{self.work}:/work", "-v", f"{HERE}:/tests:ro"]

    def cleanup(self) -> None:
        for name in self.names:
            podman("rm", "-f", "-t", "0", name, timeout=60, check=False)


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    got = podman("image", "exists", IMAGE, check=False, timeout=30)
    assert got.returncode == 0, f"no image {IMAGE}: run make image first"
    work = tmp_path_factory.mktemp("image")
    work.chmod(0o777)  # the image runs as uid 1000
    b = Box(work)
    yield b
    b.cleanup()
    left = podman("ps", "-a", "--filter", f"name={b.prefix}", "--format", "{{.Names}}", check=False).stdout.split()
    assert not left, f"containers left behind: {left}"


def free_ports(n: int):
    from launch.local_cluster import free_ports as pick

    return pick(n)


def wait_http(url: str, container: str, timeout: float) -> None:
    """Until ``url`` answers 200; fail with the container's log if it exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        state = podman("inspect", "--format", "{{.State.Running}}", container, check=False).stdout.strip()
        if state != "true":
            logs = podman("logs", container, check=False)
            raise AssertionError(f"{container} stopped before {url} answered:\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {timeout:.0f} s")


def stop(container: str, grace: int = 20) -> int:
    podman("stop", "-t", str(grace), container, timeout=grace + 30)
    return int(podman("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip())


def manifests():
    """The TFJob and InferenceService as `gmeta k8s render` / `render-serving` write them for IMAGE."""
    from gmeta_tf.config.loader import load_config
    from launch.isvc_render import render_inference_service
    from launch.k8s_render import render_manifests

    cfg = load_config(str(ROOT / "configs" / "quickstart.yaml"))
    _, tfjob = render_manifests(cfg, image=IMAGE, workers=2, ps=1, checkpoint_pvc="gmeta-ckpt", name="image-test")
    isvc = render_inference_service(name="recs", image=IMAGE, model_uri="pvc://gmeta-ckpt/exports/recs")
    return tfjob, isvc


def _pins(text: str):
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731  (PEP 503 names)
    out = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[norm(name)] = version.strip()
    return out


def test_manifest_commands_run_in_the_image_as_its_user(box):
    tfjob, isvc = manifests()
    pods = [spec["template"]["spec"] for spec in tfjob["spec"]["tfReplicaSpecs"].values()]
    commands = [c["command"] for pod in pods for c in pod["containers"]]
    commands += [c["command"] for c in isvc["spec"]["predictor"]["containers"]]
    programs = sorted({c[0] for c in commands})
    facts = json.loads(box.run("facts", ["python", "/tests/in_container.py", "facts", *programs, "horovodrun"],
                               timeout=180).stdout)
    for program in programs:
        assert facts["which"][program] == f"/opt/gmeta/bin/{program}", facts["which"]
        assert program in facts["console_scripts"]
    # Each rendered command, cut before its first option, answers --help: the sub-commands exist.
    helps = " && ".join(shlex.join([*c[: next(i for i, a in enumerate(c) if a.startswith("--"))], "--help"])
                        + " >/dev/null" for c in commands)
    box.run("help", ["bash", "-c", helps], timeout=180)
    # The TFJob's pods write the checkpoint volume through fsGroup: it must be the image's group.
    assert facts["uid"] == 1000 and facts["gid"] == 1000
    assert {pod["securityContext"]["fsGroup"] for pod in pods} == {facts["gid"]}
    assert facts["which"]["horovodrun"] == "/opt/gmeta/bin/horovodrun"
    assert facts["compilers"] == {c: None for c in facts["compilers"]}, "build tools left in the runtime image"
    assert facts["unresolved_libraries"] == {}
    assert facts["python"].startswith("3.11.")
    installed = _pins("\n".join(facts["distributions"]))
    wanted = _pins((ROOT / "requirements.txt").read_text())
    assert {k: installed.get(k) for k in wanted} == wanted
    horovod = re.search(r"^HOROVOD_VERSION := (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert installed["horovod"] == horovod


def test_demo_writes_its_auc_table(box):
    got = box.run("demo", ["gmeta", "demo", "--tasks", "300", "--out", "/work/demo", "--set", f"train.steps={STEPS}",
                           "--set", "train.log_every=10", "--set", f"train.checkpoint_every={STEPS}"], timeout=900)
    summary = json.loads((box.work / "demo" / "demo_summary.json").read_text())
    assert set(summary) == {"maml", "erm"}
    for algo, result in summary.items():
        assert 0.0 < result["auc"] < 1.0 and math.isfinite(result["logloss"]), result
        assert json.loads((box.work / "demo" / algo / "eval.json").read_text())["auc"] == result["auc"]
    # the table it prints is the one of the summary
    row = next(line.split() for line in got.stdout.splitlines() if line.startswith("auc "))
    assert row[1:3] == [f"{summary['maml']['auc']:.4f}", f"{summary['erm']['auc']:.4f}"], got.stdout[-2000:]


def test_ps_serve_and_launch_local_train_on_that_ps(box):
    grpc, health = free_ports(2)
    ps = box.start("ps", ["gmeta", "ps", "serve", "--ps-hosts", f"127.0.0.1:{grpc}", "--index", "0",
                          "--health-port", str(health)], options=["--network", "host"])
    wait_http(f"http://127.0.0.1:{health}/ready", ps, timeout=180)
    got = box.run("launch", ["gmeta", "launch", "local", "--workers", "1", "--ps", "0", "--timeout", "600",
                             "--data", "/work/demo/data/prepared", "--out", "/work/dist", "--steps", str(STEPS),
                             "--set", f"cluster.ps=[127.0.0.1:{grpc}]"],
                  options=["--network", "host"], timeout=900)
    assert "[launch] done: 1 worker(s), 0 PS" in got.stdout, got.stdout[-3000:]
    summary = json.loads((box.work / "dist" / "train_summary.json").read_text())
    assert summary["ranks"] == 1 and summary["last_step"] == STEPS
    assert summary["ps"] == 1
    assert yaml.safe_load((box.work / "dist" / "config.yaml").read_text())["cluster"]["ps"] == [f"127.0.0.1:{grpc}"]
    rows = summary["table_rows_by_ps_task"]  # {table: {ps task: rows}}, read on the PS
    assert rows and all(set(by_task) == {"0"} and by_task["0"] > 0 for by_task in rows.values()), rows
    losses = [h["loss"] for h in summary["history"]]
    assert losses and all(math.isfinite(x) for x in losses)
    # PID 1 in its container: SIGTERM must reach the PS's handler; it exits with SIGTERM's code.
    assert stop(ps) == 143
    assert "shutting down" in podman("logs", ps).stderr + podman("logs", ps).stdout


def test_rendered_tfjob_pods_train_with_the_images_entrypoint(box):
    """The TFJob's PS and Worker containers as the training operator starts them: the rendered
    command, env and ConfigMap, plus TF_CONFIG. On the host network the services are loopback
    ports, so the ports and the Gloo interface are the only values changed (as in
    tests/test_tfjob_emulation.py); a pod has its own eth0 and ports."""
    from gmeta_tf.config.loader import load_config
    from launch.k8s_render import render_manifests

    cfg = load_config(str(ROOT / "configs" / "quickstart.yaml"), [f"train.steps={STEPS}", "train.log_every=5"])
    configmap, tfjob = render_manifests(cfg, image=IMAGE, workers=1, ps=1, checkpoint_pvc="gmeta-ckpt",
                                        data="/ckpt/demo/data/prepared", name="tfjob")
    config_dir = box.work / "etc-gmeta"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text(configmap["data"]["config.yaml"])
    grpc_ps, grpc_worker, health, rendezvous = free_ports(4)
    cluster = {"ps": [f"127.0.0.1:{grpc_ps}"], "worker": [f"127.0.0.1:{grpc_worker}"]}
    ports = {"GMETA_HEALTH_PORT": str(health), "GMETA_RENDEZVOUS_PORT": str(rendezvous), "GMETA_GLOO_IFACE": "lo"}

    def pod(role):
        (container,) = tfjob["spec"]["tfReplicaSpecs"][role]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]} | ports
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": role.lower(), "index": 0}})
        options = ["--network", "host", "-v", f"{box.work}:/ckpt", "-v", f"{config_dir}:/etc/gmeta:ro"]
        return container["command"], [*options, *(a for k, v in env.items() for a in ("-e", f"{k}={v}"))]

    command, options = pod("PS")
    ps = box.start("tfjob-ps", command, options=options)
    wait_http(f"http://127.0.0.1:{health}/ready", ps, timeout=180)
    command, options = pod("Worker")
    got = box.run("tfjob-worker", command, options=options, timeout=900)
    assert f"trained maml to step {STEPS} over 1 worker(s); run directory /ckpt/tfjob" in got.stdout, got.stdout[-3000:]
    summary = json.loads((box.work / "tfjob" / "train_summary.json").read_text())
    assert summary["last_step"] == STEPS and summary["ps"] == 1
    assert all(by_task.get("0", 0) > 0 for by_task in summary["table_rows_by_ps_task"].values())
    # A pod being deleted: the kubelet's SIGTERM reaches the worker (PID 1) and it exits at once
    # as terminated (143), not after the grace period as SIGKILLed (137).
    worker = box.start("tfjob-worker-again", [*command, "--steps", "100000"], options=options)
    deadline = time.monotonic() + 300
    while f"step {STEPS + 5}/" not in podman("logs", worker, check=False).stdout:
        assert time.monotonic() < deadline, podman("logs", worker, check=False).stdout[-3000:]
        time.sleep(2)
    t0 = time.monotonic()
    assert stop(worker, grace=60) == 143
    assert time.monotonic() - t0 < 30
    assert stop(ps) == 0


def test_served_export_answers_with_the_exports_own_scores(box):
    got = box.run("export", ["gmeta", "export", "--run", "/work/dist", "--out", "/work/export"], timeout=600)
    assert f"exported step {STEPS} of /work/dist" in got.stdout, got.stdout
    box.run("score", ["python", "/tests/in_container.py", "score", "/work/export", "/work/score.json"], timeout=300)
    expected = json.loads((box.work / "score.json").read_text())
    _, isvc = manifests()
    container = isvc["spec"]["predictor"]["containers"][0]
    port = container["ports"][0]["containerPort"]
    ready = container["readinessProbe"]["httpGet"]["path"]
    name = re.match(r"/v2/models/([^/]+)/ready", ready).group(1)
    (host_port,) = free_ports(1)
    env = [a for k, v in ((e["name"], e["value"]) for e in container["env"]) for a in ("-e", f"{k}={v}")]
    serve = box.start("serve", container["command"], options=[
        "--network", "slirp4netns", "-p", f"127.0.0.1:{host_port}:{port}",
        "-v", f"{box.work / 'export'}:/mnt/models:ro", *env])
    wait_http(f"http://127.0.0.1:{host_port}{ready}", serve, timeout=180)
    body = json.dumps(expected["request"]).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{host_port}/v1/models/{name}:predict", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{e.code} from gmeta serve: {e.read()[:2000]!r}\nrequest: {body[:1000]!r}") from None
    assert answer["outputs"] == pytest.approx(expected["scores"], rel=1e-6, abs=1e-7)
    assert len(set(round(s, 6) for s in expected["scores"])) > 1, "every row scored the same: a weak check"
    assert stop(serve) == 0
