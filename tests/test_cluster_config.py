"""Errors of the cluster settings that need no running process."""
import pytest

from gmeta_tf.cluster.worker import load_placement
from gmeta_tf.errors import ClusterError
from launch.supervisor import launch_local


def test_placement_file_is_read(tmp_path):
    f = tmp_path / "placement.yaml"
    f.write_text("tables:\n  item_id: [0, 1]\n  hour: {ps: [1]}\n")
    assert load_placement(str(f)) == {"item_id": [0, 1], "hour": [1]}
    assert load_placement(None) is None


@pytest.mark.parametrize("text, words", [
    ("tables: [1, 2]\n", "expected a 'tables' mapping"),
    ("tables:\n  item_id: []\n", "table 'item_id' needs a non-empty list"),
    ("tables:\n  item_id: [zero]\n", "table 'item_id' needs a non-empty list"),
])
def test_bad_placement_names_file_and_table(tmp_path, text, words):
    f = tmp_path / "placement.yaml"
    f.write_text(text)
    with pytest.raises(ClusterError, match=words) as e:
        load_placement(str(f))
    assert str(f) in str(e.value)


def test_missing_placement_file_is_named(tmp_path):
    with pytest.raises(ClusterError, match="nope.yaml"):
        load_placement(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("workers, ps", [(0, 1), (2, -1)])
def test_launch_local_rejects_bad_counts_before_starting_anything(workers, ps):
    with pytest.raises(ClusterError, match="--workers must be >= 1"):
        launch_local(workers, ps, [])


def test_the_ps_blamed_is_the_one_that_refuses_connections_not_the_one_the_text_names():
    """A failed step's text may name every PS it talked to; the PS that no longer accepts
    connections is the one named. With every PS answering and no peer, the text names nobody:
    the error is this rank's own (the old rule blamed the PS the text named)."""
    import socket

    import tensorflow as tf

    from gmeta_tf.train.dense_sync import LocalSync
    from gmeta_tf.train.failures import step_failure
    from gmeta_tf.train.runtime import Runtime
    from launch.local_cluster import free_ports

    alive = socket.socket()
    alive.bind(("127.0.0.1", 0))
    alive.listen()
    try:
        up = f"127.0.0.1:{alive.getsockname()[1]}"
        down = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
        text = ("Socket closed\n while running /job:ps/replica:0/task:0/device:CPU:0 and "
                "/job:ps/replica:0/task:1/device:CPU:0")
        err = step_failure(tf.errors.UnavailableError(None, None, text),
                           Runtime(sync=LocalSync(), ps_tasks=2, ps_addresses=[up, down]), 43)
        assert isinstance(err, ClusterError)
        assert f"rank 0: lost ps:1 ({down}) at step 43: Socket closed." in str(err)
        assert f"ps:0 ({up})" not in str(err)
        named = tf.errors.UnavailableError(None, None, "x /job:ps/replica:0/task:0/device:CPU:0")
        assert step_failure(named, Runtime(sync=LocalSync(), ps_tasks=2, ps_addresses=[up, up]), 7) is None
    finally:
        alive.close()


@pytest.mark.integration  # builds and trains a tiny embedded model
def test_a_peer_lost_in_a_collective_after_the_step_is_named_not_a_bare_trace(prepared_kinds, tmp_path):
    """A peer rank that stops while this rank is in the logged throughput's all-reduce (not in
    the step's own one) must give the same one line as inside the step: found by the
    stalled-worker fault test, which failed when the stop landed between the two."""
    import socket
    import time

    import tensorflow as tf

    from gmeta_tf.config.loader import load_config
    from gmeta_tf.train import trainer
    from gmeta_tf.train.dense_sync import LocalSync
    from gmeta_tf.train.runtime import Runtime

    class PeerGoneAtLogTime(LocalSync):  # this process as rank 0 of 2; rank 1 is gone
        size = 2

        def allreduce_scalar(self, value: float) -> float:
            raise tf.errors.UnknownError(None, None, "Horovod has been shut down. This was caused by an "
                                                     "exception on one of the ranks (allreduce)")

    cfg = load_config("configs/quickstart.yaml", [f"data.path={prepared_kinds['click']}", "data.tasks_per_batch=8",
                                                  "train.steps=4", "train.log_every=2", "train.eval_every=0"])
    run_dir = str(tmp_path / "run")
    local = Runtime()
    schema, metric = trainer._prepare(cfg, local)
    built = trainer.build_tables_once(cfg, schema, local, run_dir)
    tracker, _ = trainer._start_tracker(cfg, local, built.ckpt, metric, 0)
    from gmeta_tf.train.failures import PeersUnknown
    from gmeta_tf.train.preemption import PreemptionWatch
    from gmeta_tf.train.rank_status import ExitReason, Phase, RankExit, RankStatus, StatusWriter, write

    records = str(tmp_path / "status")

    def watch():
        return PreemptionWatch(cfg.train.preemption_grace_s, rank=0, status=StatusWriter(records, 0))

    with socket.socket() as ps:  # every PS answers
        ps.bind(("127.0.0.1", 0))
        ps.listen()
        rt = Runtime(sync=PeerGoneAtLogTime(), ps_tasks=1, ps_addresses=[f"127.0.0.1:{ps.getsockname()[1]}"])
        # No record of rank 1 in reach: who is at fault cannot be told, so it is not retried.
        with pytest.raises(PeersUnknown, match=r"^rank 0: step 2 failed with every PS answering .*Horovod has "
                                               r"been shut down.* no peer's status record is in reach"):
            trainer._loop(cfg, rt, run_dir, schema, built, tracker, 0, False, None, watch())
        # Rank 1's record says it was killed (its agent wrote it): rank 1 is named, and retried.
        write(records, RankStatus(1, 4242, Phase.EXITED, updated_unix=time.time(), host="elsewhere",
                                  exit=RankExit(ExitReason.KILLED, 137, "killed by SIGKILL", "SIGKILL")))
        with pytest.raises(ClusterError, match=r"^rank 0: worker rank 1 stopped answering in a collective "
                                               r"\(all-reduce / broadcast\) at step 2 \(pid 4242: killed by SIGKILL"):
            trainer._loop(cfg, rt, run_dir, schema, built, tracker, 0, False, None, watch())


def test_a_rendezvous_that_never_answers_is_named_not_a_hang():
    """``wait_for_rendezvous``: bounded by its time-out, then a ``ClusterError`` naming the address
    and who serves it; without a rendezvous in the environment (one process) nothing to wait for."""
    from serve_fixture import free_port

    from gmeta_tf.cluster.worker import RENDEZVOUS_ADDR_ENV, RENDEZVOUS_PORT_ENV, wait_for_rendezvous

    port = free_port()  # nothing listens there
    with pytest.raises(ClusterError, match=rf"Gloo rendezvous at 127\.0\.0\.1:{port} is not reachable after 1 s"):
        wait_for_rendezvous({RENDEZVOUS_ADDR_ENV: "127.0.0.1", RENDEZVOUS_PORT_ENV: str(port)}, 1.0)
    wait_for_rendezvous({}, 1.0)  # returns at once
