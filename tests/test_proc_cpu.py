"""bench/proc_cpu.py: a child's busy CPU is found in the tree and named by its module."""
from __future__ import annotations

import os
import subprocess
import sys

from bench import proc_cpu

_BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(0.3)"


def test_a_grandchild_busy_loop_is_counted_by_its_command(tmp_path):
    (tmp_path / "busy.py").write_text(_BUSY)
    inner = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-m', 'busy']))"
    seen = {}
    proc = subprocess.Popen([sys.executable, "-c", inner], cwd=tmp_path)
    while proc.poll() is None:
        proc_cpu.sample(proc.pid, seen)
    assert proc.returncode == 0
    by_kind = {}
    for kind, cpu in seen.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + cpu
    assert by_kind.get("-m busy", 0.0) >= 0.4, by_kind
    assert "-m busy" in proc_cpu.table(seen.values())


def test_a_process_first_seen_before_it_execs_is_named_by_what_it_runs(tmp_path):
    """The CI-flaky case made certain: a child sampled between fork and exec shows its parent's
    command line; the CPU it spends after exec belongs to the command it became."""
    (tmp_path / "busy.py").write_text(_BUSY)
    becomes = "import os, sys; sys.stdin.readline(); os.execv(sys.executable, [sys.executable, '-m', 'busy'])"
    seen = {}
    proc = subprocess.Popen([sys.executable, "-c", becomes], cwd=tmp_path, stdin=subprocess.PIPE)
    while not seen and proc.poll() is None:  # (just after exec a command line can still read empty)
        proc_cpu.sample(proc.pid, seen)
    assert [kind for kind, _ in seen.values()] == [os.path.basename(sys.executable)]
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    while proc.poll() is None:
        proc_cpu.sample(proc.pid, seen)
    assert proc.returncode == 0
    assert [kind for kind, _ in seen.values()] == ["-m busy"]
    assert seen[next(iter(seen))][1] >= 0.4


def test_the_exit_status_is_the_commands(capsys):
    assert proc_cpu.main(["--every", "0.05", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert "in all" in capsys.readouterr().err
