"""bench/startup_rank.py wraps ``HorovodSync.create`` to time when a rank joined the ring. The
wrapper took no arguments, so once the worker passed its wire (and later ``elastic``) every
start-up bench run died with a TypeError. It must pass every argument on."""
import pytest

from gmeta_tf.train import dense_sync


@pytest.mark.fast
def test_the_join_hook_passes_the_worker_s_arguments_on(monkeypatch, capsys):
    from bench import startup_rank
    from gmeta_tf.meta.meta_step import TrainStep

    seen = {}

    class FakeSync:
        rank = 0

        def barrier(self):
            seen["barrier"] = True

    def create(cls, *args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return FakeSync()

    monkeypatch.setattr(dense_sync.HorovodSync, "create", classmethod(create))
    monkeypatch.setattr(TrainStep, "step", TrainStep.step)  # restored after the hook replaces it
    startup_rank._hook()
    sync = dense_sync.HorovodSync.create("wire", elastic=True, dense_compression="int8")
    assert isinstance(sync, FakeSync) and seen["barrier"]
    assert seen["args"] == ("wire",) and seen["kwargs"] == {"elastic": True, "dense_compression": "int8"}
    assert "GMETA_STARTUP joined 0" in capsys.readouterr().out
