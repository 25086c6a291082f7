"""A training rank's life, from its first line to its exit, as its status record tells it.

``rank_life`` is entered first thing by ``gmeta train`` and by a TFJob worker pod (before Horovod
starts, before the PS are reached, before TensorFlow builds anything) and left last: so a stop
signal that comes during start-up is recorded and acted on (the first agreed step checkpoints),
not lost to a default handler, and every way out of the process writes its ``RankExit``:

* ``Preempted`` (every rank checkpointed the agreed step): ``preempted``, with the step and the save's seconds;
* ``ClusterFaultError`` (a lost PS or peer): ``cluster_fault``; any other ``UserError``:
  ``user_error``; anything else: ``crashed`` (a bug), each with its message and exit code;
* a second signal or the grace period running out: ``preemption.py`` writes it before ``os._exit``.

The exception's type decides, never its text. ``trainer.train`` enters one itself when nothing
else did (``gmeta tune``, the demo), so an in-process run reports the same way and its watch
ends with it.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Tuple

from gmeta_tf import exit_codes, storage
from gmeta_tf.config.schema import Config, ConfigError
from gmeta_tf.errors import ClusterFaultError, Preempted, UserError
from gmeta_tf.train.preemption import PreemptionWatch
from gmeta_tf.train.rank_status import (
    ELASTIC_ENV,
    STATUS_DIR,
    STATUS_DIR_ENV,
    STOP_FILE_ENV,
    ExitReason,
    RankExit,
    StatusWriter,
    record_id,
    status_path,
)


def status_dir(run_dir: str) -> Optional[str]:
    """Where this rank's record goes: the launcher's ``GMETA_STATUS_DIR``, else ``status/`` of a
    local run directory; None for a run directory on an object store (a record rewritten at
    every logged step is no object to PUT each time)."""
    named = os.environ.get(STATUS_DIR_ENV)
    if named:
        return named
    return os.path.join(storage.local_path(run_dir), STATUS_DIR) if storage.is_local(run_dir) else None


def env_rank() -> int:
    """This process's Horovod rank before Horovod starts (``horovodrun`` and a TFJob worker's
    ``worker_env`` set it; 0 for one process)."""
    try:
        return int(os.environ.get("HOROVOD_RANK", "0") or 0)
    except ValueError:
        return 0


def exit_of(e: BaseException) -> Tuple[RankExit, Optional[int]]:
    """The record of an exception that ends the rank, and the checkpoint it completed (if any)."""
    message = str(e) or type(e).__name__
    if isinstance(e, Preempted):
        return RankExit(ExitReason.PREEMPTED, e.exit_code, message, exit_codes.signal_name(e.signum), e.save_s), e.step
    if isinstance(e, ClusterFaultError):
        return RankExit(ExitReason.CLUSTER_FAULT, e.exit_code, message), None
    if isinstance(e, (UserError, ConfigError)):
        return RankExit(ExitReason.USER_ERROR, getattr(e, "exit_code", exit_codes.USER_ERROR.code), message), None
    if isinstance(e, SystemExit):
        code = e.code if isinstance(e.code, int) else exit_codes.FAILED.code
        return RankExit(ExitReason.EXITED, code, exit_codes.describe(code)), None
    return RankExit(ExitReason.CRASHED, exit_codes.FAILED.code, f"{type(e).__name__}: {message}"), None


def _dirs_to_make(directory: Optional[str], run_dir: str) -> List[str]:
    """The directories, innermost first, that this rank's record creates in a local run directory
    (none when the launcher named the status directory: the record is the launcher's to keep)."""
    if directory is None or os.environ.get(STATUS_DIR_ENV) or not storage.is_local(run_dir):
        return []
    made, d = [], os.path.abspath(directory)
    while not os.path.exists(d):
        made.append(d)
        d = os.path.dirname(d)
    return made


def _unmake(made: List[str], record: str) -> None:
    """A command refused for bad input leaves the run directory as it found it: when the record
    is all it wrote there, the record goes and so do the directories it made (``os.rmdir``: only
    empty ones, so nothing another writer put there is touched)."""
    if not made:
        return
    for root, dirs, files in os.walk(made[-1]):
        if [os.path.join(root, f) for f in files] not in ([], [record]):
            return
    try:
        os.remove(record)
    except OSError:
        return
    for d in made:
        try:
            os.rmdir(d)
        except OSError:
            return


@contextmanager
def rank_life(cfg: Config, run_dir: str, log: Callable[[str], None] = print,
              rank: Optional[int] = None) -> Iterator[PreemptionWatch]:
    """The status record and the preemption watch of one rank, for the length of the block. Inside
    another one (a TFJob worker's entrypoint around ``run_training``) it is that one."""
    outer = PreemptionWatch.current()
    if outer is not None:
        yield outer
        return
    rank = env_rank() if rank is None else rank
    directory = status_dir(str(run_dir))
    made = _dirs_to_make(directory, str(run_dir))
    # an elastic ring: one record per process, not per rank (``rank_status``'s docstring)
    elastic = cfg.cluster.elastic or os.environ.get(ELASTIC_ENV) == "1"
    status = StatusWriter(directory, rank, process=record_id() if elastic else None)
    status.flush()  # "starting": the launcher knows this rank's process is up
    with PreemptionWatch(cfg.train.preemption_grace_s, log, rank, os.environ.get(STOP_FILE_ENV) or None,
                         status) as watch:
        try:
            yield watch
        except BaseException as e:
            record, checkpoint = exit_of(e)
            status.exited(record.reason, record.code, record.message, signal=record.signal,
                          checkpoint_s=record.checkpoint_s, checkpoint=checkpoint)
            if record.reason is ExitReason.USER_ERROR:
                _unmake(made, status_path(directory, rank, status.process))
            raise
        status.exited(ExitReason.DONE, exit_codes.DONE.code, f"trained to step {status.status.step}")
