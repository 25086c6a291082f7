"""One table of exit codes (gmeta_tf/exit_codes.py), used by every entry point (issue 42, item 2).

The table is held to the rule the rendered TFJob applies (Kubeflow's ``restartPolicy: ExitCode``),
``128 + signum`` and the stop signals are written in one module, and the same fault ends with the
same code whichever command ran it: a dead PS is 200 from ``gmeta train`` and from ``gmeta launch
local`` (the real processes: tests/faults/test_launcher_state.py).
"""
from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from gmeta_tf import exit_codes
from gmeta_tf.errors import EXIT_CLUSTER_FAULT, EXIT_PREEMPTED, EXIT_USER_ERROR, ClusterFaultError, Preempted

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.fast


def test_every_row_is_retried_exactly_when_the_rendered_restart_policy_retries_it():
    from launch.k8s_render import RESTART_POLICY, policy_retries

    assert RESTART_POLICY == "ExitCode"
    for row in exit_codes.TABLE:
        if row.code:
            assert policy_retries(row.code) == row.retryable, row
    assert not exit_codes.DONE.retryable
    assert len({row.code for row in exit_codes.TABLE}) == len(exit_codes.TABLE)  # one meaning per code


def test_the_errors_codes_are_the_tables():
    assert (EXIT_USER_ERROR, EXIT_PREEMPTED, EXIT_CLUSTER_FAULT) == (
        exit_codes.USER_ERROR.code, exit_codes.PREEMPTED.code, exit_codes.CLUSTER_FAULT.code)
    assert ClusterFaultError("x").exit_code == exit_codes.CLUSTER_FAULT.code
    assert Preempted("x", 3, int(signal.SIGINT)).exit_code == exit_codes.INTERRUPTED.code
    assert exit_codes.retryable(EXIT_CLUSTER_FAULT) and exit_codes.retryable(-9) and exit_codes.retryable(137)
    assert not exit_codes.retryable(EXIT_USER_ERROR) and not exit_codes.retryable(exit_codes.TIMED_OUT.code)


def test_signal_codes_read_both_ways():
    assert exit_codes.signal_of(-9) == exit_codes.signal_of(137) == 9
    assert exit_codes.signal_of(200) is None and exit_codes.signal_of(2) is None and exit_codes.signal_of(None) is None
    assert exit_codes.describe(-9) == exit_codes.describe(137) == "killed by SIGKILL"
    assert exit_codes.describe(200) == "exit code 200"
    assert exit_codes.normalized(-15) == 143 and exit_codes.normalized(2) == 2


def _sources():
    for folder in ("gmeta_tf", "launch", "bench", "ps"):
        yield from sorted((REPO / folder).rglob("*.py"))


def test_128_plus_a_signal_and_the_stop_signals_are_written_once():
    """Seven places computed ``128 + signum`` and two listed the stop signals, differently."""
    owner = REPO / "gmeta_tf" / "exit_codes.py"
    computed = [f"{p.relative_to(REPO)}:{n}" for p in _sources() if p != owner
                for n, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(r"\b128\s*\+\s*[A-Za-z_(]|[A-Za-z_)\]]\s*-\s*128\b", line.split("#")[0])]
    assert computed == []
    listed = [str(p.relative_to(REPO)) for p in _sources() if p != owner
              and re.search(r"^STOP_SIGNALS\s*=", p.read_text(), re.M)]
    assert listed == []


def test_a_dead_ps_is_the_launchers_cluster_fault_as_it_is_the_trainers():
    """The launcher's side of "same fault, same code": its failure for a dead PS exits 200."""
    from launch.local_cluster import Child, LocalCluster
    from launch.supervisor import _failure

    class _Proc:
        returncode = -9

        def poll(self):
            return self.returncode

    cluster = LocalCluster(log=lambda m: None)
    cluster.children.append(Child("ps:0 (127.0.0.1:7000)", _Proc()))
    f = _failure(cluster, 1, None)
    assert f.cause == "ps:0 (127.0.0.1:7000) died (killed by SIGKILL)" and f.exit_code == -9
    assert f.job_code == ClusterFaultError("lost ps:0").exit_code == 200
