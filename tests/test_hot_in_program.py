"""``meta.hot_in_program`` (issue 43): the hot rows' gather, the dense math, the dense optimizer and
the hot rows' lazy Adam / Adagrad in one XLA program, against today's compiled step (the dense
math alone in XLA, every apply outside it): the same losses, hot rows, slots, cold rows and
dense weights over several steps; and with every id hot, a step with no TFRA op in it."""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_hot_split_units import _model_with_rows, _state

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, TrainConfig
from gmeta_tf.embedding.hot.rows import HotRows
from gmeta_tf.embedding.hot.select import HotSet
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.train.dense_sync import LocalSync

SCHEMA = tiny_schema("click")
VOCAB = {c["name"]: c["cardinality"] for c in SCHEMA["categorical"] + SCHEMA["multi_hot"]}
# maml adapts the embedding rows too: a task's own copy of a row (``lookup.py``'s per_task), so
# rows repeat a hot slot and the program must sum their gradients as the tape does.
ADAPT = {"maml": "dense+embedding", "fomaml": "dense", "erm": "top"}
# Distinct hot rows a step is expected to touch (sizes the hot exchange, ``hot/sync.py``): item's
# few make its exchange a sparse all-gather, city's many a dense all-reduce.
TOUCHED = {"item": 2, "city": 100, "tags": 100}


def _hot_set(every_id: bool) -> HotSet:
    """Every id of every table hot (no PS work at all), or half of item's ids (cold ones on TFRA),
    every city id (local-only) and no tag (a plain TFRA table)."""
    if every_id:
        ids = {t: np.arange(n, dtype=np.int64) for t, n in VOCAB.items()}
        local = {t: True for t in ids}
    else:
        ids = {"item": np.arange(0, 50, 2, dtype=np.int64), "city": np.arange(5, dtype=np.int64),
               "tags": np.zeros(0, np.int64)}
        local = {"city": True}
    return HotSet(ids, {t: 0 for t in ids}, {t: 1 for t in ids}, 0, 1, local_only=local)


class _TwoEqualRanks(LocalSync):
    """Two ranks with the same batches, in one process: every collective is what Horovod's would
    return for two identical ranks (a mean is the rank's own value, a gather two copies). So a
    step takes the several-worker code paths (the dense all-reduce outside the program, the hot
    rows' exchange) and trains as one process does, which the real two-process run can't pin
    to 1e-5 (tests/test_hot_split_distributed.py runs that)."""

    size = 2

    def allgather_group(self, tensors):
        return [tf.concat([t, t], 0) for t in tensors]


def _train(algo, optimizer, in_program, every_id=True, prefetch=True, steps=3, sync=None, sync_every=1,
           finish=True):
    """``steps`` steps from the same start; returns (losses, every table's rows and slots with the
    hot rows written back, the dense weights, the step). ``sync``: the ranks (one process by
    default); ``sync_every``: ``model.hot_sync_every`` (an open window is closed before the
    write-back, as a checkpoint closes it; ``finish`` false: neither)."""
    sync = sync or LocalSync()
    batches = [random_batch(SCHEMA, T=3, S=4, Q=3, seed=s) for s in range(1, steps + 1)]
    model = _model_with_rows(SCHEMA, batches)
    tcfg = TrainConfig(optimizer="adam", embedding_optimizer=optimizer, embedding_learning_rate=0.05)
    dense_opt, emb_opt = make_optimizers(tcfg)
    rows = model.embeddings.use_hot(HotRows(model.tables, _hot_set(every_id), sync, optimizer,
                                            tcfg.embedding_learning_rate, TOUCHED, prefetch=prefetch,
                                            sync_every=sync_every))
    meta = MetaConfig(algo=algo, inner_steps=1, inner_lr=0.3, adapt=ADAPT[algo], jit_compile=True,
                      hot_in_program=in_program)
    step = TrainStep(model, meta, dense_opt, emb_opt, sync)
    assert (step._program is not None) == in_program
    rows.load(emb_opt)
    losses = [float(step.step(b, nxt)["loss"]) for b, nxt in zip(batches, batches[1:] + [None])]
    if not finish:
        return losses, None, step, batches
    rows.sync_now(emb_opt)
    rows.write_back(emb_opt)  # hot rows and slots into the tables: ``_state`` then holds every row
    return losses, _state(model, emb_opt), step, batches


