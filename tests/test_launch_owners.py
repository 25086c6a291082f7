"""The launcher's single owners (issue 53, item 2): one PS readiness wait for both ways a PS says
it is ready, one spelling of each pod variable, one refusal of ``--no-resume`` on emulated hosts.
Real child processes only (a Python that sleeps or exits), no PS: the tier stays fast."""
from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

import pytest

from gmeta_tf.errors import ClusterError
from launch import ps_lifecycle, tfjob_ports
from launch.emulated_hosts import entrypoint_args, host_names, ps_host, worker_host
from launch.outcomes import LaunchStopped
from launch.processes import end_children, spawn_child

REPO = Path(__file__).resolve().parents[1]
_SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _child(argv):
    return spawn_child("ps:0 (127.0.0.1:1)", argv, {}, lambda m: None, threading.Lock())


def test_the_one_readiness_wait_returns_once_a_ps_wrote_its_ready_file(tmp_path):
    ready = tmp_path / "ps0.ready"
    child = _child([sys.executable, "-c", f"import time; time.sleep(0.5); open({str(ready)!r}, 'w').close(); "
                                          "time.sleep(60)"])
    try:
        ps_lifecycle.wait_ready([(child, ps_lifecycle.file_probe(str(ready)))], 30, lambda: [])
        assert ready.exists() and child.proc.poll() is None
    finally:
        end_children([child], 2.0)


def test_the_one_readiness_wait_names_a_ps_that_died_before_it_was_ready():
    child = _child([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        with pytest.raises(ClusterError, match=r"^ps:0 \(127\.0\.0\.1:1\) exited with code 3 before it was ready$"):
            ps_lifecycle.wait_ready([(child, ps_lifecycle.http_probe("http://127.0.0.1:9/ready"))], 30, lambda: [])
    finally:
        end_children([child], 2.0)


def test_the_one_readiness_wait_ends_at_its_deadline_or_a_stop_signal():
    child = _child(_SLEEPER)
    try:
        with pytest.raises(ClusterError, match=r"not ready after 0 s"):
            ps_lifecycle.wait_ready([(child, lambda: False)], 0.3, lambda: [])
        with pytest.raises(LaunchStopped) as stopped:
            ps_lifecycle.wait_ready([(child, lambda: False)], 30, lambda: [15])
        assert stopped.value.signum == 15
    finally:
        end_children([child], 2.0)
    assert child.proc.returncode is not None


@pytest.mark.fast
def test_no_resume_is_refused_by_one_owner_and_resume_is_what_the_entrypoint_does_anyway():
    assert entrypoint_args(["--out", "r", "--resume", "--steps", "3"]) == ["--out", "r", "--steps", "3"]
    with pytest.raises(ClusterError, match="--no-resume cannot be honoured with --network"):
        entrypoint_args(["--out", "r", "--no-resume"])


@pytest.mark.fast
def test_launch_local_refuses_no_resume_on_emulated_hosts_before_anything_starts(tmp_path):
    from launch.supervisor import launch_local

    with pytest.raises(ClusterError, match="--no-resume cannot be honoured with --network"):
        launch_local(1, 1, ["--out", str(tmp_path / "run"), "--no-resume"], network="rate=100mbit", log=lambda m: None)
    assert not list(tmp_path.iterdir())


@pytest.mark.fast
def test_host_names_come_from_one_owner():
    assert host_names(2, 1) == [ps_host(0), worker_host(0), worker_host(1)] == ["ps0", "worker0", "worker1"]


def _string_constants(path: Path):
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings:
            yield n.lineno, n.value


@pytest.mark.fast
def test_each_pod_variable_is_spelled_in_launch_tfjob_ports_alone():
    names = {tfjob_ports.RENDEZVOUS_PORT_ENV, tfjob_ports.HEALTH_PORT_ENV, tfjob_ports.GLOO_IFACE_ENV}
    owner = REPO / "launch" / "tfjob_ports.py"
    found = [f"{p.relative_to(REPO)}:{line}" for folder in ("launch", "gmeta_tf", "ps", "bench")
             for p in sorted((REPO / folder).rglob("*.py")) if p != owner
             for line, text in _string_constants(p) if text in names]
    assert found == []
