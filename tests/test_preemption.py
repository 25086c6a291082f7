"""The parts of fault tolerance that need no cluster: the stop vote in the step, the one-line
cause of a lost PS, the launcher's reading of a failure, restart records and exit codes.
The real processes are in tests/faults/test_restarts.py."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.schema import MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.errors import EXIT_CLUSTER_FAULT, EXIT_PREEMPTED, EXIT_USER_ERROR, ClusterFaultError
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train import restarts
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.runtime import Runtime

# A worker's request to a PS restarted behind the same address: the cause line is what TensorFlow
# 2.16 printed in a real run (tests/faults/test_restarts.py; gRPC status 10, ABORTED), around it
# the header and node lines it puts on every graph error.
TF_RESTARTED_PS = (
    "Graph execution error:\n\n"
    "Detected at node gmeta_train_step_r0_p1/lookup defined at (most recent call last):\n"
    "<stack traces unavailable>\n"
    "Unable to find a context_id matching the specified one (14805380320783337398). Perhaps the worker "
    "was restarted, or the context was GC'd?\n"
    "Additional GRPC error information from remote target /job:ps/replica:0/task:0:\n"
    ":{\"created\":\"@1795668535.966817106\",\"grpc_status\":10}\n"
    "\t [[{{node gmeta_train_step_r0_p1/lookup}}]]")


def test_the_stop_vote_rides_in_the_step_and_comes_back_as_its_verdict():
    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1), schema)
    dense_opt, emb_opt = make_optimizers(TrainConfig())
    step = TrainStep(model, MetaConfig(algo="maml", inner_steps=1, adapt="top"), dense_opt, emb_opt, LocalSync())
    batch = random_batch(schema, T=4, seed=3)
    assert bool(step.step(batch)["stop"]) is False
    step.vote_stop(True)
    assert bool(step.step(batch)["stop"]) is True  # the same traced function: the vote is read, not baked in
    step.vote_stop(False)
    assert bool(step.step(batch)["stop"]) is False


def test_a_restarted_ps_is_named_with_the_cause_not_tensorflows_header():
    """The line a worker prints when a PS came back empty (issue 32: it said "Graph execution error:")."""
    import socket

    from gmeta_tf.train.failures import lost_ps_error, step_failure
    from launch.local_cluster import free_ports

    alive = socket.socket()
    alive.bind(("127.0.0.1", 0))
    alive.listen()
    try:
        addr = f"127.0.0.1:{alive.getsockname()[1]}"
        # (that the PS was restarted is the probe's finding: tests/test_failure_blame.py)
        err = lost_ps_error(tf.errors.InvalidArgumentError(None, None, TF_RESTARTED_PS),
                            Runtime(sync=LocalSync(), ps_tasks=1, ps_addresses=[addr]), 112, tasks=[0], restarted=True)
        down = f"127.0.0.1:{free_ports(1)[0]}"
        gone = step_failure(tf.errors.UnavailableError(None, None, "Graph execution error:\n\nSocket closed"),
                            Runtime(sync=LocalSync(), ps_tasks=1, ps_addresses=[down]), 9)
    finally:
        alive.close()
    assert isinstance(err, ClusterFaultError) and err.exit_code == EXIT_CLUSTER_FAULT
    text = str(err)
    assert text.startswith(f"rank 0: lost ps:0 ({addr}) at step 112 (it answers again: restarted")
    assert "Unable to find a context_id matching the specified one" in text
    assert "Graph execution error" not in text and "[[" not in text
    assert f"lost ps:0 ({down}) at step 9: Socket closed. Restart the PS" in str(gone)


def test_the_launcher_blames_the_dead_ps_first_and_knows_a_preemption(tmp_path):
    """From the ranks' status records (tests/test_rank_status.py has the rest), not their log lines."""
    from gmeta_tf.train.rank_status import ExitReason, Phase, RankExit, RankStatus, write
    from launch.local_cluster import Child, LocalCluster
    from launch.supervisor import _failure

    class _Proc:
        def __init__(self, code):
            self.returncode = code

        def poll(self):
            return self.returncode

    def cluster(status, ps_codes):
        c = LocalCluster(log=lambda m: None)
        c.watch_stops(None, 25.0, str(status))
        c.children += [Child(f"ps:{i} (127.0.0.1:{7000 + i})", _Proc(code)) for i, code in enumerate(ps_codes)]
        return c

    lost = RankExit(ExitReason.CLUSTER_FAULT, 200, "rank 1: lost ps:0 (127.0.0.1:7000) at step 37: Socket closed")
    write(str(tmp_path / "lost"), RankStatus(1, 11, Phase.EXITED, step=37, exit=lost, updated_unix=1.0))
    f = _failure(cluster(tmp_path / "lost", [-9, None]), 1, None)
    assert f.cause == "ps:0 (127.0.0.1:7000) died (killed by SIGKILL)" and f.exit_code == -9 and f.job_code == 200
    assert cluster(tmp_path / "lost", [-9]).last_step_seen() == 37
    for r in (1, 0):  # rank 1 exits first
        write(str(tmp_path / "stop"), RankStatus(r, 10 + r, Phase.EXITED, step=40, checkpoint=40, updated_unix=2.0 - r,
                                                 exit=RankExit(ExitReason.PREEMPTED, 143, "saved", "SIGTERM")))
    f = _failure(cluster(tmp_path / "stop", [None]), 1, None)
    assert f.cause == "worker rank 1 was stopped by SIGTERM and checkpointed" and f.exit_code == 143
    assert _failure(cluster(tmp_path / "none", [None]), 0, None) is None


