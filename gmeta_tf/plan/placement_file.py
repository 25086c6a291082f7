"""``placement.yaml``: the contract between ``gmeta plan`` (writer) and the trainer (reader).

Format (``cluster.placement`` points at it)::

    tables:
      item:   [0, 1]                  # row-sharded over PS tasks 0 and 1 (ids hashed id % 2)
      city:   [1]                     # the whole table on PS task 1
      hour:   {ps: [1]}               # the same, long form
      tags:   {columns: [[0], [1]]}   # column split: block i (dim d/2) on the PS of columns[i]
      user:   {columns: [[0, 1], [2]]}  # a block may itself be row-sharded over several PS

A column-split table of dim ``d`` with ``n`` blocks needs ``d % n == 0``; block ``i`` holds
dims ``[i*d/n, (i+1)*d/n)`` and is its own TFRA table (``embedding/column_split.py``). Tables the
file does not name are row-sharded over every PS, as without a placement file.

Why one module: the planner writes what the trainer reads, so the parser, the validation and
the writer live together and a format change cannot reach only one side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Union

import yaml

from gmeta_tf.atomic_file import replace_file
from gmeta_tf.errors import ClusterError


@dataclass(frozen=True)
class ColumnSplit:
    """A table cut into ``len(columns)`` column blocks; ``columns[i]`` are block i's PS tasks."""

    columns: List[List[int]]


# A row placement stays a plain list of PS tasks (the format the trainer has always read).
TablePlacement = Union[List[int], ColumnSplit]


def _task_list(path: str, name: str, value, what: str) -> List[int]:
    ok = isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    if not ok or any(t < 0 for t in value):
        raise ClusterError(f"cluster.placement {path}: table {name!r} needs a non-empty list of PS task "
                           f"indices{what}, got {value!r}")
    if len(set(value)) != len(value):
        raise ClusterError(f"cluster.placement {path}: table {name!r} lists a PS task twice{what}: {value!r}")
    return list(value)


def parse_placement(doc, path: str) -> Dict[str, TablePlacement]:
    if not isinstance(doc, dict) or not isinstance(doc.get("tables"), dict):
        raise ClusterError(f"cluster.placement {path}: expected a 'tables' mapping")
    out: Dict[str, TablePlacement] = {}
    for name, spec in doc["tables"].items():
        name = str(name)
        if isinstance(spec, dict) and "columns" in spec:
            cols = spec["columns"]
            if not isinstance(cols, list) or len(cols) < 2:
                raise ClusterError(f"cluster.placement {path}: table {name!r}: 'columns' needs a list of "
                                   f">= 2 blocks, each a list of PS tasks, got {cols!r}")
            out[name] = ColumnSplit([_task_list(path, name, c, f" (columns[{i}])") for i, c in enumerate(cols)])
        else:
            out[name] = _task_list(path, name, spec.get("ps") if isinstance(spec, dict) else spec, "")
    return out


def read_placement(path: Optional[str]) -> Optional[Dict[str, TablePlacement]]:
    """Parse ``path``; ``None`` for no file. Errors name the file and the table."""
    if not path:
        return None
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except OSError as e:
        raise ClusterError(f"cluster.placement {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ClusterError(f"cluster.placement {path}: not valid YAML: {str(e).splitlines()[0]}") from None
    return parse_placement(doc, path)


def ps_tasks_of(spec: TablePlacement) -> List[int]:
    """Every PS task a table's placement uses."""
    if isinstance(spec, ColumnSplit):
        return sorted({t for block in spec.columns for t in block})
    return list(spec)


def check_tasks(placement: Dict[str, TablePlacement], ps_count: int) -> None:
    for name, spec in placement.items():
        bad = [t for t in ps_tasks_of(spec) if not 0 <= t < ps_count]
        if bad:
            raise ClusterError(f"placement puts table {name!r} on PS task(s) {bad}, "
                               f"but only {ps_count} PS are configured")


def to_doc(placement: Dict[str, TablePlacement]) -> dict:
    tables = {}
    for name, spec in placement.items():
        tables[name] = {"columns": [list(c) for c in spec.columns]} if isinstance(spec, ColumnSplit) else list(spec)
    return {"tables": tables}


def write_placement(path: str, placement: Dict[str, TablePlacement], header: str = "") -> None:
    """Write atomically (temp file + rename): a trainer never reads half a placement."""
    text = "".join(f"# {line}\n" for line in header.splitlines())
    text += yaml.safe_dump(to_doc(placement), sort_keys=False, default_flow_style=None)
    replace_file(path, text)
