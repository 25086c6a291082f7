"""What the planner places: tables (from the data) and the shards they may be cut into.

Why its own module: the calibration microbenchmark, the cost model, the search and the
benchmark suite all describe a PS's load with these two types, so they must agree on one
definition of "rows", "lookups" and "skew".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Tuple

# The skew histogram is defined with the statistics ``prepare`` writes (``data/stats.py``); the
# planner reads it from there so that data does not import the planner.
from gmeta_tf.data.stats import N_SKEW_BINS, SKEW_EDGES, skew_histogram  # noqa: F401

VALUE_BYTES = 4  # float32 embeddings
KEY_BYTES = 8  # int64 ids, stored once per row per table (and per slot table)


@dataclass(frozen=True)
class TableStats:
    """One embedding table as the data and the config describe it."""

    name: str
    rows: int  # cardinality: distinct ids the table will hold
    dim: int  # embedding dim from the model config
    pooling: float  # mean ids per sample (1.0 for a categorical feature)
    skew: Tuple[float, ...] = field(default_factory=lambda: tuple([1.0] + [0.0] * (N_SKEW_BINS - 1)))

    def row_bytes(self, optimizer_slots: int) -> int:
        """Bytes one row costs on a PS: the value plus each optimizer slot (Adam: 2), keys included."""
        return (1 + optimizer_slots) * (self.dim * VALUE_BYTES + KEY_BYTES)

    def bytes(self, optimizer_slots: int) -> int:
        return self.rows * self.row_bytes(optimizer_slots)


ShardKind = Literal["table", "row", "column"]


@dataclass(frozen=True)
class Shard:
    """A piece of one table that lives on one PS.

    * ``table``: the whole table.
    * ``row``: 1/``of`` of the rows by id hash (TFRA's own row sharding), so also ~1/``of`` of
      the lookups and of the distinct ids.
    * ``column``: one of ``of`` column blocks (dim/``of`` each) with *all* rows and lookups;
      the trainer concatenates the blocks after lookup.
    """

    table: str
    kind: ShardKind
    index: int
    of: int
    rows: int
    dim: int
    pooling: float  # ids per sample that land on this shard
    skew: Tuple[float, ...]

    @staticmethod
    def whole(t: TableStats) -> "Shard":
        return Shard(t.name, "table", 0, 1, t.rows, t.dim, t.pooling, t.skew)

    def bytes(self, optimizer_slots: int) -> int:
        return self.rows * (1 + optimizer_slots) * (self.dim * VALUE_BYTES + KEY_BYTES)
