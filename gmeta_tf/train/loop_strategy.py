"""How the ranks of a run agree and stay together: a static ring, or Horovod Elastic's.

``cluster.elastic`` changes five things in a run, and only these: the environment must be an
elastic horovodrun's; no collective may run before Horovod's ``run_fn`` (a worker joining a
running ring would meet the others' ``state.sync()`` and both hang), so rank 0's start, its
early-stop state and its weights are not broadcast at start-up but handed out by
``DenseCommit.sync``; the steps run under ``run_elastic``, which rolls the survivors of a lost
worker back to the last commit; the loop commits after steps; and rank 0's summary names the
workers that joined. ``strategy_for`` picks one ``Strategy`` per run and the trainer's phases call
it, so no phase asks ``cfg.cluster.elastic`` itself. ``elastic.py`` (Horovod) is imported only by
the elastic strategy, when one runs.
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Protocol

from gmeta_tf.config.schema import Config
from gmeta_tf.train.built import Built
from gmeta_tf.train.failures import lost_peer
from gmeta_tf.train.loop_state import LoopState, RunContext
from gmeta_tf.train.rank_status import Phase
from gmeta_tf.train.runtime import Runtime

if TYPE_CHECKING:  # elastic.py imports Horovod: only an elastic run loads it
    from gmeta_tf.train.elastic import DenseCommit

TrainFrom = Callable[[int], None]  # StepLoop.train_from: steps ``begin+1 ..`` to the loop's end


class Strategy(Protocol):
    def check_environment(self) -> None: ...
    def agree(self, rt: Runtime, value: int) -> int: ...
    def share_start_state(self, rt: Runtime, built: Built) -> None: ...
    def run(self, ctx: RunContext, at: LoopState, train_from: TrainFrom) -> None: ...
    def commit(self, step: int) -> None: ...
    def joined(self, ctx: RunContext) -> List[dict]: ...


def strategy_for(cfg: Config) -> Strategy:
    return ElasticStrategy(cfg) if cfg.cluster.elastic else StaticStrategy()


class StaticStrategy:
    """A fixed set of ranks: rank 0's values and weights are broadcast at start-up, the steps run
    once from the start, and a lost rank ends the run (the launcher restarts it from a checkpoint)."""

    def check_environment(self) -> None:
        pass

    def agree(self, rt: Runtime, value: int) -> int:
        """Rank 0's ``value`` on every rank (the start step, whether the run already stopped)."""
        return rt.sync.broadcast_int(value)

    def share_start_state(self, rt: Runtime, built: Built) -> None:
        """Every replica starts from rank 0's dense weights, optimizer state and hot rows."""
        embeddings = built.model.embeddings
        if embeddings.hot is not None:
            embeddings.hot.check_same_everywhere(rt.sync)
        if rt.rank == 0:  # from the (restored) PS tables; the broadcast below hands them out
            embeddings.load_hot()
        rt.sync.broadcast_variables(list(built.model.dense_variables.values()) + list(built.dense_opt.variables)
                                    + embeddings.replicated_state())
        embeddings.start_hot_window()

    def run(self, ctx: RunContext, at: LoopState, train_from: TrainFrom) -> None:
        train_from(at.start)

    def commit(self, step: int) -> None:
        pass

    def joined(self, ctx: RunContext) -> List[dict]:
        return []


