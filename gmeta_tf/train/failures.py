"""What a failed distributed step means, in one line that names the process at fault.

A step with parameter servers fails in this rank for reasons that live elsewhere: a PS that
died, a PS that was restarted behind the same address (a rescheduled pod), a peer worker that
stopped answering in the all-reduce. TensorFlow reports each as a gRPC status whose first line
is "Graph execution error:"; the cause is further down. These are faults of the cluster, not of
the job's settings, so they are ``ClusterFaultError``: the exit code says "retry", and a
restart (``gmeta launch local --max-restarts``, a TFJob's restart policy) resumes from the last
checkpoint.

A PS restarted at the same address answers connections but holds none of the tables, and the
worker's remote context on it is gone (TensorFlow gives every server process a new context
id), so the next request fails instead of training against empty tables
(``tests/faults/test_restarts.py`` pins that). The message says so when the PS answers again.
"""
from __future__ import annotations

import re
import time
from typing import List

import tensorflow as tf

from gmeta_tf.embedding.devices import ps_tasks_named
from gmeta_tf.errors import ClusterFaultError, tf_error_first_cause
from gmeta_tf.train.runtime import Runtime, reachable

# What a lost PS or a stalled / killed peer rank raises in this rank, inside the step or in any
# collective after it (the logged throughput's all-reduce, the validation verdict's broadcast,
# the checkpoint's hot-row sync): the trainer turns them into ``step_failure_error``'s one line.
PEER_FAILURES = (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError,
                 tf.errors.InternalError, tf.errors.UnknownError, tf.errors.NotFoundError,
                 tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError)
_COLLECTIVE = re.compile(r"horovod|gloo|allreduce|allgather|broadcast|collective", re.I)
_RESUME = "re-run with the same --out to resume from the last checkpoint"


def is_peer_failure(e: Exception, rt: Runtime) -> bool:
    """Whether ``e`` may be the cluster's doing. Argument and precondition errors are also a
    model's own bugs, so they count only while some PS no longer answers as it did (down, or
    named in the message of a step that talks to it)."""
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


def _cause(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    return (tf_error_first_cause(text) or type(e).__name__)[:300]


def step_failure_error(e: Exception, rt: Runtime, step: int) -> ClusterFaultError:
    """A failed step with parameter servers: a dead or restarted PS, or a peer worker that
    stopped answering.

    A stalled or killed peer rank makes this rank's dense all-reduce (Horovod over Gloo) time
    out; blaming the PS then sends the user to restart a healthy process. So the PS are probed
    first: one that refuses connections is the culprit (``lost_ps_error``); with every PS
    answering and the failure inside a collective, the peer ranks are named instead.
    """
    text = str(e)
    if rt.size < 2 or not _COLLECTIVE.search(text) or down_ps(rt):
        return lost_ps_error(e, rt, step)
    peers = [r for r in range(rt.size) if r != rt.rank]
    who = f"worker rank {peers[0]}" if len(peers) == 1 else "one of worker ranks " + ", ".join(map(str, peers))
    return ClusterFaultError(
        f"rank {rt.rank}: {who} stopped answering in a collective (all-reduce / broadcast) at step {step} "
        f"(every PS answers: {', '.join(rt.ps_addresses)}): {_cause(e)}. Check that worker (stopped, "
        f"hung or killed?); {_RESUME}")


def lost_ps_error(e: Exception, rt: Runtime, step: int) -> ClusterFaultError:
    """Turn a gRPC failure inside the step into one line that names the parameter server.

    The error text of a partitioned step may name every PS the step was talking to, the healthy
    ones too, so the PS that no longer accepts connections is the one named. When every PS
    accepts connections again, the one the error names was restarted (its tables are empty and
    this worker's context on it is gone): that is said, with TensorFlow's own cause.
    """
    text = str(e)
    down = down_ps(rt)
    tasks = down or ps_tasks_named(text)
    named = [f"ps:{t} ({rt.ps_addresses[t]})" for t in tasks if t < len(rt.ps_addresses)]
    who = ", ".join(named) or "a parameter server (" + ", ".join(rt.ps_addresses) + ")"
    state = "" if down else (" (it answers again: restarted, so its tables are gone; training "
                             "against it would start from empty rows)")
    return ClusterFaultError(f"rank {rt.rank}: lost {who} at step {step}{state}: {_cause(e)}. "
                             f"Restart the PS and {_RESUME}")
