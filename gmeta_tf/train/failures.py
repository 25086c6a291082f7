"""What a failed distributed step means, in one line that names the process at fault.

A step with parameter servers fails in this rank for reasons that live elsewhere: a PS that
died, a PS that was restarted behind the same address (a rescheduled pod), a peer worker that
died or stopped. Or for a reason of its own: a bug, a bad value. TensorFlow reports all of them
as gRPC statuses of a handful of types, and the type says nothing about who is at fault: an
``InternalError`` is a dropped connection one time and a kernel's own failure the next. So the
blame comes from what the other processes say, asked after the failure (``step_failure``):

* a PS that refuses connections is lost (``down_ps``);
* a PS that answers but no longer holds this worker's eager context was restarted: its tables
  are empty (``ps_contexts_lost`` runs one op there; TensorFlow gives every server process a
  new context id, so the op fails);
* a peer whose status record says it exited, or whose process on this host is gone or stopped,
  is lost (``peer_evidence``); a peer that exited with an error of its own is not lost, the job
  failed there (``PeerFailed``);
* worker 0's Gloo rendezvous (a TFJob's: worker 0 serves it for its life) refusing connections
  says worker 0 is gone, where its record cannot (``Runtime.rank0_rendezvous``);
* every peer's record says it runs and its process does (same host): the error is this rank's
  own, and it is raised as it is (not retryable);
* no answer either way (no peer record in reach: a run directory on an object store, a TFJob
  without a shared disk; or peers on other hosts, whose processes cannot be looked at): who is at
  fault is unknown, and the job fails with a non-retryable code naming the error
  (``PeersUnknown``). Retrying on a guess would restart a rank's own error for ever (a TFJob's
  ``restartPolicy: ExitCode`` restarts 200).

Faults of the cluster are ``ClusterFaultError``: the exit code says "retry", and a restart
(``gmeta launch local --max-restarts``, a TFJob's restart policy) resumes from the last
checkpoint. Neither the exception's type nor its text decides any of this: every failure is
looked into, and only the answers blame (the text is quoted, never read).
"""
from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import tensorflow as tf

from gmeta_tf import exit_codes
from gmeta_tf.embedding.devices import ps_device
from gmeta_tf.errors import ClusterError, ClusterFaultError, UserError, tf_error_first_cause
from gmeta_tf.process import process_start_unix
from gmeta_tf.train.fault_pause import PausePoint
from gmeta_tf.train.rank_status import ExitReason, RankStatus, read_processes
from gmeta_tf.train.runtime import Runtime, reachable

_RESUME = "re-run with the same --out to resume from the last checkpoint"
# A peer's exits that are its own failure, not its loss: the job failed there.
OWN_FAILURES = (ExitReason.CRASHED, ExitReason.USER_ERROR)
# How long after a failed collective a peer's death can take to show (its agent reaps it, then
# writes its record; a process being torn down still answers for a moment).
PEER_SETTLE_S = 3.0
# A record without an exit whose process is gone counts only if written about this job's start
# (ranks start within this of each other): an older one is a job that ended before this one.
START_SKEW_S = 300.0
PROBE_TIMEOUT_S = 5.0

FAIL_ENV = "GMETA_FAIL_FROM_STEP"  # test-only: "STEP[:RANK]": raise an InternalError at every step from STEP on


class PeerFailed(ClusterError):
    """A peer rank ended with an error of its own (a bug, bad input): this rank's failed
    collective is its consequence. Not a fault of the cluster, so not retried."""

    exit_code = exit_codes.FAILED.code


class PeersUnknown(ClusterError):
    """A failed step or collective with every PS answering, where no peer could be asked whether
    it is gone (module docstring). Not retried: it may be this rank's own error."""

    exit_code = exit_codes.FAILED.code


def looked_into(e: BaseException) -> bool:
    """Whether a failure may have its cause in another process, so that the PS and the peers are
    asked: anything but gmeta's own typed errors, which already say whose they are (a
    ``UserError`` names its file or address, a ``ClusterFaultError`` its PS, ``Preempted`` its
    signal). Not a verdict: the answers decide."""
    return isinstance(e, Exception) and not isinstance(e, UserError)


