"""Who is blamed for a failed step, from what the other processes say (issue 52, items 1 and 6).

A failed collective's exception type says nothing of who is at fault; the peers' status records
and their processes do: a peer that exited or stopped is lost (retry), a peer that failed on its
own failed the job (do not retry), peers that all run leave the error to this rank. Real
processes stand for the peers; a listening socket for a PS that answers."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from gmeta_tf import exit_codes
from gmeta_tf.errors import ClusterFaultError
from gmeta_tf.train import rank_status
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.elastic import DenseCommit, ResetLimitExceeded, run_elastic
from gmeta_tf.train.failures import PeerFailed, PeersUnknown, step_failure
from gmeta_tf.train.rank_status import ExitReason, Phase, RankExit, RankStatus
from gmeta_tf.train.runtime import Runtime


class _RankOfTwo(LocalSync):
    size = 2


class _RankOneOfTwo(LocalSync):
    rank, size = 1, 2


@pytest.fixture
def ps():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def peer():
    """A live process standing for rank 1."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def _records(d, me_pid, peer: RankStatus):
    rank_status.write(d, RankStatus(0, me_pid, Phase.TRAINING, updated_unix=time.time(), host=socket.gethostname()))
    rank_status.write(d, peer)
    return rank_status.read(d, 0)


ERR = tf.errors.InternalError(None, None, "the same failure at every step")


def test_a_peer_whose_record_says_it_was_killed_is_lost_and_retried(tmp_path, ps):
    d, since = str(tmp_path), time.time() - 1
    me = _records(d, os.getpid(), RankStatus(1, 4242, Phase.EXITED, updated_unix=time.time(), host="elsewhere",
                                             exit=RankExit(ExitReason.KILLED, 137, "killed by SIGKILL", "SIGKILL")))
    got = step_failure(ERR, Runtime(sync=_RankOfTwo(), ps_tasks=1, ps_addresses=[ps]), 30, d, me, since)
    assert isinstance(got, ClusterFaultError) and got.exit_code == exit_codes.CLUSTER_FAULT.code
    assert str(got).startswith("rank 0: worker rank 1 stopped answering in a collective")
    assert "pid 4242: killed by SIGKILL" in str(got)


def test_a_peer_that_failed_on_its_own_fails_the_job_not_to_be_retried(tmp_path, ps):
    d, since = str(tmp_path), time.time() - 1
    me = _records(d, os.getpid(), RankStatus(1, 4343, Phase.EXITED, updated_unix=time.time(), host="elsewhere",
                                             exit=RankExit(ExitReason.CRASHED, 1, "InternalError: a bug of its own")))
    got = step_failure(ERR, Runtime(sync=_RankOfTwo(), ps_tasks=1, ps_addresses=[ps]), 30, d, me, since)
    assert isinstance(got, PeerFailed) and got.exit_code == exit_codes.FAILED.code
    assert not exit_codes.retryable(got.exit_code)
    assert "worker rank 1 (pid 4343) failed at step 30: InternalError: a bug of its own" in str(got)


def test_with_every_peer_running_the_error_is_this_ranks_own(tmp_path, ps, peer):
    """The old rule made this a lost peer (an InternalError, every PS answering): code 200, retried
    for ever outside elastic, reset for ever inside."""
    d, since = str(tmp_path), time.time() - 1
    me = _records(d, os.getpid(), RankStatus(1, peer.pid, Phase.TRAINING, updated_unix=time.time(),
                                             host=socket.gethostname()))
    rt = Runtime(sync=_RankOfTwo(), ps_tasks=1, ps_addresses=[ps])
    assert step_failure(ERR, rt, 30, d, me, since) is None
    os.kill(peer.pid, signal.SIGSTOP)  # the same peer, stopped: it no longer answers
    try:
        got = step_failure(ERR, rt, 30, d, me, since)
    finally:
        os.kill(peer.pid, signal.SIGCONT)
    assert isinstance(got, ClusterFaultError) and f"pid {peer.pid}: process {peer.pid} stopped" in str(got)


def test_an_exit_from_before_this_ring_formed_is_no_news(tmp_path, ps, peer):
    d = str(tmp_path)
    me = _records(d, os.getpid(), RankStatus(1, 4242, Phase.EXITED, updated_unix=time.time() - 60, host="elsewhere",
                                             exit=RankExit(ExitReason.KILLED, 137, "killed by SIGKILL", "SIGKILL")))
    rank_status.write(d, RankStatus(2, peer.pid, Phase.TRAINING, updated_unix=time.time(), host=socket.gethostname()))
    got = step_failure(ERR, Runtime(sync=_RankOfTwo(), ps_tasks=1, ps_addresses=[ps]), 30, d, me, time.time() - 1)
    assert got is None


