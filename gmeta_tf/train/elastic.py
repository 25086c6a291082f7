"""Horovod Elastic around the training loop (``cluster.elastic``; ``gmeta launch local --elastic``).

Why Horovod's own engine: ``horovod.common.elastic.run_fn`` already is "a worker died, the others
go on": it syncs the state from rank 0, runs the loop, and when a collective fails restores the
last commit, leaves the ring and joins the one the driver re-forms without the lost worker
(``HorovodSync.reset``), then syncs again. What this module adds is what Horovod cannot know:

* ``DenseCommit``, the state a commit copies to host memory: the dense weights, their optimizer's
  state and the step. Not the PS: rows and optimizer slots of the embedding tables live on the
  parameter servers, which keep every sparse update that landed, the lost worker's and the
  rolled-back steps' included (G-Meta's sparse updates are asynchronous anyway). Redone steps
  apply their sparse updates once more; the dense replicas are rolled back exactly.
* ``run_elastic``'s translation of a failed step into Horovod's ``HorovodInternalError``: by the
  exception's type (``failures.is_peer_failure``) and the PS answering, not by the op name in its
  text (Horovod's ``hvd.elastic.run`` matches ``HorovodAllreduce`` in the message, which our
  grouped all-reduce inside a compiled step does not carry). A lost PS is not a lost worker: it
  stays a ``ClusterFaultError``, every rank exits, and the launcher restarts from the checkpoint.

After a reset the ring is smaller: the loop (``trainer._loop``) re-reads rank and size, and each
rank reads shard ``rank`` of ``size`` of the training files from the committed step's batch on.
"""
from __future__ import annotations

from typing import Callable, List, Mapping, Sequence

import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from gmeta_tf.config.schema import ConfigError

ELASTIC_ENV = "HOROVOD_ELASTIC"  # "1" on every rank an elastic horovodrun starts (horovod/runner/gloo_run.py)


def require_elastic_ring(env: Mapping[str, str]) -> None:
    """``cluster.elastic`` needs ranks started by Horovod's elastic driver: without it there is no
    ring to re-form, and a lost worker would leave the survivors waiting for a rendezvous that
    never comes. Checked before anything is built."""
    if env.get(ELASTIC_ENV) != "1":
        raise ConfigError("config key 'cluster.elastic': needs workers started by an elastic horovodrun "
                          "(gmeta launch local --elastic, or horovodrun --min-np/--max-np with "
                          f"--host-discovery-script); this process was not ({ELASTIC_ENV} is not 1)")


class DenseCommit(ObjectState):
    """Dense weights, their optimizer's state and ``step`` as of the last ``commit``.

    ``sync``: the runtime's ``HorovodSync`` (rank 0's copy is broadcast at every (re)start)."""

    def __init__(self, sync, variables: Sequence[tf.Variable], step: int):
        self._hvd_sync = sync
        self._variables = list(variables)
        self._saved = self._copy()
        super().__init__(bcast_object=sync.broadcast_object, get_rank=lambda: sync.rank, step=step)

    def _copy(self) -> List[np.ndarray]:
        return [np.array(v.numpy(), copy=True) for v in self._variables]

    def commit_step(self, step: int) -> None:
        """Copy the state as it is after ``step``; raises ``HostsUpdatedInterrupt`` on every rank
        alike when the driver changed the hosts (Horovod's ``State.commit``)."""
        self.step = step
        self.commit()

    def save(self) -> None:
        self._saved = self._copy()
        super().save()

    def restore(self) -> None:
        for v, value in zip(self._variables, self._saved):
            v.assign(value)
        super().restore()

    def sync(self) -> None:
        self._hvd_sync.broadcast_variables(self._variables)
        self._saved = self._copy()
        super().sync()


def run_elastic(state: DenseCommit, train_from: Callable[[DenseCommit], None], lost_peer: Callable[[Exception], bool],
                reset: Callable[[], None]) -> None:
    """``train_from(state)`` under Horovod Elastic: a failure ``lost_peer`` says a peer worker
    caused restores the last commit, ``reset``s the ring and calls ``train_from`` again (after
    rank 0's state is broadcast); any other exception ends the rank as before."""
    def attempt(s: DenseCommit) -> None:
        try:
            train_from(s)
        except HorovodInternalError:
            raise
        except Exception as e:
            if lost_peer(e):
                raise HorovodInternalError(e) from e
            raise

    run_fn(attempt, reset)(state)
