"""``train.steps_per_call``: k steps unrolled into one compiled call train exactly as k calls of
one step, and the trainer's calls end where it has per-step work (log, validation, checkpoint,
last step, fault pause, stop request)."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.embedding.hot.rows import HotRows
from gmeta_tf.embedding.hot.select import HotSet
from gmeta_tf.errors import EXIT_PREEMPTED
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync
from gmeta_tf.train.fault_pause import PausePoint
from gmeta_tf.train.step_calls import call_plan

REPO = Path(__file__).resolve().parents[1]
TOL = dict(rtol=1e-6, atol=1e-6)


# -- the key --------------------------------------------------------------------------------------
@pytest.mark.fast
def test_steps_per_call_key():
    assert load_config(None).train.steps_per_call == 1  # default: today's one step per call
    assert load_config(None, ["train.steps_per_call=8"]).train.steps_per_call == 8
    for bad in ("0", "-2", "true", "two", "1.5"):
        with pytest.raises(ConfigError, match="train.steps_per_call"):
            load_config(None, [f"train.steps_per_call={bad}"])


# -- the call plan --------------------------------------------------------------------------------
def _lengths(sets, end=None, pause=None, start=0):
    cfg = load_config(None, sets)
    end = cfg.train.steps if end is None else end
    plan, out, step = call_plan(cfg, end, pause), [], start
    while step < end:
        n = plan.length(step + 1)
        assert n >= 1
        out.append(n)
        step += n
    return out


@pytest.mark.fast
def test_calls_end_at_every_log_validation_checkpoint_and_last_step():
    base = ["train.steps=23", "train.log_every=10", "train.checkpoint_every=1000"]
    assert _lengths([*base, "train.steps_per_call=1"]) == [1] * 23
    assert _lengths([*base, "train.steps_per_call=4"]) == [4, 4, 2, 4, 4, 2, 3]  # ends 10, 20, 23
    assert _lengths([*base, "train.steps_per_call=4", "train.eval_every=6"]) == [4, 2, 4, 2, 4, 2, 2, 3]
    assert _lengths([*base, "train.steps_per_call=4", "train.checkpoint_every=5"]) == [4, 1, 4, 1, 4, 1, 4, 1, 3]
    assert _lengths([*base, "train.steps_per_call=100"]) == [10, 10, 3]
    # a resumed run starts mid-period: its first call ends at the next boundary
    assert _lengths([*base, "train.steps_per_call=4"], start=7) == [3, 4, 4, 2, 3]


@pytest.mark.fast
def test_the_pause_step_ends_a_call_on_every_rank_and_bounded_tables_take_one_step():
    base = ["train.steps=20", "train.log_every=10", "train.checkpoint_every=1000", "train.steps_per_call=4"]
    for rank in (None, 0, 1):  # the same lengths on every rank, whichever rank pauses
        assert _lengths(base, pause=PausePoint(6, rank)) == [4, 2, 4, 4, 4, 2]  # 6 ends a call
    assert _lengths([*base, "model.max_rows={item: 10}"]) == [1] * 20
    assert _lengths(base, end=9) == [4, 4, 1]  # an end before train.steps


# -- one call of k steps == k calls of one step ---------------------------------------------------
def _model(schema, batches, fuse=True):
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=fuse), schema)
    for table, name in zip(model.tables, model.table_names):
        part = "cat" if name in model.cat_names else "multi"
        ids = np.unique(np.concatenate([b[w][part][name].numpy().ravel() for b in batches for w in ("support", "query")]))
        ids = ids[ids >= 0][::2]  # half the ids exist; the others get their initial rows in a step
        vals = np.random.default_rng(len(ids)).normal(scale=0.3, size=(len(ids), 4)).astype(np.float32)
        table.variable.upsert(tf.constant(ids), tf.constant(vals))
    return model


def _state(model, dense_opt):
    """Dense weights, dense optimizer slots, every table's rows, row slots and step counters."""
    out = {f"dense/{k}": v.numpy() for k, v in model.dense_variables.items()}
    out.update({f"dense_opt/{i}/{v.name}": v.numpy() for i, v in enumerate(dense_opt.variables)})
    for key, keys, values in model.embeddings.rows():
        order = np.argsort(keys)
        out[f"rows/{key}/keys"], out[f"rows/{key}"] = keys[order], values[order]
    out.update({f"iterations/{k}": np.asarray(v.numpy()) for k, v in model.embeddings.step_counters().items()})
    return out


def _assert_same(got, want):
    assert got.keys() == want.keys()
    assert any(k.startswith("dense_opt/") for k in want) and any("/m" in k or "accumulator" in k for k in want)
    for k in want:
        if k.endswith("/keys"):
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
        else:
            np.testing.assert_allclose(got[k], want[k], err_msg=k, **TOL)


