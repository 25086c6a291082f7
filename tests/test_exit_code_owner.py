"""Every exit code is written in one place, ``gmeta_tf/exit_codes.py`` (issue 52, item 5).

Why: a code means what a scheduler does next (``restartPolicy: ExitCode`` retries 128-255 only),
so a number typed at an exit (``sys.exit(130)``), returned as a process's code (the launcher's
time-out returned as 124) or compared with one (``code == 124``) is a second owner that drifts
from the table. This test reads the syntax tree of every module of gmeta_tf/, launch/, ps/ and
bench/ and names each such number, file and line.

What counts as a process's code:
* the argument of ``sys.exit``, ``os._exit``, ``exit``, ``ctx.exit`` (click), ``SystemExit``,
  click's ``Exit``: any number there, 0 included (``exit_codes.DONE``);
* what a function returns when its result is a process's code: a function called as the argument
  of an exit (``sys.exit(main())``), or assigned to a code's name (``code = cluster.train(...)``),
  or returned by such a function (``return self.wait_workers(...)``), found across all modules;
* a code's name (``returncode``, ``exit_code``, ``job_code``, ``code``, ``rc``) compared for
  equality (``==``, ``!=``, ``in``, ``is``) with a number (an order, ``code < 400``, is an HTTP
  status's range in the serving log, not a process's code). ``0`` is allowed there alone: it is every program's
  success (``ip``'s and ``kubectl``'s as well as ours), not a row of the table.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Iterable, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
OWNER = REPO / "gmeta_tf" / "exit_codes.py"
FOLDERS = ("gmeta_tf", "launch", "ps", "bench")

EXIT_ATTRS = {"exit", "_exit"}  # sys.exit, os._exit, ctx.exit
EXIT_NAMES = {"exit", "quit", "SystemExit", "Exit"}  # builtins, click.exceptions.Exit
EXIT_CLASS_ATTRS = {"SystemExit", "Exit"}  # click.exceptions.Exit, builtins.SystemExit
EQUALITY = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)  # an order (< 400) is a range's
CODE_NAME = re.compile(r"^(returncode|exitcode|exit_code|job_code|code|rc)$|_(returncode|exit_code)$")


def _number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _numbers(node: ast.AST) -> List[ast.AST]:
    """The numbers ``node`` is, or holds (a tuple, list or set of them, for ``in``)."""
    if _number(node):
        return [node]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e for e in node.elts if _number(e)]
    return []


def _value(node: ast.AST) -> float:
    return -node.operand.value if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) else (
        node.operand.value if isinstance(node, ast.UnaryOp) else node.value)


def _is_exit(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id in EXIT_NAMES
    return isinstance(f, ast.Attribute) and (f.attr in EXIT_ATTRS or f.attr in EXIT_CLASS_ATTRS)


def _exit_arg(call: ast.Call):
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in ("code", "status")), None)


def _called_name(node: ast.AST):
    """``f`` of ``f(...)`` or ``x.f(...)``; None for anything else."""
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def _target_name(node: ast.AST):
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _code_expr(node: ast.AST) -> bool:
    name = _target_name(node)
    return bool(name and CODE_NAME.search(name))


def _own_returns(fn: ast.AST) -> Iterable[ast.Return]:
    """The ``return`` statements of ``fn`` itself, not of functions or classes defined in it."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def _modules(root: Path) -> List[Tuple[str, ast.Module]]:
    out = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if path.resolve() != (root / "gmeta_tf" / "exit_codes.py").resolve():
                out.append((str(path.relative_to(root)), ast.parse(path.read_text(), str(path))))
    return out


