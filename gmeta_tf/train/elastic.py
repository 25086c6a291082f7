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
* ``run_elastic``'s translation of a failed step into Horovod's ``HorovodInternalError``: by what
  the peers' records and processes say and the PS answering (``failures.lost_peer``), not by the
  op name in its text (Horovod's ``hvd.elastic.run`` matches ``HorovodAllreduce`` in the message, which our
  grouped all-reduce inside a compiled step does not carry). A lost PS is not a lost worker: it
  stays a ``ClusterFaultError``, every rank exits, and the launcher restarts from the checkpoint.

After a reset the ring is smaller: the loop (``step_loop.StepLoop.train_from``) re-reads rank and size, and each
rank reads shard ``rank`` of ``size`` of the training files from the committed step's batch on.

**Re-growing** (``cluster.elastic_cooldown_s``): once a lost worker's host has cooled down,
horovodrun's driver tells rank 0, rank 0's next commit raises ``HostsUpdatedInterrupt`` on every
rank, they re-form and the driver starts a new worker on that host. Horovod's contract for such a
joiner (``horovod/tensorflow/elastic.py``'s ``run``): no collective before ``run_fn``, or it meets
the others' ``state.sync()`` and both hang. So with ``cluster.elastic`` the start-up does none, for
every rank alike (a process cannot tell whether it starts a ring or joins one): rank 0 goes first
through ``StartGate`` (files, not a barrier) where it must (the first eager context on each PS, the
tables' creation), rank 0 alone restores, and ``DenseCommit.sync`` (the first thing ``run_fn`` does)
hands everyone rank 0's dense weights, optimizer state, step, start and end.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Callable, List, Mapping, Optional, Sequence, TypeVar

import numpy as np
import tensorflow as tf
from horovod.common.elastic import ObjectState, run_fn
from horovod.common.exceptions import HorovodInternalError

from gmeta_tf import exit_codes
from gmeta_tf.atomic_file import replace_file
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.errors import ClusterError
from gmeta_tf.process import process_start_unix
from gmeta_tf.train.rank_status import START_GATE_PREFIX
from gmeta_tf.train.rank_status import read as read_status

ELASTIC_ENV = "HOROVOD_ELASTIC"  # "1" on every rank an elastic horovodrun starts (horovod/runner/gloo_run.py)
# The driver's rendezvous server, the same for every worker one horovodrun starts, joiners included.
RENDEZVOUS_ENV = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT")
START_GATE_TIMEOUT_S = 600.0  # Horovod's own elastic time-out (HOROVOD_ELASTIC_TIMEOUT's default)
T = TypeVar("T")


def require_elastic_ring(env: Mapping[str, str]) -> None:
    """``cluster.elastic`` needs ranks started by Horovod's elastic driver: without it there is no
    ring to re-form, and a lost worker would leave the survivors waiting for a rendezvous that
    never comes. Checked before anything is built."""
    if env.get(ELASTIC_ENV) != "1":
        raise ConfigError("config key 'cluster.elastic': needs workers started by an elastic horovodrun "
                          "(gmeta launch local --elastic, or horovodrun --min-np/--max-np with "
                          f"--host-discovery-script); this process was not ({ELASTIC_ENV} is not 1)")


class JobNonce:
    """One value every rank of one horovodrun job shares and the next job in the same run directory
    does not: rank 0 makes it at start and keeps it in the driver's rendezvous store (Horovod's
    key-value HTTP server, the one ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT`` name), which lives
    exactly as long as the job. Why not the rendezvous address and port alone: Horovod picks the
    port at random (``find_port``), so a later job can get the port of an earlier one, and its
    ranks would then take that job's gates for their own.

    The driver empties its store whenever it re-forms the ring (``RendezvousHTTPServer.init``), so
    rank 0 of each ring publishes again after every reset (``run_elastic``) and a joiner waits
    for it, as it waits for the gates."""

    SCOPE, KEY = "gmeta", "job_nonce"

    def __init__(self, addr: str, port: int, timeout_s: float = 3.0):
        self.addr, self.port, self.timeout_s = addr, port, timeout_s
        self.value: Optional[str] = None  # this job's, once made (rank 0) or read (another rank)

    def _request(self, method: str, body: Optional[bytes] = None) -> Optional[bytes]:
        """OSError when no HTTP server of Horovod's answers there."""
        import http.client

        conn = http.client.HTTPConnection(self.addr, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, f"/{self.SCOPE}/{self.KEY}", body=body,
                         headers={"Content-Length": str(len(body or b""))})
            resp = conn.getresponse()
            data = resp.read()
            return data if resp.status == 200 else None
        except http.client.HTTPException as e:  # something else listens there
            raise OSError(f"not a rendezvous server: {e!r}") from None
        finally:
            conn.close()

    def publish(self, value: Optional[str] = None) -> None:
        """Rank 0: make this job's nonce (first call) and put it in the driver's store."""
        import uuid

        self.value = self.value or value or uuid.uuid4().hex
        self._request("PUT", self.value.encode())

    def current(self) -> Optional[str]:
        """The job's nonce as the driver holds it now; None until rank 0 published it (again)."""
        try:
            data = self._request("GET")
        except OSError:
            return None
        if data:
            self.value = data.decode()
        return data.decode() if data else None


class StartGate:
    """"Rank 0 first" for an elastic ring's start-up, without a collective.

    Why not ``sync.barrier()``: a worker that joins a running ring (``cluster.elastic_cooldown_s``)
    must do no collective outside ``run_fn`` (module docstring), and a process cannot tell whether
    it starts a ring or joins one. Rank 0 writes a gate file once its part is done; the others
    wait for the file, a joiner finds it there and goes on at once (Horovod keeps rank 0 on a host
    of the ring before, ``ElasticDriver._update_host_assignments``, so a joiner is never rank 0).
    The gates live in the ranks' status directory (the launcher clears them with the records, a
    plain horovodrun does not) and are named after the horovodrun job (its rendezvous server's
    address and port). Each gate carries the job's ``JobNonce``: a gate whose nonce is not the
    driver's (an earlier job that happened to get the same port, in the same run directory) is
    not open, so its PS and tables, maybe new, are never reached before this job's rank 0 made
    them. ``nonce`` None (no driver answers at the rendezvous address): gates by name alone."""

    def __init__(self, directory: str, job: str, timeout_s: float = START_GATE_TIMEOUT_S, poll_s: float = 0.05,
                 since_unix: Optional[float] = None, nonce: Optional[JobNonce] = None):
        self.directory, self.job, self.timeout_s, self.poll_s = directory, job, timeout_s, poll_s
        self.nonce = nonce
        # A rank 0 that exits before opening a gate (an unreachable PS, a bad input) leaves no
        # collective to fail in: its status record, written after this process started, says so.
        self.since_unix = process_start_unix() if since_unix is None else since_unix

    def path(self, gate: str) -> str:
        return os.path.join(self.directory, f"{START_GATE_PREFIX}{self.job}.{gate}")

    def rank0_first(self, rank: int, gate: str, work: Callable[[], T]) -> T:
        """``work()`` on rank 0, then the gate opens; on every other rank ``work()`` once it is open."""
        if rank == 0:
            out = work()
            if self.nonce is not None:
                self.nonce.publish()
            os.makedirs(self.directory, exist_ok=True)
            replace_file(self.path(gate), json.dumps({"pid": os.getpid(), "at_unix": time.time(),
                                                      "nonce": None if self.nonce is None else self.nonce.value}))
            return out
        self.wait(gate)
        return work()

    def after_reset(self, rank: int) -> None:
        """Rank 0 of a re-formed ring puts the job's nonce back in the driver's store (emptied
        when the ring re-formed), so a joiner can tell this job's gates from an earlier one's."""
        if rank == 0 and self.nonce is not None and self.nonce.value is not None:
            try:
                self.nonce.publish()
            except OSError:
                pass  # no driver any more: the ring is ending, and nobody joins

    def is_open(self, gate: str) -> bool:
        """The gate exists and, with a nonce, was opened by this job's rank 0."""
        try:
            with open(self.path(gate)) as f:
                opened_by = json.load(f).get("nonce")
        except FileNotFoundError:
            return False
        except (OSError, ValueError, AttributeError):
            return False  # half a file, or another version's: not this job's
        if self.nonce is None:
            return True
        current = self.nonce.value or self.nonce.current()
        return opened_by is not None and opened_by == current

    def wait(self, gate: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self.is_open(gate):
            leader = read_status(self.directory, 0)
            if leader is not None and leader.exit is not None and leader.updated_unix >= self.since_unix:
                raise ClusterError(f"elastic start-up: rank 0 exited before opening the start gate '{gate}' "
                                   f"({leader.exit.message})")
            if time.monotonic() > deadline:
                raise ClusterError(f"elastic start-up: rank 0 did not open the start gate '{gate}' ({self.path(gate)}) "
                                   f"within {self.timeout_s:.0f} s; did rank 0 fail while starting?")
            time.sleep(self.poll_s)


def start_gate(env: Mapping[str, str], directory: Optional[str]) -> StartGate:
    """This horovodrun job's ``StartGate`` in ``directory`` (the ranks' status directory), with
    the job's nonce when the driver's rendezvous store answers (rank 0, ``HOROVOD_RANK`` 0 at
    start, makes and publishes it before anything else of the job can look for a gate)."""
    if not directory:
        raise ConfigError("config key 'cluster.elastic': needs a status directory for its start-up gates: a local "
                          "run directory (--out) or GMETA_STATUS_DIR (gmeta launch local sets it)")
    addr, port = (env.get(k, "") for k in RENDEZVOUS_ENV)
    nonce = None
    if addr and port.isdigit():
        nonce = JobNonce(addr, int(port))
        try:
            if env.get("HOROVOD_RANK", "0") == "0":
                nonce.publish()
            else:
                nonce._request("GET")
        except OSError:
            nonce = None  # no driver serves this address: nothing to share a nonce through
    return StartGate(directory, re.sub(r"[^A-Za-z0-9.-]", "_", f"{addr}-{port}"), nonce=nonce)


class DenseCommit(ObjectState):
    """Dense weights, their optimizer's state and ``step`` as of the last ``commit``, and the run's
    ``start`` (the step it resumed after) and ``end`` (the step it trains to): rank 0 alone knows
    those two at start-up (it alone restores), and ``sync`` hands them to every rank.

    ``sync``: the runtime's ``HorovodSync`` (rank 0's copy is broadcast at every (re)start)."""

    def __init__(self, sync, variables: Sequence[tf.Variable], step: int, start: int = 0, end: int = 0):
        self._hvd_sync = sync
        self._variables = list(variables)
        self._saved = self._copy()
        super().__init__(bcast_object=sync.broadcast_object, get_rank=lambda: sync.rank, step=step, start=start,
                         end=end)

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


class ResetLimitExceeded(ClusterError):
    """An elastic ring failed again after ``cluster.elastic_reset_limit`` re-formings: whatever
    fails keeps failing, and another rollback would only repeat it. Not retried."""

    exit_code = exit_codes.FAILED.code


def run_elastic(state: DenseCommit, train_from: Callable[[DenseCommit], None], lost_peer: Callable[[Exception], bool],
                reset: Callable[[], None], reset_limit: Optional[int] = None) -> None:
    """``train_from(state)`` under Horovod Elastic: a failure ``lost_peer`` says a peer worker
    caused (or Horovod's own ``HorovodInternalError``) restores the last commit, ``reset``s the
    ring and calls ``train_from`` again (after rank 0's state is broadcast); any other exception
    ends the rank as before (``lost_peer`` may raise the one to end it with). Horovod's ``run_fn`` would do that for ever: past ``reset_limit``
    such failures the rank ends with ``ResetLimitExceeded``, naming the last one (horovodrun's
    ``--reset-limit`` bounds the driver's side, this each rank's)."""
    resets = 0

    def attempt(s: DenseCommit) -> None:
        nonlocal resets
        try:
            train_from(s)
            return
        except HorovodInternalError as e:
            lost_peer(e)  # may end the rank itself (a peer failed on its own); else Horovod's verdict stands
            cause: Exception = e
        except Exception as e:
            if not lost_peer(e):
                raise
            cause = e
        if reset_limit is not None and resets >= reset_limit:
            raise ResetLimitExceeded(f"elastic: the ring re-formed {resets} time(s) (cluster.elastic_reset_limit: "
                                     f"{reset_limit}) and failed again: {type(cause).__name__}: "
                                     f"{str(cause).strip()[:500]}") from cause
        resets += 1
        raise HorovodInternalError(cause) from cause

    run_fn(attempt, reset)(state)
