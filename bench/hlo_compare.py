"""Counts of two XLA dumps side by side: what TF compiled for the step against what JAX compiled.

    python -m bench.hlo_compare DIR_A DIR_B [--names tf jax] [--dots]

Each DIR is an ``--xla_dump_to`` directory written with ``--xla_dump_hlo_as_text``
(``bench/jax_compare.py --dump`` writes both), or one module's file in it. The largest optimized module (``*after_optimizations.txt``:
the step's program; ``--all`` sums every one) is read; the table counts, per dump: instructions in all computations and at the top level (what
the CPU runtime runs one by one: fusions, dots, custom-calls and the unfused rest, not the
fused bodies) and the MB their outputs write (a call's work is
counted inside it), fusions by kind, dots (batched, and how many are top-level calls rather than
fused), custom-calls, while loops, transposes, copies, gathers, scatters, sorts, and the entry
computation's parameters and outputs (whether the program ends at gradients or includes the
optimizer's updates). ``--dots`` lists every dot's shapes and dimension numbers, which is where a
second-order gradient's layout shows.

Why a script: counts read by eye from a 3,000-line dump are not reproducible, and the comparison
should be re-run when either side changes.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
from typing import Dict, List, Tuple

from gmeta_tf import exit_codes

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\(.*?\)|\S+)\s+([a-z][\w\-]*)\((.*)$")
_TRIVIAL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}


def modules(dump_dir: str) -> List[str]:
    """The optimized modules of a dump (memory and buffer reports excluded), largest first; a
    file instead of a directory is that module alone."""
    if os.path.isfile(dump_dir):
        return [dump_dir]
    files = [f for f in glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
             if "buffer" not in f and "memory" not in f]
    return sorted(files, key=os.path.getsize, reverse=True)


def parse(path: str) -> Tuple[Dict[str, List[Tuple[str, str, str, str]]], str]:
    """``{computation: [(name, shape, opcode, rest)]}`` and the entry computation's name."""
    comps: Dict[str, List[Tuple[str, str, str, str]]] = {}
    entry, current = "", None
    for line in open(path):
        if line.startswith("HloModule") or not line.strip():
            continue
        if current is None or (not line.startswith(" ") and line.rstrip().endswith("{")):
            m = _HEADER.match(line.rstrip())
            if m:
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
                continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            comps[current].append(m.groups())
    return comps, entry


