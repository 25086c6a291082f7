"""The network term of the cost model: what a PS's link adds to a step, bytes over the link rate.

``ps_cost`` (cost_model.py) is the PS's CPU time per step, calibrated where a byte costs nothing
(loopback). On a real link each PS also moves, per step, every distinct row its shards serve:
read (key in, value out) and written back (key and gradient in). On the default path (one
request per PS, ``model.ps_requests``) optimizer slots never travel: they live and update on
the PS (make bench's ``network`` section measured the PS links' bytes at 0.99x this count). On
TFRA's per-table path they do (the worker reads and writes the Adam slots too: 3.6x the bytes,
measured), and a column block of the planner's is always on that path (its blocks are looked up
by the split table itself, ``embedding/ps_requests.py``): its rows count ``per_table_factor``
times. Every worker sends its own request, so the distinct ids are each worker's, times the
workers (the union of all workers' ids, what ``samples_per_step`` alone would give, is fewer:
the ``sharding_network`` bench counted 1.4-1.6x that on the PS links at 4 workers, and 0.78-0.96x
of this count: the skew histogram does not see that a user's samples share items and tags). So a
shard's payload per step is

    workers x distinct ids per worker x 2 x (dim x b + 8)   bytes (b-byte values, int64 keys)

with ``b`` the wire's bytes a value (``cluster.wire_dtype``: 2 in bfloat16, which ``auto`` sends
over links of 100 Mbit/s or less; 4 in float32; a column block 4, as TFRA's per-table path sends
float32 whatever the wire)

and its link time ``WIRE_OVERHEAD x payload x 8 / rate`` with one worker; with two or more,
half of that (``BUSIER_DIRECTION``: the busier direction of a full-duplex link). ``WIRE_OVERHEAD`` is measured wire
bytes (Ethernet frames on the emulated hosts' veths: TCP/IP, HTTP/2 and gRPC framing, TF's
tensor protos, control RPCs) over this payload, from ``make bench``'s ``network`` section.
Round trips x latency would join it where a delay is emulated; none is here (no netem), so
``delay_s`` is 0 and the term is bytes only.

``NetworkCostModel`` wraps a ``CostModel`` with that term, keeping the contract the planner
uses (``ps_cost``, ``ps_costs``): the planner balances CPU plus link time per PS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from gmeta_tf.plan.spec import Shard

KEY_BYTES = 8
VALUE_BYTES = 4
# Wire bytes / payload on the default path (one request per PS), measured by make bench's network
# section: 155.9 kB on the PS links per worker step against 157.6 kB of rows counted from the
# first 20 batches of the same data (0.99: framing is within that estimate's noise). docs/network.md.
WIRE_OVERHEAD = 1.0
# TFRA's per-table path over the default, bytes per row with Adam (2 slots): 567.2 / 155.9 kB per
# worker step (make bench's network section, GMETA_BENCH_NETWORK=full; docs/network.md). The
# value and each slot are read and written (3x), and its many small transfers frame the rest.
PER_TABLE_WIRE_ADAM = 567.2 / 155.9


# A link is full duplex. One worker's step sends its keys and gradients and receives its rows
# one after the other (the lookup, then the apply): the link time is both directions' bytes.
# With more workers, one's apply overlaps another's lookup, and the busier direction bounds the
# link: keys + gradients to the PS, key + dim x 4 of each row's 2 x (dim x 4 + 8), half the
# payload. The ``sharding_network`` bench (4 workers + 2 PS, 5 Mbit/s) measured steps of
# 342 / 278 ms where the busiest PS link's busier direction carried 208 / 168 kB: 332 / 269 ms.
BUSIER_DIRECTION = 0.5


def per_table_factor(optimizer_slots: int) -> float:
    """Bytes per row on TFRA's per-table path over the default path's: the rows and each slot
    travel, with the measured framing of Adam's (``PER_TABLE_WIRE_ADAM`` / 3)."""
    return (1 + optimizer_slots) * PER_TABLE_WIRE_ADAM / 3.0


def row_payload_bytes(dim: float, value_bytes: int = VALUE_BYTES) -> float:
    """One distinct row's bytes per step between a worker and its PS: read and written once
    (``value_bytes``: 2 with ``cluster.wire_dtype: bfloat16``; keys stay 8)."""
    return 2.0 * (dim * value_bytes + KEY_BYTES)


@dataclass(frozen=True)
class Link:
    """One PS host's link. ``rate_bit_s=None``: loopback, bytes are free."""
    rate_bit_s: Optional[int]
    delay_s: float = 0.0
    wire_overhead: float = WIRE_OVERHEAD

    def ms(self, payload_bytes: float, round_trips: float = 0.0) -> float:
        """Milliseconds the link spends on ``payload_bytes`` (and ``round_trips`` where delayed)."""
        wire = 0.0 if not self.rate_bit_s else payload_bytes * self.wire_overhead * 8.0 / self.rate_bit_s
        return 1000.0 * (wire + 2.0 * self.delay_s * round_trips)


class NetworkCostModel:
    """A ``CostModel`` plus each PS's link time: the same contract, milliseconds per step.

    ``workers``: how many workers ``samples_per_step`` is shared by (each sends its own
    distinct ids); ``optimizer_slots``: what a column block's rows carry on TFRA's path."""

    def __init__(self, base, link: Link, workers: int = 1, optimizer_slots: int = 2, value_bytes: int = VALUE_BYTES):
        self.base, self.link = base, link
        self.workers, self.optimizer_slots = max(1, int(workers)), int(optimizer_slots)
        # ``cluster.wire_dtype``'s bytes a value on the default path (2: bfloat16; ``auto`` at <= 100 Mbit/s);
        # a column block goes TFRA's per-table path, float32 whatever the wire
        self.value_bytes = int(value_bytes)
        self.algo, self.error, self.source = base.algo, base.error, base.source

    def ps_cost(self, shards: Sequence[Shard], samples_per_step: int) -> float:
        return self.ps_costs([shards], samples_per_step)[0]

    def ps_costs(self, shard_lists: Sequence[Sequence[Shard]], samples_per_step: int) -> List[float]:
        cpu = self.base.ps_costs(shard_lists, samples_per_step)
        share = 1.0 if self.workers == 1 else BUSIER_DIRECTION
        return [c + self.link.ms(share * b) for c, b in zip(cpu, self.payloads(shard_lists, samples_per_step))]

    def payloads(self, shard_lists: Sequence[Sequence[Shard]], samples_per_step: int) -> List[float]:
        """Payload bytes per step of each PS's shards (module docstring): what the link term
        divides by the rate; the ``sharding_network`` bench compares it with its links' counts."""
        from gmeta_tf.plan.cost_model import shard_terms

        per_worker = max(1, int(samples_per_step) // self.workers)
        column = per_table_factor(self.optimizer_slots)
        return [float(sum(self.workers * shard_terms(s.rows, s.dim, s.pooling, s.skew, per_worker)[1]
                          * (row_payload_bytes(s.dim) * column if s.kind == "column"
                             else row_payload_bytes(s.dim, self.value_bytes)) for s in shards))
                for shards in shard_lists]


def with_network(model, rate_bit_s: Optional[int], delay_s: float = 0.0, workers: int = 1,
                 optimizer_slots: int = 2, value_bytes: int = VALUE_BYTES):
    """``model`` itself where bytes are free (no rate, no delay), else wrapped with the term."""
    if not rate_bit_s and not delay_s:
        return model
    return NetworkCostModel(model, Link(rate_bit_s, delay_s), workers, optimizer_slots, value_bytes)
