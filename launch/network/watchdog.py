"""A tiny process that removes an emulated network when its owner dies, however it dies.

Why a process and not only ``sweep_stale`` at the next launch: a launcher killed with SIGKILL
runs no teardown; its children get SIGTERM (``PR_SET_PDEATHSIG``), but one blocked in a TF call
may never act on it (the watchdog escalates to SIGKILL for anything left in its hosts), and
named network namespaces are bind mounts under /run/netns and stay until someone deletes them, perhaps forever on a CI
box where no next launch comes. This watchdog is started in its own session (a signal to the
launcher's process group does not reach it), waits on the owner through a pidfd (no polling,
no pid-reuse race), then deletes every namespace whose name starts with the network's prefix
and exits. On a clean teardown the owner stops it first. Stdlib only, run by file path, so it
starts in ~30 ms and needs no import path.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import List

_READY = b"ready\n"


def start(owner_pid: int, prefix: str) -> subprocess.Popen:
    """Start the watchdog for ``owner_pid``'s namespaces ``prefix*``; returns once it watches."""
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(owner_pid), prefix],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)
    line = proc.stdout.readline()
    if line != _READY:
        proc.kill()
        proc.wait()
        from gmeta_tf.errors import NetworkEmulationError

        raise NetworkEmulationError(f"the network watchdog ({__file__}) did not start: {line!r}")
    proc.stdout.close()
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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


def remove_namespaces(prefix: str) -> List[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]
    kill_inside(names)
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for name in os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []:
        if name.startswith(prefix):  # the per-host /etc/hosts (netns.py ETC_NETNS)
            shutil.rmtree(os.path.join("/etc/netns", name), ignore_errors=True)
    return names


def main(argv: List[str]) -> int:
    owner, prefix = int(argv[0]), argv[1]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the owner tore down itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the terminal is the owner's to handle
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        fd = None  # already gone: clean up at once
    sys.stdout.buffer.write(_READY)
    sys.stdout.buffer.flush()
    if fd is not None:
        select.select([fd], [], [])  # readable once the owner has exited
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the cleanup once begun
    remove_namespaces(prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