def _train(schema, batches, meta, tcfg, calls, hot=False):
    """Train ``batches`` in ``calls`` (a list of call lengths); (losses, stop flags, state)."""
    model = _model(schema, batches, fuse=not hot)
    dense_opt, emb_opt = make_optimizers(tcfg)
    if hot:  # half of item's ids hot; item's cold rows read one step ahead (hot.prefetch)
        ids = {"item": np.arange(0, 50, 2, dtype=np.int64)}
        model.embeddings.use_hot(HotRows(model.tables, HotSet(ids, {"item": 0}, {"item": 1}, 0, 1), LocalSync(),
                                         tcfg.embedding_optimizer, tcfg.embedding_learning_rate, {"item": 100}))
    step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
    before = [v.numpy() for v in model.dense_variables.values()]
    if hot:
        assert step.prefetching
        model.embeddings.load_hot()
    losses, stops, i = [], [], 0
    for n in calls:
        nxt = batches[i + n] if i + n < len(batches) else None
        if n == 1:
            out = step.step(batches[i], nxt)
            losses.append(float(out["loss"]))
            stops.append(bool(out["stop"]))
        else:
            out = step.steps(batches[i:i + n], nxt)
            assert out["loss"].shape == [n] and out["stop"].shape == [n]
            losses += [float(x) for x in out["loss"].numpy()]
            stops += [bool(x) for x in out["stop"].numpy()]
        i += n
    if hot:
        model.embeddings.quiesce()
        model.embeddings.step_boundary()
    assert not all(np.array_equal(b, v.numpy()) for b, v in zip(before, model.dense_variables.values()))
    return losses, stops, _state(model, dense_opt)


CASES = {
    "maml-adam": (dict(algo="maml", adapt="top"), "adam"),
    "fomaml-adagrad-embedding": (dict(algo="fomaml", adapt="dense+embedding"), "adagrad"),
    "erm-adagrad": (dict(algo="erm"), "adagrad"),
    "maml-adagrad-embedding": (dict(algo="maml", adapt="dense+embedding"), "adagrad"),
    "erm-adam": (dict(algo="erm"), "adam"),
}
# Each case traces a one-step and a three-step graph on two models: the second-order ones take
# tens of seconds on 2 cores, so the unit tier keeps the cheap cases.
_SLOW = {"maml-adam", "maml-adagrad-embedding"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.integration) if c in _SLOW else c
                                  for c in CASES])
def test_one_call_of_k_steps_trains_as_k_calls_of_one_step(case):
    meta_kw, optimizer = CASES[case]
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in (1, 2, 3, 4)]
    meta = MetaConfig(inner_steps=1, inner_lr=0.3, embedding_inner_lr=0.5, **meta_kw)
    tcfg = TrainConfig(optimizer=optimizer, embedding_optimizer=optimizer, learning_rate=0.01,
                       embedding_learning_rate=0.05)
    l1, s1, single = _train(schema, batches, meta, tcfg, [1, 1, 1, 1])
    lk, sk, unrolled = _train(schema, batches, meta, tcfg, [3, 1])
    np.testing.assert_allclose(lk, l1, **TOL)
    assert len(set(np.round(l1, 4))) == 4  # four different steps, not one loss repeated
    assert s1 == sk == [False] * 4
    _assert_same(unrolled, single)


@pytest.mark.integration  # two models with hot tiers, three traces (~30 s on 2 cores)
def test_unrolled_calls_keep_the_cold_row_prefetch_exact():
    """Each unrolled step reads the next step's cold rows and patches the ones it updated; the
    last reads the next call's first batch. Consecutive batches share cold rows, so a wrong
    patch or a stale read inside the call would show in the rows."""
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in (1, 2, 3, 4, 5)]
    meta = MetaConfig(algo="fomaml", inner_steps=1, inner_lr=0.3, adapt="dense+embedding")
    tcfg = TrainConfig(optimizer="adam", embedding_optimizer="adam", embedding_learning_rate=0.05)
    l1, _, single = _train(schema, batches, meta, tcfg, [1] * 5, hot=True)
    lk, _, unrolled = _train(schema, batches, meta, tcfg, [3, 2], hot=True)
    np.testing.assert_allclose(lk, l1, **TOL)
    _assert_same(unrolled, single)


def test_the_stop_vote_rides_in_every_step_of_a_call():
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in (1, 2)]
    model = _model(schema, batches)
    dense_opt, emb_opt = make_optimizers(TrainConfig())
    step = TrainStep(model, MetaConfig(algo="erm"), dense_opt, emb_opt, LocalSync())
    assert step._compiled_steps._autograph is False  # the unrolled call is traced as written
    assert step.steps(batches)["stop"].numpy().tolist() == [False, False]
    step.vote_stop(True)
    assert step.steps(batches)["stop"].numpy().tolist() == [True, True]
    with pytest.raises(ValueError, match="at least one batch"):
        step.steps([])


