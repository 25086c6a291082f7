"""CPU seconds of a command's whole process tree, by what each process runs.

``python -m bench.proc_cpu [--every S] -- CMD ...`` runs ``CMD``, samples every process's
cumulative user + system time from ``/proc`` every ``S`` seconds (0.5) and, once it exits, prints
the tree's CPU seconds grouped by command (module or program) with the process counts; its exit
status is ``CMD``'s.

Why: the bench smoke is CPU-bound on 2 cores, and its cost is spread over ~200 short processes
(ranks, PS, launchers) that ``/usr/bin/time`` sums without saying which; this says which kind of
process the seconds went to. A process is counted up to its last sample, so one that lives less
than ``S`` is missed or undercounted (the figures are lower bounds).
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from typing import Dict, Iterable, Tuple

from gmeta_tf import exit_codes

_HZ = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> Tuple[int, float, int]:
    """``(ppid, cpu seconds, start ticks)`` of one process (fields after the command's ``)``)."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _HZ, int(fields[19])


def _kind(cmdline: bytes) -> str:
    """``-m module`` for Python modules, else the program's name."""
    argv = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    if "-m" in argv[:-1]:
        return "-m " + argv[argv.index("-m") + 1]
    return os.path.basename(argv[0]) if argv else "?"


def sample(root: int, seen: Dict[Tuple[int, int], list]) -> None:
    """One pass over ``/proc``: every descendant of ``root`` (by parent links) updated in ``seen``."""
    parents, info = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid, cpu, start = _stat(pid)
            parents[int(pid)] = ppid
            info[int(pid)] = (cpu, start)
        except (OSError, ValueError, IndexError):
            continue
    for pid, (cpu, start) in info.items():
        p, hops = pid, 0
        while p not in (0, 1, root) and hops < 64:
            p, hops = parents.get(p, 0), hops + 1
        if p != root and pid != root:
            continue
        key = (pid, start)
        try:  # read again each pass: a child first seen between fork and exec has its parent's
            with open(f"/proc/{pid}/cmdline", "rb") as f:  # command line until it execs
                cmdline = f.read()
        except OSError:
            cmdline = b""
        if not cmdline and key not in seen:
            continue
        kind = _kind(cmdline) if cmdline else seen[key][0]  # (a zombie's is empty: keep its name)
        seen[key] = [kind, cpu]


def table(seen: Iterable[list]) -> str:
    cpu, n = collections.Counter(), collections.Counter()
    for kind, s in seen:
        cpu[kind] += s
        n[kind] += 1
    lines = [f"{s:9.1f} CPU-s {n[k]:5d} processes  {k}" for k, s in cpu.most_common()]
    return "\n".join(lines + [f"{sum(cpu.values()):9.1f} CPU-s {sum(n.values()):5d} processes  in all"])


def main(argv) -> int:
    every = 0.5
    if argv[:1] == ["--every"]:
        every, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return exit_codes.USER_ERROR.code
    proc = subprocess.Popen(argv)
    seen: Dict[Tuple[int, int], list] = {}
    while proc.poll() is None:
        sample(proc.pid, seen)
        time.sleep(every)
    print(table(seen.values()), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