# -- a TFJob: no launcher, perhaps no shared disk (the connection-type error was laid on the peers by type)

SOCKET_CLOSED = tf.errors.UnavailableError(None, None, "Socket closed")


def test_without_any_peer_record_a_failed_collective_is_not_retried_on_a_guess(ps):
    """Every PS answers and no peer can be asked (no record in reach, no rendezvous of worker 0's):
    the old rule blamed the peers by the error's type, exit 200, which a TFJob restarts for ever
    when the error is this rank's own. Now: unknown, the error named, a non-retryable code."""
    logged = []
    got = step_failure(SOCKET_CLOSED, Runtime(sync=_RankOfTwo(), ps_tasks=1, ps_addresses=[ps], log=logged.append), 30)
    assert isinstance(got, PeersUnknown) and got.exit_code == exit_codes.FAILED.code
    assert logged and "UnavailableError: Socket closed" in logged[-1]  # its traceback is kept in the log
    assert not exit_codes.retryable(got.exit_code)
    assert str(got).startswith(f"rank 0: step 30 failed with every PS answering ({ps}): Socket closed. Whether a "
                               "peer worker was lost cannot be told: no peer's status record is in reach"), str(got)


def test_a_peer_on_another_host_is_not_taken_for_running_on_its_records_word(tmp_path, ps):
    """A shared run directory, a peer on another host: its record says it runs, but a process
    killed there writes nothing more and cannot be looked at from here (the old rule said: this
    rank's own error)."""
    d, since = str(tmp_path), time.time() - 1
    me = _records(d, os.getpid(), RankStatus(1, 4545, Phase.TRAINING, updated_unix=time.time(), host="node-b"))
    got = step_failure(SOCKET_CLOSED, Runtime(sync=_RankOfTwo(), ps_tasks=1, ps_addresses=[ps]), 30, d, me, since)
    assert isinstance(got, PeersUnknown) and got.exit_code == exit_codes.FAILED.code
    assert "worker rank(s) 1 run on other hosts (node-b)" in str(got)


