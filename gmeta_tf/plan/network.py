"""The network term of the cost model: what a PS's link adds to a step, bytes over the link rate.

``ps_cost`` (cost_model.py) is the PS's CPU time per step, calibrated where a byte costs nothing
(loopback). On a real link each PS also moves, per step, every distinct row its shards serve:
read (key in, value out) and written back (key and gradient in). On the default path (one
request per PS, ``model.ps_requests``) optimizer slots never travel: they live and update on
the PS (make bench's ``network`` section measured the PS links' bytes at 0.99x this count). On
TFRA's per-table path they do (the worker reads and writes the Adam slots too: 3.6x the bytes,
measured); this term is for the default path. So a shard's payload per step is

    distinct ids x 2 x (dim x 4 + 8)   bytes (float32 values, int64 keys)

and its link time ``WIRE_OVERHEAD x payload x 8 / rate``: ``WIRE_OVERHEAD`` is measured wire
bytes (Ethernet frames on the emulated hosts' veths: TCP/IP, HTTP/2 and gRPC framing, TF's
tensor protos, control RPCs) over this payload, from ``make bench``'s ``network`` section.
Round trips x latency would join it where a delay is emulated; none is here (no netem), so
``delay_s`` is 0 and the term is bytes only.

``NetworkCostModel`` wraps a ``CostModel`` with that term, keeping its contract (``ps_cost``,
``ps_costs``, ``predict_terms``): the planner balances CPU plus link time per PS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

from gmeta_tf.plan.spec import Shard

KEY_BYTES = 8
VALUE_BYTES = 4
# Wire bytes / payload on the default path (one request per PS), measured by make bench's network
# section: 155.9 kB on the PS links per worker step against 157.6 kB of rows counted from the
# first 20 batches of the same data (0.99: framing is within that estimate's noise). docs/network.md.
WIRE_OVERHEAD = 1.0


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


def terms_payload(terms: Sequence[Sequence[float]]) -> float:
    """Payload bytes per step of a PS's shards from their (lookups, distinct, dim, rows) terms."""
    return float(sum(row_payload_bytes(d) * u for _, u, d, _ in terms))


def _terms(shard_lists: Sequence[Sequence[Shard]], samples_per_step: int) -> List[List[tuple]]:
    from gmeta_tf.plan.cost_model import shard_terms

    sps = int(samples_per_step)
    return [[shard_terms(s.rows, s.dim, s.pooling, s.skew, sps) for s in shards] for shards in shard_lists]


class NetworkCostModel:
    """A ``CostModel`` plus each PS's link time: the same contract, milliseconds per step."""

    def __init__(self, base, link: Link):
        self.base, self.link = base, link
        self.algo, self.error, self.source = base.algo, base.error, base.source

    def link_ms(self, terms: Sequence[Sequence[float]]) -> float:
        return self.link.ms(terms_payload(terms))

    def ps_cost(self, shards: Sequence[Shard], samples_per_step: int) -> float:
        return self.ps_costs([shards], samples_per_step)[0]

    def ps_costs(self, shard_lists: Sequence[Sequence[Shard]], samples_per_step: int) -> List[float]:
        return self.predict_terms(_terms(shard_lists, samples_per_step)).tolist()

    def payloads(self, shard_lists: Sequence[Sequence[Shard]], samples_per_step: int) -> List[float]:
        """Payload bytes per step of each PS's shards: what the link term divides by the rate
        (the ``sharding_network`` bench compares it with the bytes its links counted)."""
        return [terms_payload(t) for t in _terms(shard_lists, samples_per_step)]

    def predict_terms(self, terms_list: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
        cpu = self.base.predict_terms(terms_list)
        return cpu + np.array([self.link_ms(t) for t in terms_list], dtype=np.float64)


def with_network(model, rate_bit_s: Optional[int], delay_s: float = 0.0):
    """``model`` itself where bytes are free (no rate, no delay), else wrapped with the term."""
    if not rate_bit_s and not delay_s:
        return model
    return NetworkCostModel(model, Link(rate_bit_s, delay_s))