def test_restart_backoff_doubles_up_to_its_cap():
    from launch.supervisor import RestartPolicy

    policy = RestartPolicy(max_restarts=9, backoff_s=1.0, max_backoff_s=5.0)
    assert [policy.backoff(a) for a in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_restart_record_is_completed_by_the_resumed_run():
    history = [restarts.Restart(1, "ps:0 (h:1) died (killed by SIGKILL)", -9, 27, failed_at_unix=100.0)]
    env = {restarts.RESTARTS_ENV: restarts.encode(history)}
    got = restarts.from_env(env)
    assert got == history
    last = restarts.complete(got, start=20, now=106.5)
    assert (last.resumed_from_step, last.steps_redone, last.recovery_s) == (20, 7, 6.5)
    assert restarts.describe(last) == ("restart 1: resumed at step 20 after ps:0 (h:1) died (killed by SIGKILL), "
                                      "7 step(s) redone; 6.5 s from the failure to this step "
                                      "(s after it: first step 6.5)")
    assert restarts.from_env({}) == []


def test_a_restart_timeline_joins_the_launchers_moments_and_rank_0s_in_order():
    """The launcher marks its moments before the new cluster's ranks read the record from their
    environment; rank 0 adds its own at its first step: one timeline, seconds after the failure."""
    history = [restarts.Restart(1, "worker rank 1 failed", 137, 20, failed_at_unix=100.0)]
    restarts.mark(history, "workers_exited", 101.0)
    restarts.mark(history, "cluster_stopped", 101.5)
    restarts.mark(history, "relaunched", 102.0)
    restarts.mark(history, "ps_ready", 104.25)
    got = restarts.from_env({restarts.RESTARTS_ENV: restarts.encode(history)})
    last = restarts.complete(got, start=20, now=112.0,
                             marks={"rank_restored": 110.0, "rank_started": 104.5, "rank_joined": 108.0})
    assert list(last.timeline_s.items()) == [("workers_exited", 1.0), ("cluster_stopped", 1.5), ("relaunched", 2.0),
                                            ("ps_ready", 4.25), ("rank_started", 4.5), ("rank_joined", 8.0),
                                            ("rank_restored", 10.0), ("first_step", 12.0)]
    assert last.recovery_s == 12.0
    assert "(s after it: workers exited 1.0, cluster stopped 1.5, relaunched 2.0, ps ready 4.2" in restarts.describe(last)


def test_exit_codes_say_what_a_kubeflow_exit_code_policy_retries():
    """The renderer's policy and the table's retryable column, both the real code's."""
    from gmeta_tf import exit_codes
    from launch.k8s_render import RESTART_POLICY, policy_retries

    assert RESTART_POLICY == "ExitCode"
    for code in (EXIT_PREEMPTED, EXIT_CLUSTER_FAULT, exit_codes.KILLED.code, -9):
        assert policy_retries(code) and exit_codes.retryable(code), code
    assert not policy_retries(EXIT_USER_ERROR) and not exit_codes.retryable(EXIT_USER_ERROR)
    assert all(policy_retries(e.code) == e.retryable for e in exit_codes.TABLE if e.code)


def test_launch_local_refuses_negative_restarts():
    from gmeta_tf.errors import ClusterError
    from launch.supervisor import RestartPolicy, launch_local

    with pytest.raises(ClusterError, match="--max-restarts must be >= 0"):
        launch_local(1, 0, [], restarts=RestartPolicy(max_restarts=-1))


@pytest.mark.integration  # a real process and its signals
def test_a_second_signal_or_the_grace_period_ends_a_stuck_preemption():
    """Nothing reaches the step boundary here (the process sleeps): the grace timer exits 143,
    and a second signal exits at once."""
    code = ("import signal, time, os\n"
            "from gmeta_tf.train.preemption import PreemptionWatch\n"
            "with PreemptionWatch({grace}, rank=0):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    {second}\n"
            "    time.sleep(60)\n")
    for grace, second, most in ((1.0, "pass", 20.0), (60.0, "os.kill(os.getpid(), signal.SIGINT)", 20.0)):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code.format(grace=grace, second=second)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == EXIT_PREEMPTED, proc.stdout + proc.stderr
        assert time.monotonic() - t0 < most
        assert ("grace period" in proc.stdout) if grace == 1.0 else ("second stop signal" in proc.stdout), proc.stdout


def test_the_first_cause_of_several_root_errors_is_named():
    """What rank 1 printed in `make bench`'s PS kill before this: "lost ps:0 (...) at step 66:
    2 root error(s) found.." -- TensorFlow's count, not a cause."""
    from gmeta_tf.errors import tf_error_first_cause

    text = ("Graph execution error:\n\n2 root error(s) found.\n  (0) UNAVAILABLE:  Connection reset by peer\n"
            "\t [[{{node gmeta_train_step/lookup}}]]\n  (1) UNAVAILABLE:  Socket closed\n0 successful operations.\n")
    assert tf_error_first_cause(text) == "Connection reset by peer"
    assert tf_error_first_cause("Socket closed\n while running /job:ps/replica:0/task:0") == "Socket closed"
