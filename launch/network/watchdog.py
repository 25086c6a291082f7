"""A tiny process that removes an emulated network when its owner dies, however it dies.

Why a process and not only ``sweep_stale`` at the next launch: a launcher killed with SIGKILL
runs no teardown; its children get SIGTERM (``PR_SET_PDEATHSIG``), but one blocked in a TF call
may never act on it (the watchdog escalates to SIGKILL for anything left in its hosts), and
named network namespaces are bind mounts under /run/netns and stay until someone deletes them, perhaps forever on a CI
box where no next launch comes. This watchdog is started in its own session (a signal to the
launcher's process group does not reach it), waits on the owner through a pidfd (no polling,
no pid-reuse race), then claims the network's owner lock (free once the owner is gone) and
deletes what the prefix names with the routine every other remover uses (``cleanup.py``), and
exits. On a clean teardown the owner stops it first. Stdlib only, run by file path, so it starts
in ~30 ms and needs no import path (its directory is ``sys.path[0]``: ``cleanup`` is a sibling).
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from typing import List

if __package__:
    from gmeta_tf import exit_codes
    from launch.network import cleanup
else:  # run by path (``start``): this file's directory is sys.path[0]
    import cleanup

    def _exit_codes():
        """The table (gmeta_tf/exit_codes.py, stdlib only) read by path: no import path here."""
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "gmeta_tf", "exit_codes.py")
        spec = importlib.util.spec_from_file_location("_gmeta_exit_codes", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module

    exit_codes = _exit_codes()

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


def main(argv: List[str]) -> int:
    owner, prefix = int(argv[0]), argv[1]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(exit_codes.DONE.code))  # the owner tore down itself
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
    cleanup.remove_owned(prefix)
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
