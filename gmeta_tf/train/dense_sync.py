"""How dense gradients and weights are kept identical across workers.

Dense weights are replicated on every worker (data parallel): the outer-loop gradients are
averaged over ranks with a Horovod ring all-reduce, and rank 0's initial weights are broadcast
so every replica starts equal. Embedding gradients never pass through here: they go straight
to the PS tables. ``LocalSync`` is the embedded default (one process, nothing to talk to), so
the trainer calls the same methods whatever the cluster.

**Wire precision** (``cluster.wire_dtype: bfloat16``, ``embedding/wire.py``). Why not a
bfloat16 Horovod ``Compressor`` on ``grouped_allreduce`` (which takes ``compression=``): it
cannot run. Horovod 0.28.1 registers its allreduce, grouped allreduce and reducescatter ops for
``{uint8, int8, int32, int64, float16, float32, float64}`` only, so a compressor's bfloat16
tensor is refused where the op is built (tests/test_wire.py). Float16 (Horovod's own
``Compression.fp16``) would flush small meta-gradients to zero. So ``mean_on_wire`` builds
the ring all-reduce's two halves from collectives that only move bytes (all-to-all, all-gather
take 16-bit integers): each rank's bfloat16 gradients are cut into ``size`` slices, the owner of
each slice receives every rank's copy of it and averages them in float32, and the averaged
slices, sent in bfloat16 again, are gathered by everyone. Each rank sends ``(size-1)/size`` of
the payload twice, as a ring all-reduce does, at 2 bytes a value instead of 4: half the
bytes, two collectives a step instead of one. Every rank ends with the owners' bits, so the
replicas stay identical.

**int8 on the wire** (``cluster.dense_compression: int8``, ``int8_wire.py``): the dense
gradients alone (``allreduce_dense``) cross as int8 blocks with error feedback, a quarter of
float32's bytes, through the same two halves. The hot rows' exchange keeps ``wire_dtype``: its
touched marks must arrive exact, and its replicas' protocol has no residual to feed back into.
"""
from __future__ import annotations

from typing import Callable, List, Sequence, Union

import tensorflow as tf

from gmeta_tf.embedding.wire import Wire, as_bits, from_bits
from gmeta_tf.train.int8_wire import Residuals, mean_int8


