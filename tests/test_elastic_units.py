"""Elastic workers' pure parts (issue 42): the host list, the config and launch checks, what the
launcher makes of a lost rank, and what a commit rolls back. The ring itself, with real processes,
is tests/faults/test_elastic.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.errors import ClusterError
from gmeta_tf.train import rank_status
from launch.elastic_hosts import horovodrun_args, host_list, local_names, write_discovery
from launch.local_cluster import LocalCluster
from launch.supervisor import _failure, launch_local


@pytest.mark.fast
def test_local_names_keeps_each_name_that_resolves_to_this_machine_once():
    addresses = {"127.0.0.1": "127.0.0.1", "localhost": "127.0.0.1", "vm": "127.0.0.1", "10.0.0.5": "10.0.0.5",
                 "far": "10.9.9.9"}
    names = local_names(["localhost", "127.0.0.1", "vm", "localhost", "far", "nowhere", "", "10.0.0.5"],
                        addresses.get, {"127.0.0.1", "10.0.0.5"})
    assert names == ["localhost", "127.0.0.1", "vm", "10.0.0.5"]


@pytest.mark.fast
def test_host_list_gives_each_worker_a_host_of_its_own():
    assert host_list(2, ["localhost", "127.0.0.1", "vm"]) == "localhost:1,127.0.0.1:1"
    with pytest.raises(ClusterError, match=r"--elastic with --workers 3: .* 2 distinct local host name"):
        host_list(3, ["localhost", "127.0.0.1"])


@pytest.mark.fast
def test_horovodrun_args_make_an_elastic_ring_that_may_shrink_to_one_and_grow_back(tmp_path):
    script = str(tmp_path / "discover_hosts.sh")
    args = horovodrun_args(3, script, [1, 10])
    assert args[args.index("--min-np") + 1] == "1" and args[args.index("--max-np") + 1] == "3"
    assert args[args.index("-np") + 1] == "3" and args[args.index("--host-discovery-script") + 1] == script
    at = args.index("--blacklist-cooldown-range")
    assert args[at + 1:at + 3] == ["1", "10"]  # a lost worker's host returns after its cool-down
    assert args[args.index("--network-interfaces") + 1] == "lo" and "--gloo" in args and "-H" not in args
    assert "--blacklist-cooldown-range" not in horovodrun_args(3, script, None)  # null: it never returns
    assert "--reset-limit" not in args  # none given: unbounded (horovodrun's own default)
    limited = horovodrun_args(3, script, None, reset_limit=2)
    assert limited[limited.index("--reset-limit") + 1] == "2"


@pytest.mark.fast
def test_the_discovery_script_prints_one_slot_per_host_from_the_file_beside_it(tmp_path):
    import subprocess

    script = write_discovery(str(tmp_path / "elastic"), ["localhost", "127.0.0.1"])
    assert os.access(script, os.X_OK) and os.path.dirname(script) == str(tmp_path / "elastic")
    assert subprocess.run([script], capture_output=True, text=True, check=True).stdout == "localhost:1\n127.0.0.1:1\n"
    write_discovery(str(tmp_path / "elastic"), ["localhost"])  # the launcher may change the hosts it lists
    assert subprocess.run([script], capture_output=True, text=True, check=True).stdout == "localhost:1\n"


@pytest.mark.parametrize("value", ["[0,5]", "[5,2]", "[1]", "[1,2,3]", "[1,3601]", "[true,2]", "[1.5,2]", "5"])
def test_elastic_cooldown_must_be_min_max_whole_seconds_within_horovods_bounds(value):
    with pytest.raises(ConfigError, match=r"config key 'cluster.elastic_cooldown_s'"):
        load_config(None, [f"cluster.elastic_cooldown_s={value}"])


def test_elastic_cooldown_defaults_to_a_few_seconds_and_null_means_never():
    assert load_config(None, []).cluster.elastic_cooldown_s == [1, 10]
    assert load_config(None, ["cluster.elastic_cooldown_s=[2,4]"]).cluster.elastic_cooldown_s == [2, 4]
    assert load_config(None, ["cluster.elastic_cooldown_s=null"]).cluster.elastic_cooldown_s is None


def test_launch_local_refuses_a_bad_cooldown_by_its_key_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'cluster.elastic_cooldown_s'"):
        launch_local(2, 1, ["--out", str(tmp_path / "run")], elastic=True, elastic_cooldown_s=[0, 3],
                     log=lambda m: None)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("sets, names", [
    (["hot.budget=1000"], ["hot.budget", "model.hot_split"]),
    (["train.scale_lr=true"], ["train.scale_lr"]),
])
def test_elastic_config_refuses_what_a_rollback_cannot_carry(sets, names):
    load_config(None, sets)  # fine without cluster.elastic
    with pytest.raises(ConfigError) as e:
        load_config(None, ["cluster.elastic=true", *sets])
    assert "config key 'cluster.elastic'" in str(e.value)
    assert all(n in str(e.value) for n in names), str(e.value)


@pytest.mark.parametrize("value", [0, -1, True, 2.5])
def test_elastic_commit_every_must_be_a_positive_integer(value):
    with pytest.raises(ConfigError, match="config key 'train.elastic_commit_every'"):
        load_config(None, [f"train.elastic_commit_every={str(value).lower()}"])
    cfg = load_config(None, ["cluster.elastic=true", "train.elastic_commit_every=3"])
    assert cfg.cluster.elastic is True and cfg.train.elastic_commit_every == 3


@pytest.mark.parametrize("workers, network, words", [
    (1, None, "--elastic needs --workers >= 2 (got 1)"),
    (2, "rate=100mbit", "--elastic runs on loopback only"),
])
def test_launch_local_refuses_an_elastic_launch_it_cannot_run(tmp_path, workers, network, words):
    with pytest.raises(ClusterError) as e:
        launch_local(workers, 1, ["--out", str(tmp_path / "run")], network=network, elastic=True, log=lambda m: None)
    assert words in str(e.value)
    assert not os.listdir(tmp_path)  # refused before anything started or was written


@pytest.mark.parametrize("elastic, code, failed", [(False, 0, True), (True, 0, False), (True, 1, True)])
def test_a_lost_rank_fails_the_cluster_unless_an_elastic_ring_finished_the_job(tmp_path, elastic, code, failed):
    status = str(tmp_path / "status")
    os.makedirs(status)
    rank_status.record_exit(status, 1, 4242, -9)  # what rank 1's agent writes when it is killed
    logged = []
    cluster = LocalCluster(log=logged.append, elastic=elastic)
    cluster.watch_stops(None, 1.0, status)
    failure = _failure(cluster, code, None)
    assert (failure is not None) == failed, failure
    if failed:
        assert failure.cause == "worker rank 1 failed (killed by SIGKILL)"
    cluster._end_survivors_of_a_lost_rank()
    if elastic:  # said once, and nobody ended
        cluster._end_survivors_of_a_lost_rank()
        assert logged == ["[launch] worker rank 1 killed by SIGKILL: elastic, the other ranks go on without it "
                          "from their last commit"]


class _OneRank:
    """The two calls ``DenseCommit`` makes of ``HorovodSync``, for a ring of one."""

    rank = 0

    def broadcast_object(self, obj):
        return obj

    def broadcast_variables(self, variables):
        pass


def test_a_commit_rolls_back_the_dense_state_and_the_step():
    import tensorflow as tf

    from gmeta_tf.train.elastic import DenseCommit

    weights, moment = tf.Variable([1.0, 2.0]), tf.Variable(5.0)
    state = DenseCommit(_OneRank(), [weights, moment], step=0)
    weights.assign([3.0, 4.0])
    state.commit_step(20)
    weights.assign([9.0, 9.0])
    moment.assign(7.0)
    state.step = 21
    state.restore()
    np.testing.assert_array_equal(weights.numpy(), [3.0, 4.0])
    assert float(moment.numpy()) == 5.0 and state.step == 20


def test_run_elastic_resets_on_a_lost_peer_and_ends_on_anything_else():
    import tensorflow as tf

    from gmeta_tf.train.elastic import DenseCommit, run_elastic

    state = DenseCommit(_OneRank(), [tf.Variable(0.0)], step=0)
    calls, resets = [], []

    def train_from(s):
        calls.append(s.step)
        if len(calls) == 1:
            raise tf.errors.UnavailableError(None, None, "peer gone")

    run_elastic(state, train_from, lambda e: isinstance(e, tf.errors.UnavailableError), lambda: resets.append(1))
    assert calls == [0, 0] and resets == [1]

    def broken(s):
        raise ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        run_elastic(state, broken, lambda e: False, lambda: resets.append(2))
    assert resets == [1]


def test_an_elastic_config_needs_ranks_an_elastic_horovodrun_started():
    from gmeta_tf.train.elastic import require_elastic_ring

    with pytest.raises(ConfigError, match=r"config key 'cluster.elastic': needs workers started by an elastic "
                                          r"horovodrun .*HOROVOD_ELASTIC is not 1"):
        require_elastic_ring({"HOROVOD_RANK": "0"})
    require_elastic_ring({"HOROVOD_ELASTIC": "1"})


def test_a_commit_carries_rank_0s_start_and_end_to_every_rank():
    import tensorflow as tf

    from gmeta_tf.train.elastic import DenseCommit

    state = DenseCommit(_OneRank(), [tf.Variable(1.0)], step=30, start=0, end=60)
    state.commit_step(40)
    state.step = 41
    state.restore()
    assert (state.step, state.start, state.end) == (40, 0, 60)


def test_the_start_gate_lets_rank_0_go_first_without_a_collective(tmp_path):
    """What replaces the start-up barriers of an elastic ring: rank 0 works, then opens the gate;
    another rank (a joiner of a running ring included) waits for it, then works."""
    import threading

    from gmeta_tf.train.elastic import StartGate, start_gate

    gate = start_gate({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4321"},
                      str(tmp_path))
    order = []
    other = threading.Thread(target=lambda: gate.rank0_first(1, "tables-created", lambda: order.append(1)))
    other.start()
    other.join(0.3)
    assert other.is_alive() and order == []  # rank 1 waits for rank 0
    assert gate.rank0_first(0, "tables-created", lambda: order.append(0) or "built") == "built"
    other.join(10)
    assert order == [0, 1]
    assert gate.rank0_first(1, "tables-created", lambda: "joined") == "joined"  # already open: no wait
    # another horovodrun job (another rendezvous port) never passes an earlier job's gate
    later = StartGate(str(tmp_path), "127.0.0.1-9999", timeout_s=0.2)
    with pytest.raises(ClusterError, match="did not open the start gate 'tables-created'"):
        later.rank0_first(1, "tables-created", lambda: None)
    # a rank 0 that exited while starting (its record, newer than this process) fails the wait at once
    rank_status.write(str(tmp_path), rank_status.RankStatus(0, 99, rank_status.Phase.EXITED, updated_unix=2000.0,
                                                            exit=rank_status.exit_from_code(2)))
    failed = StartGate(str(tmp_path), "127.0.0.1-8888", timeout_s=60, since_unix=1000.0)
    with pytest.raises(ClusterError, match="rank 0 exited before opening the start gate 'ps-connected'"):
        failed.rank0_first(1, "ps-connected", lambda: None)
    stale = StartGate(str(tmp_path), "127.0.0.1-8888", timeout_s=0.2, since_unix=3000.0)  # an earlier run's record
    with pytest.raises(ClusterError, match="did not open the start gate"):
        stale.rank0_first(1, "ps-connected", lambda: None)
    rank_status.clear(str(tmp_path))  # the launcher clears the gates with the records
    assert not os.listdir(tmp_path)
    with pytest.raises(ConfigError, match="config key 'cluster.elastic'"):
        start_gate({}, None)


def test_the_launcher_says_a_worker_joined_the_ring_from_its_record(tmp_path):
    status = str(tmp_path / "status")
    rank_status.record_exit(status, 1, 4242, -9)  # rank 1 killed
    logged = []
    cluster = LocalCluster(log=logged.append, elastic=True)
    cluster.watch_stops(None, 1.0, status)
    cluster._end_survivors_of_a_lost_rank()
    # a new worker on the returned host: its record replaces the lost one's, and says where it joined
    rank_status.write(status, rank_status.RankStatus(rank=1, pid=5151, phase=rank_status.Phase.TRAINING, step=30,
                                                     ring=[[30, 1, 2]], joined_step=30))
    rank_status.write(status, rank_status.RankStatus(rank=0, pid=4141, phase=rank_status.Phase.TRAINING, step=30,
                                                     ring=[[0, 0, 2], [20, 0, 1], [30, 0, 2]]))
    cluster._end_survivors_of_a_lost_rank()
    cluster._end_survivors_of_a_lost_rank()  # said once
    assert logged[1:] == ["[launch] a new worker (pid 5151) joined the elastic ring as rank 1 of 2 at the commit "
                          "of step 30: the ring grew back"], logged
    for rank, pid, ring in ((0, 4141, [[0, 0, 2], [20, 0, 1], [30, 0, 2]]), (1, 5151, [[30, 1, 2]])):
        done = rank_status.RankExit(rank_status.ExitReason.DONE, 0, "trained to step 60")
        rank_status.write(status, rank_status.RankStatus(rank=rank, pid=pid, phase=rank_status.Phase.EXITED, ring=ring,
                                                         joined_step=30 if rank else None, exit=done))
    assert cluster.elastic_outcome() == ("[launch] elastic: the ring finished with 2 rank(s); 1 worker(s) lost, "
                                         "1 joined on a returned host")