def _listener():
    """A process standing for worker 0, serving its rendezvous port (as a TFJob's worker 0 does
    for its life)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import socket, sys, time; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', %d)); s.listen(); "
            "print('up', flush=True); time.sleep(120)" % port)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"
    return p, f"127.0.0.1:{port}"


def test_worker_0_whose_rendezvous_refuses_is_gone(ps):
    """In a TFJob worker 0 serves the Gloo rendezvous for its life: while it accepts connections
    worker 0 may run (no verdict: unknown); once worker 0 is killed it refuses, and worker 0 is
    named, retryable."""
    worker0, rendezvous = _listener()
    try:
        rt = Runtime(sync=_RankOneOfTwo(), ps_tasks=1, ps_addresses=[ps], rank0_rendezvous=rendezvous)
        assert isinstance(step_failure(SOCKET_CLOSED, rt, 30), PeersUnknown)
        worker0.kill()
        worker0.wait()
        got = step_failure(SOCKET_CLOSED, rt, 30)
    finally:
        worker0.kill()
        worker0.wait()
    assert isinstance(got, ClusterFaultError) and got.exit_code == exit_codes.CLUSTER_FAULT.code
    assert str(got).startswith("rank 1: worker rank 0 stopped answering in a collective (all-reduce / broadcast) "
                               f"at step 30 (its Gloo rendezvous at {rendezvous} refuses connections"), str(got)


def test_worker_0s_record_of_its_own_failure_outweighs_its_closed_rendezvous(tmp_path, ps):
    """Worker 0 failing on its own closes its rendezvous a moment before its record says so: the
    record is waited for, and the job is not retried."""
    d, since = str(tmp_path), time.time() - 1
    rank_status.write(d, RankStatus(0, 4646, Phase.TRAINING, updated_unix=time.time(), host="node-a"))
    rank_status.write(d, RankStatus(1, os.getpid(), Phase.TRAINING, updated_unix=time.time(),
                                    host=socket.gethostname()))
    me = rank_status.read(d, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens: worker 0's rendezvous is gone
    crashed = RankStatus(0, 4646, Phase.EXITED, updated_unix=time.time() + 0.5, host="node-a",
                         exit=RankExit(ExitReason.CRASHED, 1, "ValueError: a bug of worker 0's"))
    writer = threading.Timer(0.5, lambda: rank_status.write(d, crashed))
    writer.start()
    try:
        rt = Runtime(sync=_RankOneOfTwo(), ps_tasks=1, ps_addresses=[ps], rank0_rendezvous=closed)
        got = step_failure(SOCKET_CLOSED, rt, 30, d, me, since)
    finally:
        writer.join()
    assert isinstance(got, PeerFailed), got
    assert "worker rank 0 (pid 4646) failed at step 30: ValueError: a bug of worker 0's" in str(got)


def test_only_a_tfjob_worker_names_worker_0_as_its_rendezvous():
    from gmeta_tf.cluster.worker import RENDEZVOUS_ADDR_ENV, RENDEZVOUS_PORT_ENV, rank0_rendezvous

    rdv = {RENDEZVOUS_ADDR_ENV: "emu-worker-0.ml.svc", RENDEZVOUS_PORT_ENV: "12355"}
    tf_config = {"cluster": {"ps": ["p:2222"], "worker": ["emu-worker-0.ml.svc:2222", "w1:2222"]}}
    worker = json.dumps({**tf_config, "task": {"type": "worker", "index": 1}})
    assert rank0_rendezvous({**rdv, "TF_CONFIG": worker}) == "emu-worker-0.ml.svc:12355"
    assert rank0_rendezvous(rdv) is None  # horovodrun's driver serves it
    assert rank0_rendezvous({"TF_CONFIG": worker}) is None  # one worker: no rendezvous


def test_an_elastic_ring_that_keeps_failing_ends_past_its_reset_limit_naming_the_error():
    class _One:
        rank = 0

        def broadcast_object(self, obj):
            return obj

        def broadcast_variables(self, variables):
            pass

    state = DenseCommit(_One(), [tf.Variable(0.0)], step=0)
    calls, resets = [], []

    def always(s):
        calls.append(s.step)
        raise tf.errors.UnavailableError(None, None, f"peer gone, try {len(calls)}")

    with pytest.raises(ResetLimitExceeded) as e:
        run_elastic(state, always, lambda e: True, lambda: resets.append(1), reset_limit=3)
    assert len(calls) == 4 and len(resets) == 3
    assert e.value.exit_code == exit_codes.FAILED.code
    assert "re-formed 3 time(s) (cluster.elastic_reset_limit: 3)" in str(e.value)
    assert "UnavailableError: peer gone, try 4" in str(e.value)


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_the_reset_limit_is_a_count(value):
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.config.schema import ConfigError

    with pytest.raises(ConfigError, match="cluster.elastic_reset_limit"):
        load_config("configs/quickstart.yaml", [f"cluster.elastic_reset_limit={value!r}".replace("'", "")
                                                if not isinstance(value, str) else f"cluster.elastic_reset_limit='{value}'"])


def test_the_reset_limit_reaches_horovodrun(tmp_path):
    from gmeta_tf.config.schema import ClusterConfig
    from launch.elastic_hosts import horovodrun_args

    assert ClusterConfig().elastic_reset_limit == 3
    args = horovodrun_args(2, str(tmp_path / "discover.sh"), [1, 10], reset_limit=3)
    assert args[args.index("--reset-limit") + 1] == "3"
    assert "--reset-limit" not in horovodrun_args(2, str(tmp_path / "discover.sh"), [1, 10])


_PROBE = r"""
import json, subprocess, sys, time
import tensorflow as tf
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.failures import ps_contexts_lost
from gmeta_tf.train.runtime import Runtime, reachable

port = int(sys.argv[1])
SERVE = ("import tensorflow as tf, time; tf.distribute.Server(tf.train.ClusterSpec({'ps': ['127.0.0.1:%d']}), "
         "job_name='ps', task_index=0, start=True); time.sleep(300)" % port)

def start():
    p = subprocess.Popen([sys.executable, "-c", SERVE])
    while not reachable(f"127.0.0.1:{port}"):
        time.sleep(0.2)
    return p

ps = start()
tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({"ps": [f"127.0.0.1:{port}"]}), job_name="worker0",
                                          make_master_device_default=False)
rt = Runtime(sync=LocalSync(), ps_tasks=1, ps_addresses=[f"127.0.0.1:{port}"])
out = {"up": ps_contexts_lost(rt)}
ps.kill(); ps.wait()
again = start()  # the same address, a new process: this worker's context is not there
out["restarted"] = ps_contexts_lost(rt)
again.kill(); again.wait()
print(json.dumps(out))
"""


def test_a_ps_restarted_at_its_address_is_found_by_asking_it_not_by_reading_an_error(tmp_path):
    """The probe behind "lost ps:N (it answers again: restarted)": one op on the PS, whose new
    process knows nothing of this worker's context (real TensorFlow servers, in processes)."""
    import json

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    r = subprocess.run([sys.executable, "-c", _PROBE, str(port)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"up": [[], []], "restarted": [[0], []]}, got