class ElasticStrategy:
    """Horovod Elastic (``elastic.py``): the dense weights, their optimizer state and the step are
    committed every ``train.elastic_commit_every`` steps (at the first call end at or past each
    multiple); a lost worker rolls the survivors back to the last commit and they go on as a
    smaller ring, reading their new shards of the data from that step on. A worker started on a
    returned host joins at a commit (``HostsUpdatedInterrupt`` on the others): it takes rank 0's
    state, step, start and end from the first sync and reads its shard from that step on. Each
    (re-)entry goes into this rank's status record (``ring``, ``joined_step``)."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.state: Optional[DenseCommit] = None  # made by ``run``
        self.entries: List[int] = []  # the step of each (re-)entry into a ring

    def check_environment(self) -> None:
        from gmeta_tf.train.elastic import require_elastic_ring

        require_elastic_ring(os.environ)

    def agree(self, rt: Runtime, value: int) -> int:
        """No collective before ``run_fn``: each rank keeps its own value for now; rank 0's start
        and end (its start when it had stopped) ride in ``DenseCommit.sync``."""
        return value

    def share_start_state(self, rt: Runtime, built: Built) -> None:
        """``DenseCommit.sync`` hands out rank 0's weights, inside ``run_fn`` (and there is no
        hot tier to share: ``Config._check_elastic``)."""
        built.model.embeddings.start_hot_window()

    def run(self, ctx: RunContext, at: LoopState, train_from: TrainFrom) -> None:
        from gmeta_tf.train.elastic import DenseCommit, run_elastic

        rt, built, watch = ctx.rt, ctx.built, ctx.watch
        self.state = DenseCommit(rt.sync, list(built.model.dense_variables.values()) + list(built.dense_opt.variables),
                                 at.step, start=at.start, end=at.end)

        def reset() -> None:
            rt.sync.reset()
            if rt.start_gate is not None:  # rank 0 of the new ring re-publishes the job's nonce (elastic.JobNonce)
                rt.start_gate.after_reset(rt.rank)

        run_elastic(self.state, lambda s: self._enter(ctx, at, s, train_from),
                    lambda e: lost_peer(e, rt, at.step, watch.status.directory, watch.status.status,
                                        at.since_unix, at.ring_step),
                    reset, self.cfg.cluster.elastic_reset_limit)

    def _enter(self, ctx: RunContext, at: LoopState, s: DenseCommit, train_from: TrainFrom) -> None:
        """One (re-)entry into a ring, at the commit ``s`` (rank 0's, just synced): the loop takes
        rank 0's start and end, the record says where this rank joined, then the steps run."""
        rt = ctx.rt
        joined = not self.entries and s.step > s.start  # this process's first ring was already training
        if self.entries:  # the ring re-formed: rank 0's commit is everyone's now
            at.history[:] = [h for h in at.history if h["step"] <= s.step]
            rt.log(f"elastic: the ring re-formed; {rt.size} worker(s) go on from the commit of step {s.step} "
                   f"(rank {rt.rank} of {rt.size}; global meta-batch {self.cfg.data.tasks_per_batch * rt.size} "
                   f"tasks); PS rows keep the updates that landed since")
        elif joined:
            rt.log(f"elastic: joined the running ring at the commit of step {s.step} as rank {rt.rank} of {rt.size} "
                   f"(global meta-batch {self.cfg.data.tasks_per_batch * rt.size} tasks); reading shard {rt.rank} of "
                   f"{rt.size} from there")
        at.start, at.end = s.start, s.end
        at.stopped = at.stopped or s.end < self.cfg.train.steps  # rank 0 had stopped early before this run
        self.entries.append(s.step)
        at.since_unix = time.time()
        at.ring.append([s.step, rt.rank, rt.size])
        ctx.watch.status.update(phase=Phase.TRAINING, step=s.step, start_step=s.start,
                                ring=[list(r) for r in at.ring], ring_rank=rt.rank,
                                **({"joined_step": s.step} if joined else {}))
        train_from(s.step)

    def commit(self, step: int) -> None:
        every = self.cfg.train.elastic_commit_every
        if step // every > self.state.step // every:
            self.state.commit_step(step)

    def joined(self, ctx: RunContext) -> List[dict]:
        """Rank 0: the workers that joined this elastic ring while it ran, from the ranks' status
        records (its summary says so): each one's pid, the commit it joined at and its first rank
        and size. The other ranks: none (only rank 0's summary has them)."""
        from gmeta_tf.train.rank_status import read_processes

        if ctx.rt.rank != 0:
            return []
        out = []
        for r in read_processes(ctx.watch.status.directory):
            if r.joined_step is not None and r.ring:
                out.append({"pid": r.pid, "step": r.joined_step, "rank": r.ring[0][1], "ranks": r.ring[0][2]})
        return sorted(out, key=lambda j: (j["step"], j["rank"]))