class LocalSync:
    rank = 0
    size = 1
    local_rank = 0
    wire = Wire()  # one process: nothing crosses a link, whatever cluster.wire_dtype says

    def allreduce(self, grads: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        return list(grads)

    def allreduce_dense(self, grads: Sequence[tf.Tensor], exact: Sequence[tf.Tensor] = ()) -> List[tf.Tensor]:
        return self.allreduce([*grads, *exact])

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
    """Horovod over Gloo. ``hvd.init()`` must already have run (``HorovodSync.create``). ``wire``:
    the dtype floating tensors cross between workers in (``cluster.wire_dtype``)."""

    def __init__(self, hvd, wire: Wire = Wire(), elastic: bool = False, dense_compression: str = "none"):
        self.hvd = hvd
        self.wire = wire
        # ``cluster.dense_compression``: "int8" sends the dense gradients as int8 blocks with
        # error feedback (``allreduce_dense``); the config refuses it with ``elastic``.
        self.dense_compression = dense_compression
        self._residuals = Residuals()
        # An elastic ring changes size under a step traced once: the size a collective's shapes
        # depend on is then read when the step runs (``hvd.size_op``), not when it is traced.
        self.elastic = elastic

    # Read from Horovod at each use, not kept: under Horovod Elastic a lost worker re-forms the
    # ring (``reset``), and the survivors' ranks and the ring's size change (train/elastic.py).
    @property
    def rank(self) -> int:
        return self.hvd.rank()

    @property
    def size(self) -> int:
        return self.hvd.size()

    @property
    def local_rank(self) -> int:
        return self.hvd.local_rank()

    @classmethod
    def create(cls, wire: Wire = Wire(), elastic: bool = False, dense_compression: str = "none") -> "HorovodSync":
        import horovod.tensorflow as hvd

        hvd.init()
        return cls(hvd, wire, elastic, dense_compression)

    def allreduce(self, grads: Sequence[tf.Tensor]) -> List[tf.Tensor]:
        """The mean over ranks; in the wire dtype where there is a wire (more than one rank)."""
        if self.wire.exact or (self.size == 1 and not self.elastic):
            return list(self.hvd.grouped_allreduce(list(grads), op=self.hvd.Average))
        size = tf.cast(self.hvd.size_op(), tf.int32) if self.elastic else self.size
        return mean_on_wire(list(grads), size, self.wire, self.hvd.alltoall, self.hvd.allgather)

    def allreduce_dense(self, grads: Sequence[tf.Tensor], exact: Sequence[tf.Tensor] = ()) -> List[tf.Tensor]:
        """The dense weights' gradients' mean, then each of ``exact``'s (scalars that must arrive
        exactly: the stop vote): ``allreduce``'s, or int8 blocks with error feedback under
        ``cluster.dense_compression: int8`` (module docstring)."""
        if self.dense_compression != "int8" or self.size == 1:
            return self.allreduce([*grads, *exact])
        means, exact_means = mean_int8(list(grads), self.size, self._residuals, self.hvd.alltoall,
                                       self.hvd.allgather, exact)
        return [*means, *exact_means]

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
        """Rank-ordered concatenations along axis 0, negotiated as one (hot-row sparse gradients;
        a bfloat16 tensor moves as its bits)."""
        got = self.hvd.grouped_allgather([as_bits(t) for t in tensors])
        return [from_bits(g, t.dtype) for g, t in zip(got, tensors)]

    def broadcast_object(self, obj):
        """Rank 0's picklable ``obj`` on every rank (Horovod Elastic's commit check uses it)."""
        return self.hvd.broadcast_object(obj, root_rank=0)

    def reset(self) -> None:
        """Leave the ring and join the next one the elastic driver forms (Horovod Elastic's reset):
        blocks until the driver has re-formed it without the lost workers."""
        self.hvd.shutdown()
        self.hvd.init()


Collective = Callable[[tf.Tensor], tf.Tensor]


def mean_on_wire(tensors: List[tf.Tensor], size: Union[int, tf.Tensor], wire: Wire, alltoall: Collective,
                 allgather: Collective) -> List[tf.Tensor]:
    """The mean over ``size`` ranks of each float32 tensor, every value crossing in ``wire``'s
    dtype (module docstring): ``alltoall`` sends row r of a ``[size, n]`` tensor to rank r and
    returns what every rank sent this one, in rank order; ``allgather`` concatenates every
    rank's ``[1, n]`` along axis 0. Static shapes (dense weights' gradients) where ``size`` is
    an int; an int32 tensor (an elastic ring, read when the step runs) makes the slices' width
    a tensor too, and the same arithmetic follows."""
    if not tensors:
        return []
    counts = [t.shape.num_elements() for t in tensors]
    total = sum(counts)
    width = -(-total // size)  # each rank owns one slice of this many values
    flat = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in tensors], axis=0)
    slices = tf.reshape(tf.pad(flat, [[0, width * size - total]]), [size, width])
    received = from_bits(alltoall(as_bits(wire.send(slices))), wire.tf_dtype)  # every rank's copy of my slice
    mine = tf.reduce_sum(wire.receive(received), axis=0) / tf.cast(size, tf.float32)
    gathered = from_bits(allgather(as_bits(wire.send(mine[None, :]))), wire.tf_dtype)
    out = tf.split(tf.reshape(wire.receive(gathered), [-1])[:total], counts)
    return [tf.cast(tf.reshape(o, t.shape), t.dtype) for o, t in zip(out, tensors)]
