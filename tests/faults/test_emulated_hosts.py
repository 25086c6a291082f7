"""A job on emulated hosts (launch/emulated_hosts.py): 1 PS + 2 workers, each in its own network
namespace behind a shaped link, started TFJob-style (TF_CONFIG, Gloo rendezvous, no horovodrun).

The network changes timing, not math: with one worker the losses match a loopback ``gmeta launch
local`` of the same config to 1e-5. With two workers no two runs match to 1e-5, loopback ones
included: embedding updates reach the PS asynchronously (docs/architecture.md), so which rows a
worker reads depends on timing. Two loopback runs of this 2-worker config differed by 1e-4 at
step 10 and 1.9e-3 at step 20; the 2-worker case checks the losses to 1e-2 and the ranks'
dense weights bit-identical. Nothing outlives the job: no namespace (also after a kill -9 of the
launcher: its watchdog removes them) and no process (``no_orphans``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_helpers import REFERENCE_STEPS, TINY_SETS

from gmeta_tf.cluster.worker import own_job
from gmeta_tf.errors import ClusterError
from launch.network.netns import list_namespaces, missing_privilege

REPO = Path(__file__).resolve().parents[2]
GMETA = [sys.executable, "-m", "gmeta_tf.cli.main"]

def _launcher(profile, workers, timeout_s):
    """``gmeta launch local --network``: the launcher a user runs, not a test's own."""
    return [*GMETA, "launch", "local", "--network", profile, "--workers", str(workers), "--ps", "1",
            "--timeout", str(timeout_s)]

STEPS = 20
needs_netns = pytest.mark.skipif(missing_privilege() is not None, reason=f"{missing_privilege()}")


def _train_args(tiny_data, run, steps=STEPS):
    return ["--data", str(tiny_data), "--out", str(run), "--steps", str(steps),
            *[a for s in TINY_SETS for a in ("--set", s)]]


def _namespaces_of(pid: int):
    return [n for n in list_namespaces() if n.startswith(f"gm-{pid}-")]


def _losses(run: Path):
    summary = json.loads((run / "train_summary.json").read_text())
    return [(h["step"], h["loss"]) for h in summary["history"]], summary


@pytest.mark.fast
def test_own_job_is_empty_unless_an_address_is_given():
    assert own_job(1, {}) == {}
    assert own_job(1, {"GMETA_WORKER_ADDRESS": "10.77.0.4:2222"}) == {"worker1": ["10.77.0.4:2222"]}
    (addr,) = own_job(0, {"GMETA_WORKER_ADDRESS": "127.0.0.1"})["worker0"]
    assert addr.startswith("127.0.0.1:") and int(addr.rsplit(":", 1)[1]) > 0
    with pytest.raises(ClusterError, match="GMETA_WORKER_ADDRESS='10.0.0.1:x'"):
        own_job(0, {"GMETA_WORKER_ADDRESS": "10.0.0.1:x"})
    with pytest.raises(ClusterError, match="192.0.2.77"):
        own_job(0, {"GMETA_WORKER_ADDRESS": "192.0.2.77"})  # not an address of this host


@needs_netns
@pytest.mark.integration
@pytest.mark.parametrize("workers, tolerance", [(1, 1e-5), (2, 1e-2)])
def test_emulated_link_trains_to_the_loopback_losses(tiny_data, tmp_path, workers, tolerance, request):
    """One worker is compared with the session's loopback reference run (tests/faults/conftest.py),
    so it trains that run's steps; two workers with a loopback run of their own."""
    emu, loop = tmp_path / "emulated", tmp_path / "loopback"
    steps = REFERENCE_STEPS if workers == 1 else STEPS
    # the loopback run's wire: ``cluster.wire_dtype: auto`` would send bfloat16 at 100 Mbit/s
    p = subprocess.Popen([*_launcher("rate=100mbit", workers, 400), *_train_args(tiny_data, emu, steps),
                          "--set", "cluster.wire_dtype=float32"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=500)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out[-4000:]
    assert f"{workers + 1} emulated hosts (rate=100mbit: 100mbit" in out, out[-4000:]
    assert _namespaces_of(p.pid) == []
    if workers == 1:
        loop = request.getfixturevalue("reference_run")
    else:
        r = subprocess.run([*GMETA, "launch", "local", "--workers", str(workers), "--ps", "1", "--timeout", "400",
                            *_train_args(tiny_data, loop)], cwd=REPO, capture_output=True, text=True, timeout=500)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (emu_losses, emu_summary), (loop_losses, loop_summary) = _losses(emu), _losses(loop)
    assert [s for s, _ in emu_losses] == [s for s, _ in loop_losses] == list(range(10, steps + 1, 10))
    for (step, a), (_, b) in zip(emu_losses, loop_losses):
        assert abs(a - b) <= tolerance, (step, a, b)
    assert (emu_summary["ranks"], emu_summary["ps"], emu_summary["last_step"]) == (workers, 1, steps)
    assert (loop_summary["ranks"], loop_summary["ps"]) == (workers, 1)
    print(f"tasks/s (rank 0): emulated {emu_summary['tasks_per_s']:.1f}, loopback {loop_summary['tasks_per_s']:.1f}; "
          f"dense digests {emu_summary['dense_digest']} / {loop_summary['dense_digest']}")
    ranks = [json.loads((emu / "ranks" / f"rank{r}.json").read_text()) for r in range(workers)]
    assert len({r["dense_digest"] for r in ranks}) == 1  # the dense all-reduce crossed the links


@needs_netns
@pytest.mark.integration
def test_launcher_kill_9_leaves_no_namespace(tiny_data, tmp_path):
    run = tmp_path / "run"
    args = _train_args(tiny_data, run)
    args[args.index("--steps") + 1] = "400"
    p = subprocess.Popen([*_launcher("rate=100mbit", 2, 400), *args], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 300
        for line in p.stdout:  # until training is under way on every host
            lines.append(line)
            if "step 10/400" in line or time.monotonic() > deadline:
                break
        assert any("step 10/400" in line for line in lines), "".join(lines[-60:])
        assert len(_namespaces_of(p.pid)) == 4
        os.kill(p.pid, signal.SIGKILL)  # the launcher alone: no teardown runs
        p.wait()
        deadline = time.monotonic() + 15
        while _namespaces_of(p.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _namespaces_of(p.pid) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for n in _namespaces_of(p.pid):
            subprocess.run(["ip", "netns", "del", n])
