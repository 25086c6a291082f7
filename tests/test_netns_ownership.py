"""Network clean-up that only removes what is provably dead (issue 42, item 4).

An emulated network belongs to whoever holds its owner lock (``launch/network/cleanup.py``), not
to the pid in its name: a launcher in another pid namespace sharing /run/netns has a pid the
sweeper cannot see, and used to lose its hosts to ``sweep_stale`` mid-run.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from launch.network import cleanup
from launch.network.netns import missing_privilege

needs_netns = pytest.mark.skipif(missing_privilege() is not None, reason=f"{missing_privilege()}")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def owner_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(cleanup, "OWNER_DIR", str(tmp_path / "owners"))
    return tmp_path / "owners"


@pytest.mark.fast
def test_a_held_lock_cannot_be_claimed_a_released_one_can(owner_dir):
    prefix = f"gm-{_dead_pid()}-0123abcd-"
    held = cleanup.OwnerLock.hold(prefix)
    assert cleanup.OwnerLock.claim(prefix) is None  # held (here, by this process: another descriptor)
    os.close(held._fd)  # the owner dies: the kernel drops its lock, the file stays
    held._fd = None
    claimed = cleanup.OwnerLock.claim(prefix)
    assert claimed is not None
    assert cleanup.OwnerLock.claim(prefix) is None  # one sweeper at a time
    claimed.release()
    assert not (owner_dir / f"{prefix}lock").exists()
    assert cleanup.OwnerLock.claim(prefix) is None  # no file: no proof the owner is gone


@pytest.mark.fast
def test_namespace_names_parse_without_a_regex():
    assert cleanup.prefix_of("gm-123-0a1b2c3d-worker0") == "gm-123-0a1b2c3d-"
    assert cleanup.prefix_of("gm-123-0a1b2c3d-0br") == "gm-123-0a1b2c3d-"
    for other in ("gm-x-0a1b-ps0", "gm-1-XYZ-ps0", "gm-1-ab", "cni-1234", "gm-1-ab-ps0-extra"):
        assert cleanup.prefix_of(other) is None, other


@pytest.mark.fast
def test_sweep_keeps_what_a_live_owner_holds_and_what_has_no_owner_lock(owner_dir, monkeypatch):
    """The pids in the names are dead to this process; only the locks decide."""
    from launch.network import netns

    live, gone, unknown = (f"gm-{_dead_pid()}-{i}a{i}a-" for i in range(3))
    names = [live + "0br", live + "ps0", gone + "0br", gone + "worker0", unknown + "ps0"]
    monkeypatch.setattr(cleanup, "list_namespaces", lambda: list(names))
    deleted = []
    monkeypatch.setattr(cleanup, "delete_namespaces", lambda ns, grace_s=5.0: deleted.extend(ns) or [])
    holder = cleanup.OwnerLock.hold(live)  # a launcher in another pid namespace, alive
    dead = cleanup.OwnerLock.hold(gone)
    os.close(dead._fd)  # a launcher killed with SIGKILL
    try:
        removed = netns.sweep_stale()
    finally:
        holder.release()
    assert sorted(removed) == sorted(deleted) == [gone + "0br", gone + "worker0"]
    assert not (owner_dir / f"{gone}lock").exists()


@needs_netns
@pytest.mark.integration  # real namespaces (root)
def test_a_network_whose_owner_pid_is_invisible_but_whose_lock_is_held_survives_sweep_stale():
    """The issue's case: the owner runs in another pid namespace, so its pid looks dead here.
    Simulated: this process builds and holds the network under a pid that does not exist."""
    from launch.network.netns import EmulatedNetwork, list_namespaces, sweep_stale
    from launch.network.profile import parse_profile

    net = EmulatedNetwork(["a", "b"], parse_profile("rate=1gbit"), owner_pid=_dead_pid(), watchdog_process=False)
    with net:
        ours = sorted(net.namespaces())
        assert sorted(n for n in list_namespaces() if n.startswith(net.prefix)) == ours
        assert not [n for n in sweep_stale() if n.startswith(net.prefix)]
        assert sorted(n for n in list_namespaces() if n.startswith(net.prefix)) == ours  # still there
        assert os.path.exists(cleanup.lock_path(net.prefix))
    assert not [n for n in list_namespaces() if n.startswith(net.prefix)]
    assert not os.path.exists(cleanup.lock_path(net.prefix))  # the owner's teardown removed its lock
