"""An elastic ring whose rank fails on its own ends at once (issue 52, item 1).

A rank that raises the same error at every step, with every PS and every peer up, is no lost
peer: judged by the exception's type (an ``InternalError``), the ring used to roll back, re-form
with the same two workers and fail again, for ever (horovodrun got no ``--reset-limit`` and
Horovod's ``run_fn`` loops). Now the failing rank ends with its own error, its peer learns from
the failing rank's status record that it failed on its own, and the job ends with a code that
says "do not retry" (real PS, real horovodrun, real ranks; ``GMETA_FAIL_FROM_STEP`` is the
test's trigger)."""
from __future__ import annotations

import pytest
from fault_helpers import _finish, _launch_argv, _spawn

from gmeta_tf import exit_codes
from gmeta_tf.train import rank_status
from gmeta_tf.train.failures import FAIL_ENV
from gmeta_tf.train.rank_status import ExitReason

pytestmark = pytest.mark.integration


def test_a_rank_that_fails_at_every_step_ends_an_elastic_ring_with_a_code_not_to_retry(tiny_data, tmp_path,
                                                                                       no_orphans):
    run = tmp_path / "run"
    argv = [*_launch_argv(tiny_data, run, steps=200), "--elastic"]
    code, out = _finish(_spawn(argv, env={FAIL_ENV: "25:1"}), timeout=240)  # the old code never ends
    assert code == exit_codes.FAILED.code and not exit_codes.retryable(code), out[-4000:]
    assert "injected failure at step 25 (rank 1" in out, out[-4000:]
    assert "the ring re-formed" not in out, out[-4000:]  # no rollback for an error of the rank's own
    assert "--reset-limit 3" in out, out[-4000:]  # cluster.elastic_reset_limit's default reaches horovodrun
    records = {r.rank: r for r in rank_status.read_processes(str(run / "status"))}
    assert records[1].exit.reason is ExitReason.CRASHED, records[1]
    assert "injected failure at step 25" in records[1].exit.message
    first = records[0].exit  # the peer: not lost, it failed on its own
    assert first.code == exit_codes.FAILED.code and "worker rank 1 (pid" in first.message, first
    assert "injected failure at step 25" in first.message, first
