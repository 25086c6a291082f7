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
* none of these: the error is this rank's own, and it is raised as it is (not retryable).

Faults of the cluster are ``ClusterFaultError``: the exit code says "retry", and a restart
(``gmeta launch local --max-restarts``, a TFJob's restart policy) resumes from the last
checkpoint. Where no peer's record can be read (a TFJob's pods each keep their own), the peers
cannot be asked: a collective's failure with every PS answering is then still laid on them, as
before (``is_peer_failure``).
"""
from __future__ import annotations

import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import tensorflow as tf

from gmeta_tf import exit_codes
from gmeta_tf.embedding.devices import ps_device, ps_tasks_named
from gmeta_tf.errors import ClusterError, ClusterFaultError, tf_error_first_cause
from gmeta_tf.process import process_start_unix
from gmeta_tf.train.fault_pause import PausePoint
from gmeta_tf.train.rank_status import ExitReason, RankStatus, read_processes
from gmeta_tf.train.runtime import Runtime, reachable

# What a lost PS or a stalled / killed peer rank raises in this rank, inside the step or in any
# collective after it (the logged throughput's all-reduce, the validation verdict's broadcast,
# the checkpoint's hot-row sync). Only these are looked into; anything else is this rank's own.
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
                 tf.errors.InternalError, tf.errors.UnknownError, tf.errors.NotFoundError,
                 tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError)
# What a dropped connection raises (a peer gone mid-collective, a PS gone mid-request); argument
# and precondition errors are a model's own unless a probe finds a PS restarted.
TRANSPORT_FAILURES = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
                      tf.errors.InternalError, tf.errors.UnknownError)
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


def is_peer_failure(e: Exception, rt: Runtime) -> bool:
    """The rule before issue 52, from the exception's type and text: whether ``e`` may be the
    cluster's doing. Not used to blame any more (``step_failure`` asks the PS and the peers);
    kept for callers that only want to know whether a failure is worth looking into."""
    if not isinstance(e, PEER_FAILURES) or not rt.ps_tasks:
        return False
    if isinstance(e, (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError, tf.errors.NotFoundError)):
        return bool(re.search(r"/job:ps|context|[Cc]ontext_id|[Uu]navailable", str(e)))
    return True


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


def _process_gone(pid: int) -> Optional[str]:
    """Why this host's process ``pid`` no longer takes part: "gone", "stopped", or None (runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    return {"Z": "gone", "X": "gone", "T": "stopped", "t": "stopped"}.get(state)


def _peer_records(directory: Optional[str], me: RankStatus) -> List[RankStatus]:
    return [r for r in read_processes(directory) if r.pid != os.getpid() and
            not (r.process is not None and r.process == me.process) and not (me.process is None and r.rank == me.rank)]


def peer_evidence(directory: Optional[str], me: RankStatus, since_unix: float, ring_step: Optional[int] = None,
                  settle_s: float = PEER_SETTLE_S, poll_s: float = 0.1) -> PeerEvidence:
    """The peers of this rank that are gone or failed, from their status records in
    ``directory`` and, on this host, their processes. ``since_unix``: an exit counts when it is
    this late (this process's start, or an elastic ring's last re-forming: a peer lost before was
    the ring's business then). ``ring_step``: an elastic ring's last entry, whose members' records
    say so (``ring``); None without elastic. Asked again for ``settle_s`` while nothing shows."""
    host = socket.gethostname()
    deadline = time.monotonic() + settle_s
    while True:
        peers = _peer_records(directory, me)
        gone, failed = [], []
        for r in peers:
            if r.exit is not None:
                if r.updated_unix >= since_unix:
                    (failed if r.exit.reason in OWN_FAILURES else gone).append(r)
                continue
            member = (r.ring and r.ring[-1][0] == ring_step) if ring_step is not None else \
                r.updated_unix >= since_unix - START_SKEW_S
            if member and r.host == host and _process_gone(r.pid):
                gone.append(r)
        if gone or failed or time.monotonic() >= deadline or not peers:
            return PeerEvidence(gone, failed, visible=bool(peers))
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
    PS and the peers say (module docstring); None when nothing elsewhere is at fault: ``e`` is
    this rank's own and is raised as it is. ``directory``/``me``: the ranks' status records and
    this rank's own (None: no peer can be asked)."""
    if not isinstance(e, PEER_FAILURES) or not rt.ps_tasks:
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
    ev = peer_evidence(directory, me, since, ring_step) if directory and me is not None else PeerEvidence()
    if ev.gone:
        return lost_peer_error(e, rt, step, ev.gone)
    if ev.failed:
        return peer_failed_error(e, rt, step, ev.failed[0])
    if ev.visible:
        return None  # every peer runs: the error is this rank's own
    # No peer's record in reach (a TFJob's pods each keep their own): the peers cannot be asked,
    # and with every PS fine a dropped connection can only be theirs.
    return step_failure_error(e, rt, step) if isinstance(e, TRANSPORT_FAILURES) else None


def lost_peer(e: Exception, rt: Runtime, step: int, directory: Optional[str], me: RankStatus,
              since_unix: Optional[float], ring_step: Optional[int]) -> bool:
    """An elastic ring's test: a peer is really gone (its record or its process says so) and
    every PS answers; a lost PS is not the ring's to absorb. A peer that ended with an error of
    its own ends this rank too (``PeerFailed``, raised). Horovod's own ``HorovodInternalError``
    (a collective it saw fail) stays a lost peer unless a peer says otherwise."""
    from horovod.common.exceptions import HorovodInternalError

    horovod = isinstance(e, HorovodInternalError)
    if not horovod and (not isinstance(e, PEER_FAILURES) or down_ps(rt)):
        return False
    ev = peer_evidence(directory, me, process_start_unix() if since_unix is None else since_unix, ring_step)
    if ev.gone:
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


def step_failure_error(e: Exception, rt: Runtime, step: int) -> ClusterFaultError:
    """A failed step where no peer can be asked (their records are out of reach), every PS
    answering: the peer ranks are named (a stalled or killed peer makes this rank's dense
    all-reduce time out; blaming the PS would send the user to restart a healthy process).
    Without peers, or with a PS down, the PS (``lost_ps_error``)."""
    if rt.size < 2 or down_ps(rt):
        return lost_ps_error(e, rt, step)
    peers = [r for r in range(rt.size) if r != rt.rank]
    who = f"worker rank {peers[0]}" if len(peers) == 1 else "one of worker ranks " + ", ".join(map(str, peers))
    return ClusterFaultError(
        f"rank {rt.rank}: {who} stopped answering in a collective (all-reduce / broadcast) at step {step} "
        f"(every PS answers: {', '.join(rt.ps_addresses)}): {_cause(e)}. Check that worker (stopped, "
        f"hung or killed?); {_RESUME}")


def lost_ps_error(e: Exception, rt: Runtime, step: int, tasks: Optional[List[int]] = None,
                  restarted: bool = False) -> ClusterFaultError:
    """Turn a gRPC failure inside the step into one line that names the parameter server.

    ``tasks``: the PS the probes found down, or ``restarted`` (``step_failure``); without them, the PS
    that no longer accepts connections, else the one the error names. When every PS accepts
    connections again, the one at fault was restarted (its tables are empty and this worker's
    context on it is gone): that is said, with TensorFlow's own cause.
    """
    if tasks is None:
        down = down_ps(rt)
        tasks, restarted = down or ps_tasks_named(str(e)), not down
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
