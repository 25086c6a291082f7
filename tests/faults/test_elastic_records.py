"""An elastic ring's status records after a loss and a rejoin: one per process (issue 52, item 3).

Rank 1 is killed with SIGKILL after step 20; after its host's cool-down horovodrun starts a new
worker in the same slot, rank 1 again. Records named by the rank a process started as had the
new worker overwrite the killed one's (two processes, one ``rank1.json``): here each of the three
processes keeps its own record, the killed one's still saying it was killed (real PS, real
horovodrun, real ranks, as tests/faults/test_elastic_regrow.py)."""
from __future__ import annotations

import os
import signal

import pytest
from fault_helpers import _finish, _launch_argv, _rank_pids, _spawn, _wait_frozen

from gmeta_tf.train import rank_status
from gmeta_tf.train.rank_status import ExitReason

pytestmark = pytest.mark.integration

STEPS = 300  # commits left when the host's 1 s cool-down is over (test_elastic_regrow.py)


def test_a_killed_worker_and_the_one_that_rejoins_in_its_slot_keep_a_record_each(tiny_data, tmp_path, no_orphans):
    run = tmp_path / "run"
    argv = [*_launch_argv(tiny_data, run, steps=STEPS), "--elastic", "--set", "cluster.elastic_cooldown_s=[1,1]"]
    proc = _spawn(argv, pause_at="20:1")
    killed = _wait_frozen(lambda: _rank_pids(no_orphans, 1), proc, what="rank 1 to freeze after step 20")
    os.kill(killed, signal.SIGKILL)
    code, out = _finish(proc, timeout=150)
    assert code == 0, out[-4000:]

    records = rank_status.read_processes(str(run / "status"))
    names = sorted(n for n in os.listdir(run / "status") if n.startswith("rank"))  # beside the start gates
    assert len(records) == 3, names  # rank 0, the killed rank 1, the worker that joined as rank 1
    assert len({r.pid for r in records}) == 3 and len({r.process for r in records}) == 3, names
    by_pid = {r.pid: r for r in records}
    lost = by_pid[killed]
    assert (lost.rank, lost.exit.reason, lost.exit.signal, lost.step) == (1, ExitReason.KILLED, "SIGKILL", 20), lost
    [joiner] = [r for r in records if r.joined_step is not None]
    assert joiner.pid != killed and joiner.rank == 1 and joiner.ring_rank == 1, joiner
    assert joiner.exit.reason is ExitReason.DONE and joiner.step == STEPS, joiner
    [first] = [r for r in records if r.rank == 0]
    assert first.exit.reason is ExitReason.DONE and first.ring_rank == 0 and first.step == STEPS, first
    assert [x[2] for x in first.ring] == [2, 1, 2], first.ring
    assert names == sorted(f"rank{r.rank}.{r.process}.json" for r in records)
