"""Errors the user can act on. The CLI prints these as one line, never a stack trace.

The exit code is the error's ``exit_code``, a row of ``gmeta_tf/exit_codes.py`` (2 unless it says
otherwise): a bad config (2) is not retried forever while a preemption (143) or a cluster fault
(200) is.
"""
import re

from gmeta_tf import exit_codes

# The table's codes under the names the rest of the code base (and its tests) import.
EXIT_USER_ERROR = exit_codes.USER_ERROR.code
EXIT_PREEMPTED = exit_codes.PREEMPTED.code
EXIT_CLUSTER_FAULT = exit_codes.CLUSTER_FAULT.code


class UserError(Exception):
    """Base class: the message must name the file / row / field / address at fault."""

    exit_code = EXIT_USER_ERROR


class DataError(UserError):
    """Bad input data (missing column, wrong type, NaN label, empty file ...)."""


class ClusterError(UserError):
    """A parameter server or worker could not be reached or failed."""


class ClusterFaultError(ClusterError):
    """A fault of the running cluster, not of the job's settings: a PS lost or restarted, a peer
    worker that stopped answering. Re-running (or a restart policy) resumes from the last
    checkpoint, so the exit code says "retry"."""

    exit_code = EXIT_CLUSTER_FAULT


class Preempted(UserError):
    """The job was told to stop (SIGTERM / SIGINT to a worker or the launcher) and every rank
    checkpointed at one agreed step first. Exits with the signal's own code (143 for SIGTERM)."""

    def __init__(self, message: str, step: int, signum: int, save_s: float = 0.0):
        super().__init__(message)
        self.step = step
        self.signum = signum
        self.save_s = save_s
        self.exit_code = exit_codes.signal_exit(signum)


class JobFailed(ClusterError):
    """A launched job (``gmeta launch local``) ended without finishing. Its exit code is its
    first cause's, so one fault ends with one code whichever command ran it: a dead PS or rank
    is ``CLUSTER_FAULT`` (200) as in the rank itself, a rank's own mistake stays 2, the
    launch's ``--timeout`` is ``TIMED_OUT`` (124)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete or does not match the model."""


class PlanError(UserError):
    """A sharding request that cannot be met (a table fits no PS, not enough memory in total)."""


class HotSetMissError(DataError):
    """A hot table served without the PS (its profile claimed every train id) met another id."""


class NetworkEmulationError(ClusterError):
    """The emulated network (``--network``) cannot be set up here, a profile is malformed, or an
    ``ip`` / ``tc`` command failed: the message names the value, the privilege or the command."""


_TF_NOISE = re.compile(r"^(Graph execution error:|Detected at node|<stack traces unavailable>|\s|\[\[|$)")


def tf_error_cause(message: str) -> str:
    """The cause in a TensorFlow error message: "Graph execution error:" and the node and stack
    lines around it say where, not why (the assertion's, kernel's or RPC's own text)."""
    lines = [ln.strip() for ln in message.splitlines() if not _TF_NOISE.match(ln)]
    cause = " ".join(lines) or (message.strip().splitlines() or [""])[0]
    return re.sub(r"\s*\[\[\{\{node .*", "", cause).strip()


_ONE_OF_MANY = re.compile(r"^\s+\(\d+\)\s+(?:[A-Z_]+:\s+)?(\S.*)$")
_TF_COUNTS = re.compile(r"^\d+ (root error\(s\) found|successful operations)\.?\s*$")


def tf_error_first_cause(message: str) -> str:
    """The first line of ``tf_error_cause``: for a one-line log message, where the rest of the
    text (the ops and devices a failed RPC was serving) adds length, not a reason."""
    for line in message.splitlines():
        many = _ONE_OF_MANY.match(line)  # "2 root error(s) found." lists each as "  (0) CODE: text"
        if many:
            line = many.group(1)
        elif _TF_NOISE.match(line) or _TF_COUNTS.match(line):
            continue
        return re.sub(r"\s*\[\[\{\{node .*", "", line).strip().rstrip(".")
    return tf_error_cause(message)