def _assert_same(a, b):
    (loss_a, state_a, _, _), (loss_b, state_b, _, _) = a, b
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5)
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        if key == "dense":
            for name in state_a[key]:
                np.testing.assert_allclose(state_a[key][name], state_b[key][name], rtol=1e-5, atol=1e-5, err_msg=name)
            continue
        (ka, va), (kb, vb) = state_a[key], state_b[key]
        np.testing.assert_array_equal(ka, kb, err_msg=key)
        np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-5, err_msg=key)


# Each case traces and compiles two steps (5-7 s on 2 cores): Adam in the unit tier, the rest
# (Adagrad, cold ids on TFRA) with the integration tier.
@pytest.mark.parametrize("optimizer", ["adam", pytest.param("adagrad", marks=pytest.mark.integration)])
@pytest.mark.parametrize("algo", ["maml", "fomaml", "erm"])
def test_every_id_hot_trains_as_the_step_outside(algo, optimizer):
    """One process, every id hot: the in-program step against today's compiled step."""
    ref, new = _train(algo, optimizer, False), _train(algo, optimizer, True)
    _assert_same(new, ref)
    # ... and the rows did train: item's rows moved from where they started
    keys, start = (x.numpy() for x in _model_with_rows(SCHEMA, new[3]).tables[0].variable.export())
    trained_keys, trained = new[1]["item/value"]
    assert not np.allclose(trained[np.searchsorted(trained_keys, keys)], start)


@pytest.mark.integration
@pytest.mark.parametrize("algo,optimizer,prefetch", [
    ("maml", "adam", True),
    ("fomaml", "adagrad", False),
    ("erm", "adam", False),
])
def test_cold_ids_stay_on_tfra_and_train_the_same(algo, optimizer, prefetch):
    """Some ids cold (TFRA's shadow lookup, or read ahead with ``prefetch``), one table not hot
    at all: the cold rows are looked up before the program and applied after, as before."""
    ref = _train(algo, optimizer, False, every_id=False, prefetch=prefetch)
    new = _train(algo, optimizer, True, every_id=False, prefetch=prefetch)
    _assert_same(new, ref)


def _op_types(step, batch):
    """The op types of the step's graph, the functions it calls (the XLA program's) included."""
    fn = step._compiled_ahead if step.prefetching else step._compiled
    args = (batch, batch) if step.prefetching else (batch,)
    graph_def = fn.get_concrete_function(*args).graph.as_graph_def()
    outer = {n.op for n in graph_def.node}
    inner = {n.op for f in graph_def.library.function for n in f.node_def}
    return outer, inner


def test_every_id_hot_step_holds_no_tfra_op():
    """Where the whole vocabulary is hot, the step never calls TFRA: no ``TFRA>`` op anywhere in
    its graph; the hot rows' scatters are in the called functions (the program), none outside.
    With cold ids the same step does hold TFRA's ops (the check is not vacuous)."""
    _, _, step, batches = _train("fomaml", "adam", True, steps=1)
    outer, inner = _op_types(step, batches[0])
    assert not [op for op in outer | inner if op.startswith("TFRA>")]
    assert "ResourceScatterNdUpdate" in inner and "ResourceScatterNdUpdate" not in outer
    _, _, cold_step, batches = _train("fomaml", "adam", True, every_id=False, prefetch=False, steps=1)
    outer, inner = _op_types(cold_step, batches[0])
    assert [op for op in outer | inner if op.startswith("TFRA>")]


