"""How dense gradients and weights are kept identical across workers.

Dense weights are replicated on every worker (data parallel): the outer-loop gradients are
averaged over ranks with a Horovod ring all-reduce, and rank 0's initial weights are broadcast
so every replica starts equal. Embedding gradients never pass through here: they go straight
to the PS tables. ``LocalSync`` is the embedded default (one process, nothing to talk to), so
the trainer calls the same methods whatever the cluster.
"""
from __future__ import annotations

from typing import List, Sequence

import tensorflow as tf


class LocalSync:
    rank = 0
    size = 1
    local_rank = 0

    def allreduce(self, grads: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        return list(grads)

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        pass

    def barrier(self) -> None:
        pass

    def allreduce_scalar(self, value: float) -> float:
        return value

    def broadcast_int(self, value: int) -> int:
        return value

    def allgather_group(self, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        return list(tensors)


class HorovodSync:
    """Horovod over Gloo. ``hvd.init()`` must already have run (``HorovodSync.create``)."""

    def __init__(self, hvd):
        self.hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_rank = hvd.local_rank()

    @classmethod
    def create(cls) -> "HorovodSync":
        import horovod.tensorflow as hvd

        hvd.init()
        return cls(hvd)

    def allreduce(self, grads: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        return list(self.hvd.grouped_allreduce(list(grads), op=self.hvd.Average))

    def broadcast_variables(self, variables: Sequence[tf.Variable]) -> None:
        self.hvd.broadcast_variables(list(variables), root_rank=0)

    def barrier(self) -> None:
        # horovod.tensorflow has no barrier; an all-reduce returns only once every rank joined.
        self.hvd.allreduce(tf.constant(0, tf.int32), op=self.hvd.Sum, name="gmeta_barrier")

    def broadcast_int(self, value: int) -> int:
        return int(self.hvd.broadcast(tf.constant(value, tf.int64), root_rank=0, name="gmeta_bcast_int").numpy())

    def allreduce_scalar(self, value: float) -> float:
        return float(self.hvd.allreduce(tf.constant(value, tf.float64), op=self.hvd.Sum).numpy())

    def allgather_group(self, tensors: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """Rank-ordered concatenations along axis 0, negotiated as one (hot-row sparse gradients)."""
        return list(self.hvd.grouped_allgather(list(tensors)))