def down_ps(rt: Runtime, settle_s: float = 2.0) -> List[int]:
    """The PS tasks that refuse connections. A PS killed a moment ago can still accept one while
    the kernel tears the process down (a PS holding large tables takes a while to die), so when
    every PS answers, they are asked once more after ``settle_s``: only a PS that answers both
    times is up (or, after a failed step, was restarted)."""
    down = [t for t, addr in enumerate(rt.ps_addresses) if not reachable(addr)]
    if down or not rt.ps_addresses:
        return down
    time.sleep(settle_s)
    return [t for t, addr in enumerate(rt.ps_addresses) if not reachable(addr)]


def ps_contexts_lost(rt: Runtime, timeout_s: float = PROBE_TIMEOUT_S) -> Tuple[List[int], List[int]]:
    """The PS tasks that accept connections but refuse this worker's eager context (restarted:
    their tables are gone), and those that give no answer within ``timeout_s`` (hung, stopped).
    One scalar op on each. A PS this worker never connected to has nothing to lose."""
    lost, silent = [], []
    known = {d.name for d in tf.config.list_logical_devices()}
    for t in range(rt.ps_tasks):
        if ps_device(t) not in known:
            continue  # never connected to it: there is no context of this worker's to lose
        result: list = []

        def probe(task: int = t) -> None:
            try:
                with tf.device(ps_device(task)):
                    value = tf.constant(1) + 1
                result.append(int(value.numpy()) == 2)
            except (tf.errors.OpError, RuntimeError, ValueError):
                result.append(False)

        th = threading.Thread(target=probe, daemon=True)
        th.start()
        th.join(timeout_s)
        if not result:
            silent.append(t)
        elif not result[0]:
            lost.append(t)
    return lost, silent


@dataclass(frozen=True)
class PeerEvidence:
    """What the peers' records and processes say after a failed collective. ``visible``: whether
    any peer's record could be read at all (else nothing can be said of them)."""

    gone: List[RankStatus] = field(default_factory=list)  # exited, or its process is gone / stopped
    failed: List[RankStatus] = field(default_factory=list)  # exited with an error of its own
    visible: bool = False
    # running on another host: their records say they run, their processes cannot be looked at
    unverified: List[RankStatus] = field(default_factory=list)
    rank0_gone: bool = False  # worker 0's rendezvous (``Runtime.rank0_rendezvous``) refuses connections