_BYTES = {"f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "bf16": 2, "f16": 2, "pred": 1, "s8": 1, "u8": 1}


def _bytes(shape: str) -> int:
    """Bytes of an HLO shape (a tuple's elements summed)."""
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES.get(dtype, 4)
    return total


def counts(path: str) -> Dict[str, object]:
    comps, entry = parse(path)
    fused = set()
    for instrs in comps.values():
        for _, _, op, rest in instrs:
            if op == "fusion":
                fused.update(re.findall(r"calls=%?([\w.\-]+)", rest))
    # Reducers, scatter combiners, sort comparators: tiny bodies run per element. A ``call``'s
    # body (XLA CPU outlines a parallel task so) is top-level work, counted where it is.
    applied = set()
    for instrs in comps.values():
        for _, _, op, rest in instrs:
            if op != "call":
                applied.update(re.findall(r"(?:to_apply|comparator)=%?([\w.\-]+)", rest))
    c: Dict[str, object] = collections.Counter()
    kinds = collections.Counter()
    dot_types = collections.Counter()
    for comp, instrs in comps.items():
        top = comp not in fused and comp not in applied
        for _, shape, op, rest in instrs:
            c["instructions"] += 1
            if top:
                c["top_level"] += 1
                if op not in _TRIVIAL:
                    c["top_level_ops"] += 1
                if op == "fusion":
                    c["fusions"] += 1
                    k = re.search(r"kind=(k\w+)", rest)
                    kinds[k.group(1) if k else "?"] += 1
                if op not in _TRIVIAL and op != "fusion":
                    c["unfused_ops"] += 1
                if op not in _TRIVIAL and op not in ("while", "call"):
                    c["top_level_mb"] += _bytes(shape) / 1e6
            if op in ("dot", "convolution"):
                c["dots"] += 1
                c["dots_top_level"] += top
                c["dots_batched"] += "lhs_batch_dims" in rest
                dot_types[shape.split("[")[0]] += 1
            for name in ("custom-call", "while", "transpose", "copy", "gather", "scatter", "sort",
                         "reduce", "broadcast", "dynamic-slice", "dynamic-update-slice"):
                if op == name:
                    c[name] += 1
    params = [i for i in comps.get(entry, []) if i[2] == "parameter"]
    root = next((i for i in reversed(comps.get(entry, [])) if i), None)
    c["entry_parameters"] = len(params)
    c["entry_outputs"] = root[1].count("[") if root else 0
    c["top_level_mb"] = round(c["top_level_mb"], 2)
    c["fusion_kinds"] = ", ".join(f"{k[1:]} {n}" for k, n in sorted(kinds.items()))
    c["dot_dtypes"] = ", ".join(f"{k} {n}" for k, n in sorted(dot_types.items()))
    return dict(c)


def dots(path: str) -> List[str]:
    """Every dot: its shape, operand shapes and dimension numbers, in program order."""
    comps, _ = parse(path)
    shapes = {name: shape for instrs in comps.values() for name, shape, _, _ in instrs}
    out = []
    for comp, instrs in comps.items():
        for name, shape, op, rest in instrs:
            if op != "dot":
                continue
            operands = re.findall(r"%([\w.\-]+)", rest.split(")")[0])
            dims = " ".join(re.findall(r"(\w+_dims=\{[\d,]*\})", rest))
            out.append(f"{shape} = dot({', '.join(shapes.get(o, o) for o in operands)}) {dims}  [{comp}]")
    return out


ROWS = ["modules", "instructions", "top_level", "top_level_ops", "top_level_mb", "fusions", "fusion_kinds", "unfused_ops",
        "dots", "dots_top_level", "dots_batched", "dot_dtypes", "custom-call", "while", "transpose", "copy",
        "gather", "scatter", "sort", "reduce", "broadcast", "dynamic-slice", "dynamic-update-slice",
        "entry_parameters", "entry_outputs"]


def summary(dump_dir: str, every: bool = False) -> Dict[str, object]:
    """The counts of the dump's largest optimized module (the step's program; a dump may also
    hold small helper programs), or with ``every`` of all of them, summed (text rows joined)."""
    files = modules(dump_dir)[: None if every else 1]
    if not files:
        raise SystemExit(f"no *after_optimizations.txt in {dump_dir}")
    total: Dict[str, object] = {"modules": len(files)}
    for f in files:
        for k, v in counts(f).items():
            total[k] = (f"{total[k]}; {v}" if k in total and v else v or total.get(k, "")) if isinstance(v, str) \
                else total.get(k, 0) + v
    return total


def table(dumps: Dict[str, str], every: bool = False) -> str:
    got = {name: summary(d, every) for name, d in dumps.items()}
    lines = ["| | " + " | ".join(got) + " |", "|---|" + "---:|" * len(got)]
    for row in ROWS:
        lines.append(f"| {row} | " + " | ".join(str(g.get(row, 0)) for g in got.values()) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--names", nargs="+")
    ap.add_argument("--dots", action="store_true", help="also list every dot of each dump's largest module")
    ap.add_argument("--all", action="store_true", help="sum every optimized module, not only the largest")
    args = ap.parse_args(argv)
    names = args.names or [os.path.basename(os.path.normpath(d)) for d in args.dirs]
    print(table(dict(zip(names, args.dirs)), args.all))
    if args.dots:
        for name, d in zip(names, args.dirs):
            print(f"\n{name}: {modules(d)[0]}")
            print("\n".join(dots(modules(d)[0])))
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