def test_config_key():
    on = ["meta.hot_in_program=true", "meta.jit_compile=true", "hot.budget=3MiB"]
    assert load_config(None).meta.hot_in_program is False
    assert load_config(None, on).meta.hot_in_program is True
    with pytest.raises(ConfigError, match="meta.hot_in_program.*meta.jit_compile: true"):
        load_config(None, ["meta.hot_in_program=true", "hot.budget=3MiB"])
    with pytest.raises(ConfigError, match="meta.hot_in_program.*no hot tier"):
        load_config(None, ["meta.hot_in_program=true", "meta.jit_compile=true"])
    with pytest.raises(ConfigError, match="meta.hot_in_program.*no hot tier"):
        load_config(None, on + ["model.hot_split=false"])
    assert load_config(None, on + ["model.hot_sync_every=2"]).meta.hot_in_program is True
    with pytest.raises(ConfigError, match="meta.hot_in_program"):
        load_config(None, ["meta.hot_in_program=sometimes", "meta.jit_compile=true", "hot.budget=3MiB"])


# Several workers (``_TwoEqualRanks``) and hot windows (``model.hot_sync_every``): the program
# leaves what crosses workers outside (``ProgramStep``'s ``HOT_STEPS``). Four steps with a window
# of 3: two local steps, a close, a local step, and the close ``sync_now`` forces.
# (Each case compiles two steps, 10-17 s: the cheapest (ERM) in the unit tier, the rest with the
# integration tier.)
@pytest.mark.parametrize("ranks,sync_every,algo,optimizer", [
    (2, 3, "erm", "adam"),
    pytest.param(2, 1, "maml", "adagrad", marks=pytest.mark.integration),
    pytest.param(1, 3, "fomaml", "adagrad", marks=pytest.mark.integration),
])
def test_several_workers_and_windows_train_as_the_step_outside(ranks, sync_every, algo, optimizer):
    sync = _TwoEqualRanks() if ranks == 2 else LocalSync()
    ref = _train(algo, optimizer, False, every_id=False, steps=4, sync=sync, sync_every=sync_every)
    new = _train(algo, optimizer, True, every_id=False, steps=4, sync=sync, sync_every=sync_every)
    _assert_same(new, ref)
    step = new[2]
    hot = step.embeddings.hot
    assert step._program.apply_dense == (ranks == 1)
    assert (hot.window is None) == (sync_every == 1)
    if ranks == 2:  # the hot rows really crossed (not each rank's own): both exchanges in use
        assert set(hot.grad_sync.modes.values()) == {"dense", "sparse"}, hot.grad_sync.modes
    assert [step._hot_step(step.hot_sync_due(n)) for n in range(1, 5)] == (
        ["local", "local", "close", "local"] if sync_every == 3 else ["exchange" if ranks == 2 else "apply"] * 4)


@pytest.mark.integration
def test_a_window_accumulates_in_the_program_as_outside():
    """The program's ``StaleWindow.add_rows`` (slots with -1s, no unique op) leaves the same
    accumulator and touched marks as ``add`` after the tape's de-duplication: two local steps."""
    out = []
    for in_program in (False, True):
        _, _, step, _ = _train("maml", "adam", in_program, every_id=False, steps=2, sync_every=4, finish=False)
        w = step.embeddings.hot.window
        assert step.embeddings.hot.window_open  # both steps' gradients are in the accumulator
        out.append({t: (w.acc[t].numpy(), w.touched[t].numpy()) for t in w.acc})
    for t in out[0]:
        np.testing.assert_array_equal(out[0][t][1], out[1][t][1], err_msg=t)
        assert out[0][t][1].any() and (t != "item" or not out[0][t][1].all()), t  # 2 batches: some of item's
        np.testing.assert_allclose(out[0][t][0], out[1][t][0], rtol=1e-5, atol=1e-6, err_msg=t)
