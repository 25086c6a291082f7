"""One rank of the start-up benchmark: ``gmeta train`` with two timestamps printed.

Run as a script (``python bench/startup_rank.py train ...``), not as ``-m bench.…``, so that the
code under test is whatever ``gmeta_tf`` is first on ``PYTHONPATH`` (this checkout, or an older
one for the before/after comparison); both hooks wrap names every version of the trainer has:

* ``GMETA_STARTUP joined <rank> <unix time>``: ``HorovodSync.create`` returned and a barrier
  passed, i.e. every rank has imported TensorFlow and joined the Horovod ring;
* ``GMETA_STARTUP step <rank> <unix time>``: this rank's first ``TrainStep.step`` finished and its
  loss was read back (the PS parts of the step have run).
"""
from __future__ import annotations

import sys
import time


def _hook() -> None:
    from gmeta_tf.meta.meta_step import TrainStep
    from gmeta_tf.train import dense_sync

    create = dense_sync.HorovodSync.create.__func__
    state = {}

    def joined(cls, *args, **kwargs):  # the worker's wire, elastic and compression settings, passed on
        sync = create(cls, *args, **kwargs)
        sync.barrier()
        print(f"GMETA_STARTUP joined {sync.rank} {time.time():.3f}", flush=True)
        state["rank"] = sync.rank
        return sync

    dense_sync.HorovodSync.create = classmethod(joined)
    step = TrainStep.step

    def first_step(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        if "stepped" not in state:
            float(out["loss"])
            state["stepped"] = True
            print(f"GMETA_STARTUP step {state['rank']} {time.time():.3f}", flush=True)
        return out

    TrainStep.step = first_step


if __name__ == "__main__":
    _hook()
    from gmeta_tf.cli.main import cli

    sys.exit(cli.main(sys.argv[1:], standalone_mode=True))
