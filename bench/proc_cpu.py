"""CPU seconds of a command's whole process tree, by what each process runs.

``python -m bench.proc_cpu [--every S] -- CMD ...`` runs ``CMD``, samples every process's
cumulative user + system time (psutil) every ``S`` seconds (0.5) and, once it exits, prints
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
from typing import Dict, Iterable, List, Tuple

import psutil

from gmeta_tf import exit_codes


def _kind(argv: List[str]) -> str:
    """``-m module`` for Python modules, else the program's name."""
    if "-m" in argv[:-1]:
        return "-m " + argv[argv.index("-m") + 1]
    return os.path.basename(argv[0])


def sample(root: int, seen: Dict[Tuple[int, float], list]) -> None:
    """One pass over ``root``'s process tree: each process's CPU seconds so far in ``seen``, keyed
    by (pid, start time). Its command line is read again on every pass: a child first seen
    between fork and exec still shows its parent's, and a zombie's is gone (it keeps its name)."""
    try:
        top = psutil.Process(root)
        tree = [top] + top.children(recursive=True)
    except psutil.Error:
        return
    for p in tree:
        try:
            key, t = (p.pid, p.create_time()), p.cpu_times()
        except psutil.Error:
            continue
        try:
            argv = p.cmdline()
        except psutil.Error:
            argv = []
        kind = _kind(argv) if argv else seen.get(key, [None])[0]
        if kind is not None:
            seen[key] = [kind, t.user + t.system]


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
    seen: Dict[Tuple[int, float], list] = {}
    while proc.poll() is None:
        sample(proc.pid, seen)
        time.sleep(every)
    print(table(seen.values()), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
