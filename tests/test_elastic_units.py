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
from launch.elastic_hosts import horovodrun_args, host_list, local_names
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
def test_horovodrun_args_make_an_elastic_ring_that_may_shrink_to_one():
    args = horovodrun_args(3, "a:1,b:1,c:1")
    assert args[args.index("--min-np") + 1] == "1" and args[args.index("--max-np") + 1] == "3"
    assert args[args.index("-np") + 1] == "3" and args[args.index("-H") + 1] == "a:1,b:1,c:1"
    assert args[args.index("--network-interfaces") + 1] == "lo" and "--gloo" in args
    assert "--blacklist-cooldown-range" not in args  # a lost worker's host never comes back


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
