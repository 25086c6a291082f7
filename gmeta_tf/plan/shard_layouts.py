"""Which ways a table may be cut into shards (a *layout*), and the shards each layout gives.

* ``table``: whole, on one PS;
* ``row`` k: TFRA's own row sharding (``id % k``) over k distinct PS, k in 2..M. Only for
  big tables: a small table gains nothing from it but k times the per-table overhead;
* ``column`` n: n column blocks of dim d/n on distinct PS (n = 2, d even), concatenated
  after lookup. Every block still sees every lookup, so this halves memory and bytes moved
  per lookup, not the number of lookups.

Why a module of its own: the search, the baselines' fallback for tables that fit no single
PS, and the tests all need the same answer to "what shards does this layout make".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Literal

from gmeta_tf.plan.spec import Shard, ShardKind, TableStats

# A table with fewer rows than this is never row-split (unless it fits no PS whole).
MIN_ROWS_FOR_ROW_SPLIT = 10_000


@dataclass(frozen=True)
class ShardLayout:
    """How one table is cut: whole, into k row shards or into n column blocks."""

    kind: ShardKind
    parts: int  # 1 for "table", k row shards, n column blocks

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.kind, self.parts)))

    def __hash__(self) -> int:
        """The dataclass's own hash, computed once: the search hashes layouts millions of times
        (moves as dict keys), and the same value keeps every set of layouts in the same order."""
        return self._hash

    def __str__(self) -> str:
        return "whole" if self.kind == "table" else f"{self.kind}x{self.parts}"


WHOLE = ShardLayout("table", 1)


def shards_of(t: TableStats, layout: ShardLayout) -> List[Shard]:
    """The shards ``layout`` cuts ``t`` into, in index order."""
    if layout.kind == "table":
        return [Shard.whole(t)]
    k = layout.parts
    if layout.kind == "row":
        rows = math.ceil(t.rows / k)
        return [Shard(t.name, "row", i, k, rows, t.dim, t.pooling / k, t.skew) for i in range(k)]
    if t.dim % k:
        raise ValueError(f"table {t.name}: dim {t.dim} is not divisible into {k} column blocks")
    return [Shard(t.name, "column", i, k, t.rows, t.dim // k, t.pooling, t.skew) for i in range(k)]


def candidate_layouts(t: TableStats, ps: int, mem_per_ps: int, optimizer_slots: int,
                      kinds: Literal["all", "table"] = "all") -> List[ShardLayout]:
    """Layouts whose every shard fits one empty PS. Whole first, then by increasing parts."""
    out: List[ShardLayout] = []
    opts = [WHOLE]
    if kinds == "all" and ps >= 2:
        big = t.rows >= MIN_ROWS_FOR_ROW_SPLIT or t.bytes(optimizer_slots) > mem_per_ps
        if t.dim % 2 == 0:
            opts.append(ShardLayout("column", 2))
        if big:
            opts += [ShardLayout("row", k) for k in range(2, ps + 1)]
    for lay in opts:
        if max(s.bytes(optimizer_slots) for s in shards_of(t, lay)) <= mem_per_ps:
            out.append(lay)
    return out


def smallest_fitting_row_split(t: TableStats, ps: int, mem_per_ps: int, optimizer_slots: int) -> ShardLayout | None:
    """Whole if it fits one PS, else the fewest row shards that each fit; ``None`` if none does."""
    for k in range(1, ps + 1):
        lay = WHOLE if k == 1 else ShardLayout("row", k)
        if shards_of(t, lay)[0].bytes(optimizer_slots) <= mem_per_ps:
            return lay
    return None