# -- the trainer ----------------------------------------------------------------------------------
RUN = ["train.steps=16", "train.log_every=4", "train.checkpoint_every=8", "train.eval_every=8",
       "data.tasks_per_batch=8", "data.support=8", "data.query=4", "data.shuffle_buffer=64",
       "model.embedding_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[16]", "eval.max_tasks=20"]


@pytest.fixture(scope="module")
def runs_in_calls(prepared_kinds, tmp_path_factory):
    """``RUN`` trained straight through in one and in three steps a call, once for the module:
    ``{k: (summary, [(validated step, auc)], checkpoint names)}``. The three-step run is also
    the uninterrupted reference the preempted run's resume must reach bit for bit."""
    from gmeta_tf.train.trainer import train

    data, root = prepared_kinds["click"], tmp_path_factory.mktemp("calls")
    runs = {}
    for k in (1, 3):
        seen = []
        summary = train(load_config(None, [f"data.path={data}", *RUN, f"train.steps_per_call={k}"]),
                        root / f"k{k}", on_validation=lambda step, m: seen.append((step, m["auc"])))
        ckpts = sorted(p.name for p in (root / f"k{k}" / "checkpoints").glob("ckpt-*"))
        runs[k] = (summary, seen, ckpts)
    return runs


@pytest.mark.integration  # two short trainings (~15 s on 2 cores)
def test_a_run_in_calls_logs_validates_and_checkpoints_the_same_steps(runs_in_calls):
    (s1, v1, c1), (s3, v3, c3) = runs_in_calls[1], runs_in_calls[3]
    assert [h["step"] for h in s3["history"]] == [h["step"] for h in s1["history"]] == [4, 8, 12, 16]
    np.testing.assert_allclose([h["loss"] for h in s3["history"]], [h["loss"] for h in s1["history"]], rtol=1e-5)
    assert [s for s, _ in v3] == [s for s, _ in v1] == [8, 16]
    np.testing.assert_allclose([a for _, a in v3], [a for _, a in v1], atol=1e-5)
    assert c3 == c1 == ["ckpt-00000008", "ckpt-00000016"]


# A real process: ``train`` with a validation hook that sends the process SIGTERM while rank 0
# validates step 8; the stop is voted in the next call and checkpointed at that call's end.
_PREEMPTED_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.errors import Preempted
    from gmeta_tf.train.trainer import train

    def on_validation(step, metrics):
        if step == 8:
            os.kill(os.getpid(), signal.SIGTERM)

    cfg = load_config(None, sys.argv[2:])
    try:
        train(cfg, sys.argv[1], on_validation=on_validation)
    except Preempted as e:
        print(e, flush=True)
        sys.exit(143)
    sys.exit(0)
""")


@pytest.mark.faults
@pytest.mark.integration  # two short trainings in real processes, against the module's straight run
def test_sigterm_during_a_validation_stops_at_the_end_of_the_call_and_resumes_to_the_same_weights(
        prepared_kinds, runs_in_calls, tmp_path):
    # ``runs_in_calls``' three-step run: calls 1-3, 4, 5-7, 8, 9-11, 12, 13-15, 16 (each ends
    # where a step logs, validates or checkpoints; a call is three steps at most)
    sets = [f"data.path={prepared_kinds['click']}", *RUN, "train.steps_per_call=3"]
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _PREEMPTED_SCRIPT, str(run), *sets], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_PREEMPTED, out[-3000:]
    done = sorted(int(p.name[5:13]) for p in (run / "checkpoints").glob("ckpt-*") if (p / "meta.json").exists())
    # step 8's checkpoint, then the end of a call: the next one (9-11, three steps, not its first
    # step 9) when the vote was raised before it started, else the one after (12)
    assert done[0] == 8 and done[1:] in ([11], [12]), (done, out[-3000:])
    assert f"checkpointed step {done[-1]}" in out and "SIGTERM" in out, out[-3000:]

    resumed = subprocess.run([sys.executable, "-m", "gmeta_tf.cli.main", "train", "--out", str(run),
                              "--data", str(prepared_kinds["click"]),
                              *[a for s in sets for a in ("--set", s)]],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"at step {done[-1]}" in resumed.stdout + resumed.stderr
    straight = runs_in_calls[3][0]
    assert straight["last_step"] == 16
    assert json.loads((run / "train_summary.json").read_text())["dense_digest"] == straight["dense_digest"]


@pytest.mark.fast
def test_steps_per_call_with_a_stale_hot_tier_is_refused_naming_both_keys():
    """Several steps in one call sync the hot rows at every step: with ``model.hot_sync_every``
    > 1 one of the two would not do what it says, so the pair is refused before anything runs."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.config.schema import ConfigError

    with pytest.raises(ConfigError, match="train.steps_per_call.*model.hot_sync_every 4"):
        load_config("configs/quickstart.yaml", ["train.steps_per_call=4", "model.hot_sync_every=4", "hot.budget=1MiB"])
    assert load_config("configs/quickstart.yaml", ["train.steps_per_call=4"]).train.steps_per_call == 4
