"""Who owns an emulated network, and the one routine that deletes one.

Ownership is a lock, not a pid. The launcher that builds a network holds an exclusive ``flock``
on ``/run/gmeta-netns/<prefix>lock`` (the prefix ``gm-<pid>-<id>-`` of its namespaces) for as
long as the network lives; the kernel releases it when that process exits, however it exits.
Whoever wants to remove the network (the watchdog after its owner died, ``sweep_stale`` at the
next launch, a test) must take that lock first: taking it proves the owner is gone, and holding
it while deleting keeps two sweepers apart. A pid says much less: a launcher in another pid
namespace that shares /run/netns (a second container, a CI job's sandbox) has a pid this process
cannot see, and a pid is reused. A namespace with no lock file (made by hand, or by a version
that took none) is not provably dead and is left alone.

Standard library only: the watchdog (``watchdog.py``) runs this file's sibling by path and
imports it in a process that must start in milliseconds.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import subprocess
import time
from typing import List, Optional

OWNER_DIR = "/run/gmeta-netns"
ETC_NETNS = "/etc/netns"  # `ip netns exec NS` bind-mounts /etc/netns/NS/* over /etc/*


def lock_path(prefix: str) -> str:
    return os.path.join(OWNER_DIR, f"{prefix}lock")


class OwnerLock:
    """An exclusive ``flock`` on a network's lock file, held by an open descriptor (not inherited
    by children: Python opens it close-on-exec)."""

    def __init__(self, prefix: str, fd: int):
        self.prefix = prefix
        self._fd: Optional[int] = fd

    @classmethod
    def hold(cls, prefix: str) -> "OwnerLock":
        """The owner's lock, taken before the first namespace exists. A sweeper may remove the
        file between our open and our flock (it found it unlocked); then the lock we hold is on
        a file nobody can find, so we open the path again."""
        os.makedirs(OWNER_DIR, mode=0o755, exist_ok=True)
        while True:
            fd = os.open(lock_path(prefix), os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh network id: nobody else has it
            try:
                if os.fstat(fd).st_ino == os.stat(lock_path(prefix)).st_ino:
                    return cls(prefix, fd)
            except FileNotFoundError:
                pass
            os.close(fd)

    @classmethod
    def claim(cls, prefix: str) -> Optional["OwnerLock"]:
        """The lock of a network whose owner is gone, or None: the owner holds it (alive, in
        whatever pid namespace), or there is no lock file (no proof either way)."""
        try:
            fd = os.open(lock_path(prefix), os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path(prefix)).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # another sweeper removed it meanwhile: the network is theirs to delete
            os.close(fd)
            return None
        return cls(prefix, fd)

    def release(self, keep_file: bool = False) -> None:
        """The network is deleted: remove the lock file, then let go of it. ``keep_file``: some of
        it is left, so the file stays for the next sweep to claim."""
        if self._fd is None:
            return
        if not keep_file:
            try:
                os.remove(lock_path(self.prefix))
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None


def list_namespaces() -> List[str]:
    """Every named network namespace (``ip -j netns list``: JSON, nothing to parse by hand)."""
    import json

    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [ns["name"] for ns in json.loads(out)] if out.strip() else []


def prefix_of(name: str) -> Optional[str]:
    """``gm-<pid>-<id>-`` of a namespace (or /etc/netns entry) an EmulatedNetwork made, else None."""
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "gm" or not parts[1].isdigit() or not parts[3]:
        return None
    if not parts[2] or any(c not in "0123456789abcdef" for c in parts[2]):
        return None
    return "-".join(parts[:3]) + "-"


def kill_inside(names: List[str], grace_s: float = 5.0) -> List[int]:
    """SIGTERM every process still inside these namespaces, SIGKILL what is left after
    ``grace_s``. A trainer blocked in a TF or Gloo call cannot run its SIGTERM handler, and with
    its launcher gone nobody else would escalate (a kubelet would, after its grace period)."""
    def pids() -> List[int]:
        found = []
        for name in names:
            out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
            found += [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]
        return found

    first = pids()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)
    return first


def delete_namespaces(names: List[str], grace_s: float = 5.0) -> List[str]:
    """The one deletion routine (an owner's teardown, the watchdog, a sweep): stop what runs
    inside, delete each namespace (one already gone counts as deleted) and its /etc/netns
    entry. Returns one line per namespace that could not be deleted."""
    kill_inside(names, grace_s)
    errors = []
    for name in names:
        r = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, timeout=30)
        if r.returncode != 0 and name in list_namespaces():
            errors.append(f"`ip netns del {name}` failed (exit {r.returncode}): "
                          f"{(r.stderr or r.stdout).strip() or 'no message'}")
        shutil.rmtree(os.path.join(ETC_NETNS, name), ignore_errors=True)
    return errors


def remove_owned(prefix: str, grace_s: float = 5.0) -> List[str]:
    """Delete every namespace and /etc/netns entry of ``prefix`` whose owner is provably gone
    (``OwnerLock.claim``); nothing when it is not. Returns the namespaces deleted."""
    lock = OwnerLock.claim(prefix)
    if lock is None:
        return []
    names: List[str] = []
    errors = ["interrupted"]
    try:
        names = [n for n in list_namespaces() if n.startswith(prefix)]
        errors = delete_namespaces(names, grace_s)
        for name in os.listdir(ETC_NETNS) if os.path.isdir(ETC_NETNS) else []:
            if name.startswith(prefix):  # a hosts file whose namespace was already gone
                shutil.rmtree(os.path.join(ETC_NETNS, name), ignore_errors=True)
    finally:
        lock.release(keep_file=bool(errors))
    return names