def _code_functions(modules) -> Set[str]:
    """Names of the functions whose result is a process's code (see the module's docstring)."""
    names: Set[str] = set()
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_exit(node):
                name = _called_name(_exit_arg(node))
                if name:
                    names.add(name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                name = _called_name(node.value)
                if name and any(_code_expr(t) for t in targets):
                    names.add(name)
    functions = [n for _, tree in modules for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    while True:  # a code function's returned call is one too
        more = {_called_name(r.value) for f in functions if f.name in names for r in _own_returns(f)} - {None}
        if more <= names:
            return names
        names |= more


def owners(root: Path = REPO) -> List[str]:
    """``file:line: what`` for each number written as a process's code outside the table."""
    modules = _modules(root)
    code_functions = _code_functions(modules)
    found = []
    for rel, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_exit(node):
                arg = _exit_arg(node)
                if arg is not None and _number(arg):
                    found.append(f"{rel}:{node.lineno}: exits {_value(arg)}")
            elif isinstance(node, ast.Compare) and all(isinstance(op, EQUALITY) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(_code_expr(s) for s in sides):
                    for s in sides:
                        for n in _numbers(s):
                            if _value(n) != 0:
                                found.append(f"{rel}:{node.lineno}: compares a code with {_value(n)}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in code_functions:
                for r in _own_returns(node):
                    if r.value is not None and _number(r.value):
                        found.append(f"{rel}:{r.lineno}: {node.name}() returns {_value(r.value)} as a code")
    return sorted(set(found))


@pytest.mark.fast
def test_no_exit_code_is_written_outside_the_table():
    assert owners() == []


@pytest.mark.fast
def test_the_walk_finds_each_kind_of_owner(tmp_path):
    """The rule can fail: one planted module per kind, each named."""
    (tmp_path / "launch").mkdir()
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "launch" / "planted.py").write_text(
        "import os, sys\n"
        "def wait_all(procs):\n"
        "    return 124\n"
        "def run(procs):\n"
        "    return wait_all(procs)\n"
        "def main():\n"
        "    code = run([])\n"
        "    if code == 124 or code in (130, 0):\n"
        "        sys.exit(130)\n"
        "    if proc.returncode != 0 and status.code < 400:\n"  # allowed: success; an order
        "        raise SystemExit(1)\n"
        "    os._exit(0)\n"
        "def cli(ctx):\n"
        "    ctx.exit(2)\n"
        "    return 0\n"
        "sys.exit(main())\n")
    assert owners(tmp_path) == sorted([
        "launch/planted.py:3: wait_all() returns 124 as a code",
        "launch/planted.py:8: compares a code with 124",
        "launch/planted.py:8: compares a code with 130",
        "launch/planted.py:9: exits 130",
        "launch/planted.py:11: exits 1",
        "launch/planted.py:12: exits 0",
        "launch/planted.py:14: exits 2",
    ])


def test_a_time_out_is_a_type_the_supervisor_reads_not_a_code():
    """The launcher's time-out was ``return 124`` from the wait, read back by ``code == 124``:
    a worker that exited 124 of its own would have been taken for it. Now the wait raises
    ``WorkersTimedOut`` (the workers stopped) and the failure is built from the type."""
    from gmeta_tf import exit_codes
    from launch.local_cluster import LocalCluster, WorkersTimedOut
    from launch.supervisor import _failure, _workers_only

    cluster = LocalCluster(log=lambda m: None, grace_s=5.0)
    try:
        sleeper = cluster.spawn("worker", [sys.executable, "-c", "import time; time.sleep(60)"])
        with pytest.raises(WorkersTimedOut) as timed_out:
            cluster.wait_workers([sleeper], timeout_s=0.5)
        assert sleeper.proc.poll() is not None  # stopped before the raise
        failure = _failure(cluster, timed_out.value, 3600)
        # a worker's own 124 is a worker's code like any other, not the launcher's time-out
        own = cluster.spawn("worker", [sys.executable, "-c", f"raise SystemExit({exit_codes.TIMED_OUT.code})"])
        code = cluster.wait_workers([own], timeout_s=60)
    finally:
        cluster.teardown()
    assert timed_out.value.exit_code == exit_codes.TIMED_OUT.code
    assert failure.timed_out and failure.job_code == exit_codes.TIMED_OUT.code
    assert failure.problems == ["timed out after 3600 s"] and failure.exit_code is None
    assert not _workers_only(cluster, failure)
    assert code == exit_codes.TIMED_OUT.code
    own_failure = _failure(cluster, code, 3600)
    assert not own_failure.timed_out and own_failure.job_code == exit_codes.FAILED.code