def _process_gone(pid: int) -> Optional[str]:
    """Why this host's process ``pid`` no longer takes part: "gone", "stopped", or None (runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return {"Z": "gone", "X": "gone", "T": "stopped", "t": "stopped"}.get(state)


def _peer_records(directory: Optional[str], me: Optional[RankStatus]) -> List[RankStatus]:
    if not directory or me is None:
        return []
    return [r for r in read_processes(directory) if r.pid != os.getpid() and
            not (r.process is not None and r.process == me.process) and not (me.process is None and r.rank == me.rank)]


def peer_evidence(directory: Optional[str], me: Optional[RankStatus], since_unix: float,
                  ring_step: Optional[int] = None, rank0_rendezvous: Optional[str] = None,
                  settle_s: float = PEER_SETTLE_S, poll_s: float = 0.1) -> PeerEvidence:
    """The peers of this rank that are gone or failed, from their status records in
    ``directory`` and, on this host, their processes; and whether worker 0's rendezvous
    (``rank0_rendezvous``, None where worker 0 serves none) still accepts connections.
    ``since_unix``: an exit counts when it is this late (this process's start, or an elastic
    ring's last re-forming: a peer lost before was the ring's business then). ``ring_step``: an
    elastic ring's last entry, whose members' records say so (``ring``); None without elastic.
    Asked again for ``settle_s`` while nothing shows; a record that explains worker 0's exit
    (written just after its rendezvous closes) is waited for that long too."""
    host = socket.gethostname()
    deadline = time.monotonic() + settle_s
    while True:
        peers = _peer_records(directory, me)
        gone, failed, unverified = [], [], []
        for r in peers:
            if r.exit is not None:
                if r.updated_unix >= since_unix:
                    (failed if r.exit.reason in OWN_FAILURES else gone).append(r)
                continue
            member = (r.ring and r.ring[-1][0] == ring_step) if ring_step is not None else \
                r.updated_unix >= since_unix - START_SKEW_S
            if not member:
                continue
            if r.host != host:
                unverified.append(r)
            elif _process_gone(r.pid):
                gone.append(r)
        if gone or failed:
            return PeerEvidence(gone, failed, visible=True)
        settled = time.monotonic() >= deadline
        # Without records nothing can contradict the rendezvous: it is asked at once.
        rank0_gone = rank0_rendezvous is not None and (settled or not peers) and not reachable(rank0_rendezvous)
        if rank0_gone or settled or (not peers and rank0_rendezvous is None):
            return PeerEvidence([], [], visible=bool(peers), unverified=unverified, rank0_gone=rank0_gone)
        time.sleep(poll_s)


def _cause(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    return (tf_error_first_cause(text) or type(e).__name__)[:300]


def _ring_rank(r: RankStatus) -> int:
    return r.ring_rank if r.ring_rank is not None else r.rank


def _how_gone(r: RankStatus) -> str:
    if r.exit is not None:
        return r.exit.message
    return f"process {r.pid} {_process_gone(r.pid) or 'gone'}"


def step_failure(e: Exception, rt: Runtime, step: int, directory: Optional[str] = None,
                 me: Optional[RankStatus] = None, since_unix: Optional[float] = None,
                 ring_step: Optional[int] = None) -> Optional[Exception]:
    """What to raise for ``e``, a failed step or collective with parameter servers, from what the
    PS and the peers say (module docstring); None when every peer runs and every PS answers: ``e``
    is this rank's own and is raised as it is. ``directory``/``me``: the ranks' status records and
    this rank's own (None: no peer's record can be read)."""
    if not looked_into(e) or not rt.ps_tasks:
        return None
    down = down_ps(rt)
    if down:
        return lost_ps_error(e, rt, step, tasks=down)
    lost_context, silent = ps_contexts_lost(rt)
    if lost_context:
        return lost_ps_error(e, rt, step, tasks=lost_context, restarted=True)
    if silent:
        return lost_ps_error(e, rt, step, tasks=silent)
    if rt.size < 2:
        return None
    since = process_start_unix() if since_unix is None else since_unix
    ev = peer_evidence(directory, me, since, ring_step, _rank0_rendezvous(rt))
    if ev.gone:
        return lost_peer_error(e, rt, step, ev.gone)
    if ev.failed:
        return peer_failed_error(e, rt, step, ev.failed[0])
    if ev.rank0_gone:
        return lost_rank0_error(e, rt, step)
    if ev.visible and not ev.unverified:
        return None  # every peer's record says it runs, and its process does: the error is this rank's own
    # It may be this rank's own (a bug): its traceback stays in the log, the one line replaces it.
    rt.log("".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip())
    return peers_unknown_error(e, rt, step, ev)


def _rank0_rendezvous(rt: Runtime) -> Optional[str]:
    return rt.rank0_rendezvous if rt.rank != 0 else None


def lost_peer(e: Exception, rt: Runtime, step: int, directory: Optional[str], me: RankStatus,
              since_unix: Optional[float], ring_step: Optional[int]) -> bool:
    """An elastic ring's test: a peer is really gone (its record or its process says so) and
    every PS answers; a lost PS is not the ring's to absorb. A peer that ended with an error of
    its own ends this rank too (``PeerFailed``, raised). Horovod's own ``HorovodInternalError``
    (a collective it saw fail) stays a lost peer unless a peer says otherwise."""
    from horovod.common.exceptions import HorovodInternalError

    horovod = isinstance(e, HorovodInternalError)
    if not horovod and (not looked_into(e) or down_ps(rt)):
        return False
    ev = peer_evidence(directory, me, process_start_unix() if since_unix is None else since_unix, ring_step,
                       _rank0_rendezvous(rt))
    if ev.gone or ev.rank0_gone:
        return True
    if ev.failed:
        raise peer_failed_error(e, rt, step, ev.failed[0]) from None
    return horovod


def peer_failed_error(e: Exception, rt: Runtime, step: int, r: RankStatus) -> PeerFailed:
    return PeerFailed(f"rank {rt.rank}: worker rank {_ring_rank(r)} (pid {r.pid}) failed at step {step}: "
                      f"{r.exit.message[:500]}; this rank's collective with it failed ({_cause(e)})")


def lost_peer_error(e: Exception, rt: Runtime, step: int, gone: List[RankStatus]) -> ClusterFaultError:
    """Peers whose records or processes say they are gone: named, with how."""
    ranks = sorted({_ring_rank(r) for r in gone})
    who = f"worker rank {ranks[0]}" if len(ranks) == 1 else "worker ranks " + ", ".join(map(str, ranks))
    how = "; ".join(f"pid {r.pid}: {_how_gone(r)}" for r in gone)
    return ClusterFaultError(
        f"rank {rt.rank}: {who} stopped answering in a collective (all-reduce / broadcast) at step {step} "
        f"({how}; every PS answers: {', '.join(rt.ps_addresses)}): {_cause(e)}. {_RESUME}")


def lost_rank0_error(e: Exception, rt: Runtime, step: int) -> ClusterFaultError:
    """Worker 0 gone, by its rendezvous: it serves it for its life (a TFJob's worker 0)."""
    return ClusterFaultError(
        f"rank {rt.rank}: worker rank 0 stopped answering in a collective (all-reduce / broadcast) at step {step} "
        f"(its Gloo rendezvous at {rt.rank0_rendezvous} refuses connections; every PS answers: "
        f"{', '.join(rt.ps_addresses)}): {_cause(e)}. {_RESUME}")


def peers_unknown_error(e: Exception, rt: Runtime, step: int, ev: PeerEvidence) -> PeersUnknown:
    """No answer blames a peer or the PS, and not every peer could be asked: the error named,
    not retried (module docstring)."""
    if ev.unverified:
        ranks = ", ".join(str(_ring_rank(r)) for r in sorted(ev.unverified, key=_ring_rank))
        hosts = ", ".join(sorted({str(r.host) for r in ev.unverified}))
        why = (f"worker rank(s) {ranks} run on other hosts ({hosts}): their records say they run, and their "
               "processes cannot be looked at from here")
    else:
        why = ("no peer's status record is in reach (the run directory is not on a disk the workers share; "
               "GMETA_STATUS_DIR can name one)")
    return PeersUnknown(
        f"rank {rt.rank}: step {step} failed with every PS answering ({', '.join(rt.ps_addresses)}): {_cause(e)}. "
        f"Whether a peer worker was lost cannot be told: {why}. Not retried, as it may be this rank's own "
        f"error; if a worker was lost, {_RESUME}")


def lost_ps_error(e: Exception, rt: Runtime, step: int, tasks: List[int], restarted: bool = False) -> ClusterFaultError:
    """A failed step as one line that names the parameter servers the probes found at fault
    (``step_failure``): ``tasks``, down or silent, or ``restarted`` (they answer again, but this
    worker's context on them is gone, and with it their tables), with TensorFlow's own cause.
    """
    named = [f"ps:{t} ({rt.ps_addresses[t]})" for t in tasks if t < len(rt.ps_addresses)]
    who = ", ".join(named) or "a parameter server (" + ", ".join(rt.ps_addresses) + ")"
    state = "" if not restarted else (" (it answers again: restarted, so its tables are gone; training "
                             "against it would start from empty rows)")
    return ClusterFaultError(f"rank {rt.rank}: lost {who} at step {step}{state}: {_cause(e)}. "
                             f"Restart the PS and {_RESUME}")


def injected_failure(env=os.environ) -> Optional[PausePoint]:
    """A fault test's trigger (``GMETA_FAIL_FROM_STEP``): the rank raises the same
    ``InternalError`` at every step from ``step`` on, its own, with every PS and peer up."""
    raw = env.get(FAIL_ENV, "").strip()
    if not raw:
        return None
    step, colon, rank = raw.partition(":")
    return PausePoint(int(step), int(rank) if colon else None)


def raise_injected(point: Optional[PausePoint], step: int, rank: int) -> None:
    if point is not None and step >= point.step and point.rank in (None, rank):
        raise tf.errors.InternalError(None, None, f"injected failure at step {step} (rank {rank}, {FAIL_ENV})")
