"""Vectorized meta step against per-task loops, same model, same batches, all compiled.

The per-task loops (``meta.task_loop``) are the same MAML objective with tasks handled one at
a time inside one ``tf.function``; every variant runs the full step (one lookup per table,
inner loop, second-order outer gradient, dense + TFRA optimizer updates):

* ``task_loop`` (the headline): a run-time ``tf.while_loop`` over tasks — what
  ``for t in tf.range(T)`` compiles to, i.e. a port of single-task MAML code;
* ``unrolled_loop``: a Python ``for`` over tasks, unrolled into the graph. The runtime can then
  execute several tasks' ops side by side (inter-op parallelism), which is a partial
  vectorization done by TensorFlow, at the price of a graph that grows with T.

The vectorized step runs twice, with its dense math compiled by XLA (``meta.jit_compile``) and
not; ``tasks_per_s_vectorized`` and the speedups are for what the config's default picks. All
variants are measured in one process, interleaved in rounds; the first call of each (tracing,
XLA compilation) is excluded.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import Config
from gmeta_tf.meta.dense_step import jit_enabled
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.meta.task_loop import maml_loss_task_loop, maml_loss_task_while_loop
from gmeta_tf.metaio.reader import load_schema, make_dataset
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync

# ``smoke`` (``python -m bench.run --smoke``): every variant traced, compiled and stepped, one round
# of two steps each: the code runs as in the real run, only the window shrinks; no figure is read.
SMOKE_SECONDS, SMOKE_ROUNDS = 0.0, 1
ROUNDS = 4
# The smoke's steps by what makes one (issue 53): the default step is measured by ``measure``,
# ``measure_flat_call`` and ``measure_steps_per_call`` (k=1) alike, the every-id-hot compiled
# step by ``measure_hot_in_program`` and ``measure_flat_call``; the smoke traces each once and
# drives it from each (``reuse``; no figure is read). A step a measurement changes
# (``_tf_call``) is always its own.
_SMOKE_STEPS: Dict[Tuple, object] = {}


def _reused(key: Tuple, make, reuse: bool):
    if not reuse:
        return make()
    if key not in _SMOKE_STEPS:
        _SMOKE_STEPS[key] = make()
    return _SMOKE_STEPS[key]


def _window(seconds: float, smoke: bool) -> Dict[str, float]:
    """``_wall_and_cpu_rates``' window arguments: the measured ``seconds`` in ``ROUNDS``, or the smoke's."""
    return {"seconds": SMOKE_SECONDS, "rounds": SMOKE_ROUNDS} if smoke else {"seconds": seconds, "rounds": ROUNDS}


class TaskLoopStep(TrainStep):
    """``TrainStep`` whose loss is a per-task loop instead of the vectorized inner loop."""

    def __init__(self, model, meta, dense_opt, emb_opt, sync, num_tasks: int, unrolled: bool):
        super().__init__(model, meta, dense_opt, emb_opt, sync)
        if unrolled:
            self._loss = lambda batch: maml_loss_task_loop(model, meta, batch, num_tasks)
        else:
            self._loss = lambda batch: maml_loss_task_while_loop(model, meta, batch)


def _rates(steps: Dict[str, object], batches, seconds: float, T: int, rounds: int = ROUNDS) -> Dict[str, float]:
    """tasks/s of each step, measured in interleaved rounds (median over rounds): on a shared
    2-core box the load drifts, and interleaving puts every variant under the same drift.
    ``batches``: one list for all steps, or ``{step name: list}`` (steps on different data)."""
    return _wall_and_cpu_rates(steps, batches, seconds, T, rounds)[0]


def _wall_and_cpu_rates(steps: Dict[str, object], batches, seconds: float, T: int, rounds: int = ROUNDS):
    """``_rates`` and, per step, tasks per second of this process's CPU time (every thread's):
    the step's work, which other processes' load on a shared box changes far less than wall time."""
    mine = batches if isinstance(batches, dict) else {name: batches for name in steps}
    for name, step in steps.items():
        step.step(mine[name][0])  # trace + compile
    per_round: Dict[str, List[float]] = {name: [] for name in steps}
    cpu_round: Dict[str, List[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            n, t0, c0 = 0, time.perf_counter(), time.process_time()
            batches = mine[name]
            while True:
                out = step.step(batches[n % len(batches)])
                n += 1
                elapsed = time.perf_counter() - t0
                if elapsed >= seconds / rounds and n >= 2:
                    break
            out["loss"].numpy()
            per_round[name].append(n * T / (time.perf_counter() - t0))
            cpu_round[name].append(n * T / max(time.process_time() - c0, 1e-9))
    return ({name: statistics.median(r) for name, r in per_round.items()},
            {name: statistics.median(r) for name, r in cpu_round.items()})


def _step(cfg: Config, schema, variant: str, reuse: bool = False):
    """A fresh model and step: ``jit`` / ``nojit`` (the vectorized step with the dense math
    compiled or not) or a per-task loop (never compiled with XLA: the baseline ports run as is).
    ``reuse`` (the smoke): this process's step of the same config and variant, if one was made."""
    return _reused(("step", repr(cfg), variant), lambda: _new_step(cfg, schema, variant), reuse)


def _new_step(cfg: Config, schema, variant: str):
    model = DLRM(cfg.model, schema)
    d, e = make_optimizers(cfg.train)
    if variant in ("jit", "nojit"):
        meta = replace(cfg.meta, jit_compile=variant == "jit")
        return TrainStep(model, meta, d, e, LocalSync())
    meta = replace(cfg.meta, jit_compile=False)
    return TaskLoopStep(model, meta, d, e, LocalSync(), cfg.data.tasks_per_batch, unrolled=variant == "unrolled_loop")


def _batches(cfg: Config):
    return list(make_dataset(cfg.data.path, "train", cfg.data, training=True).take(8))


def measure(cfg: Config, seconds: float = 8.0, smoke: bool = False) -> Dict[str, float]:
    schema = load_schema(cfg.data.path)
    T = cfg.data.tasks_per_batch
    batches = _batches(cfg)
    samples = float(sum(b["support"]["mask"].numpy().sum() + b["query"]["mask"].numpy().sum()
                        for b in batches)) / len(batches) / T
    rates = _rates({name: _step(cfg, schema, name, smoke) for name in ("jit", "nojit", "task_loop", "unrolled_loop")},
                   batches, T=T, **_window(seconds, smoke))
    default = "jit" if jit_enabled(cfg.meta) else "nojit"  # what meta.jit_compile (auto) runs
    rates["vectorized"] = rates[default]
    return {
        "tasks_per_s_vectorized": rates["vectorized"],
        "tasks_per_s_task_loop": rates["task_loop"],
        "samples_per_s_vectorized": rates["vectorized"] * samples,
        "samples_per_s_task_loop": rates["task_loop"] * samples,
        "tasks_per_s_unrolled_loop": rates["unrolled_loop"],
        "speedup_vs_task_loop": rates["vectorized"] / rates["task_loop"],
        "speedup_vs_unrolled_loop": rates["vectorized"] / rates["unrolled_loop"],
        **_jit_keys(rates, default),
        "tasks_per_batch": T,
        "algo": cfg.meta.algo,
        "adapt": cfg.meta.adapt,
        "inner_steps": cfg.meta.inner_steps,
    }


# 4 s (was 8): the four config rows (bench/run.py's JIT_ROWS) answer one question, whether XLA
# should compile the dense math on CPU, and their ratios have sat at 0.45-0.89 over every run
# (docs/profile.md's table): far enough from 1 that a half window cannot flip the answer. Saves
# 4 rows x 2 steps x 4 s = 32 s of make bench's 45 minutes.
JIT_ROW_SECONDS = 4.0


def measure_jit(cfg: Config, seconds: float = JIT_ROW_SECONDS, smoke: bool = False) -> Dict[str, float]:
    """The vectorized step with its dense math uncompiled and compiled, side by side."""
    rates = _rates({name: _step(cfg, load_schema(cfg.data.path), name) for name in ("jit", "nojit")},
                   _batches(cfg), T=cfg.data.tasks_per_batch, **_window(seconds, smoke))
    default = "jit" if jit_enabled(cfg.meta) else "nojit"
    return {**_jit_keys(rates, default), "algo": cfg.meta.algo, "adapt": cfg.meta.adapt,
            "inner_steps": cfg.meta.inner_steps, "inner_solver": cfg.meta.inner_solver}


def _jit_keys(rates: Dict[str, float], default: str) -> Dict[str, float]:
    return {"tasks_per_s_jit": rates["jit"], "tasks_per_s_nojit": rates["nojit"],
            "jit_speedup": rates["jit"] / rates["nojit"], "jit_default": default == "jit"}


def measure_model_key(cfg: Config, key: str, values: Sequence, seconds: float = 8.0,
                      labels: Sequence[str] = (), smoke: bool = False) -> Dict[str, float]:
    """The vectorized step (the config's default compilation) under each value of ``model.<key>``,
    side by side: ``tasks_per_s_<label>`` each, ``speedup_<first>_over_<second>`` (``labels``:
    the values' names in the keys, by default the values themselves)."""
    schema = load_schema(cfg.data.path)
    variant = "jit" if jit_enabled(cfg.meta) else "nojit"
    labels = list(labels) or [str(v) for v in values]
    steps = {lab: _step(replace(cfg, model=replace(cfg.model, **{key: v})), schema, variant)
             for lab, v in zip(labels, values)}
    rates, cpu = _wall_and_cpu_rates(steps, _batches(cfg), T=cfg.data.tasks_per_batch, **_window(seconds, smoke))
    return {**{f"tasks_per_s_{lab}": rates[lab] for lab in labels},
            f"speedup_{labels[0]}_over_{labels[1]}": rates[labels[0]] / rates[labels[1]],
            **{f"tasks_per_cpu_s_{lab}": cpu[lab] for lab in labels},
            f"cpu_speedup_{labels[0]}_over_{labels[1]}": cpu[labels[0]] / cpu[labels[1]]}


class _InCalls:
    """A ``TrainStep`` driven ``k`` batches per compiled call (``train.steps_per_call``), behind
    the one-batch ``step`` the rate loop calls: batches are gathered and every ``k``-th call runs
    them, so each ``step`` still counts one step's tasks and the wall time is the calls'."""

    def __init__(self, step: TrainStep, k: int):
        import tensorflow as tf  # after gmeta_tf (its environment for TensorFlow)

        self.inner, self.k, self.pending = step, k, []
        self.last = {"loss": tf.constant(0.0)}

    def step(self, batch):
        self.pending.append(batch)
        if len(self.pending) == self.k:
            self.last = {"loss": self.inner.steps(self.pending)["loss"][-1]} if self.k > 1 else self.inner.step(batch)
            self.pending = []
        return self.last


def measure_steps_per_call(cfg: Config, ks: Sequence[int] = (1, 4, 8), seconds: float = 12.0,
                           smoke: bool = False) -> Dict[str, float]:
    """The default step in calls of ``k`` steps (``train.steps_per_call``), side by side in one
    process: ``tasks_per_s_k<k>`` and ``speedup_k<k>_over_k1`` (wall and CPU)."""
    schema = load_schema(cfg.data.path)
    variant = "jit" if jit_enabled(cfg.meta) else "nojit"
    steps = {f"k{k}": _InCalls(_step(cfg, schema, variant, smoke), k) for k in ks}
    batches = _batches(cfg)
    for s in steps.values():  # trace every call length before the clock starts
        for b in batches[:s.k]:
            s.step(b)
    rates, cpu = _wall_and_cpu_rates(steps, batches, T=cfg.data.tasks_per_batch, **_window(seconds, smoke))
    out = {f"tasks_per_s_k{k}": rates[f"k{k}"] for k in ks}
    out.update({f"speedup_k{k}_over_k1": rates[f"k{k}"] / rates["k1"] for k in ks if k != 1})
    out.update({f"cpu_speedup_k{k}_over_k1": cpu[f"k{k}"] / cpu["k1"] for k in ks if k != 1})
    return out


# 8 s (was 16): six steps interleaved, so 16 s was 96 s of make bench. The fused / per-table ratio
# read here is per CPU second, and two runs of 16 s gave 1.09-1.10 at 14 tables and 1.13-1.18 at
# 28 (README): the run-to-run spread, not the window, bounds it. 48 s saved.
def measure_features(cfg: Config, copies: Sequence[int] = (1, 2, 4), seconds: float = 8.0,
                     smoke: bool = False) -> Dict[str, Dict]:
    """Step time against the number of tables of one width: the data's features copied 1, 2, 4
    times (7, 14, 28 tables on the bench's data, ``bench/features.py``), each fused and per
    table, all six interleaved in one process. ``{tables: {tasks_per_s_fused, ..._per_table,
    speedup_fused_over_per_table, tasks_per_s}}`` (``tasks_per_s``: fused, the default), and
    the same per second of CPU time (``tasks_per_cpu_s_*``, ``cpu_speedup_*``)."""
    from bench.features import widen

    variant = "jit" if jit_enabled(cfg.meta) else "nojit"
    steps, batches, tables = {}, {}, {}
    for k in copies:
        path = cfg.data.path if k == 1 else widen(cfg.data.path, k, str(Path(cfg.data.path).parent.parent / f"features-x{k}"))
        c = replace(cfg, data=replace(cfg.data, path=path))
        schema = load_schema(path)
        tables[k] = len(schema["categorical"]) + len(schema["multi_hot"])
        for label, fuse in (("fused", True), ("per_table", False)):
            steps[(k, label)] = _step(replace(c, model=replace(c.model, fuse_tables=fuse)), schema, variant)
            batches[(k, label)] = _batches(c)
    rates, cpu = _wall_and_cpu_rates(steps, batches, T=cfg.data.tasks_per_batch, **_window(seconds, smoke))
    return {str(tables[k]): {"tasks_per_s_fused": rates[(k, "fused")], "tasks_per_s_per_table": rates[(k, "per_table")],
                             "speedup_fused_over_per_table": rates[(k, "fused")] / rates[(k, "per_table")],
                             "tasks_per_s": rates[(k, "fused")],
                             "tasks_per_cpu_s_fused": cpu[(k, "fused")], "tasks_per_cpu_s_per_table": cpu[(k, "per_table")],
                             "cpu_speedup_fused_over_per_table": cpu[(k, "fused")] / cpu[(k, "per_table")]}
            for k in copies}


def _hot_step(cfg: Config, schema, batches, in_program: bool, jit: bool = True, reuse: bool = False):
    """The step with every id of every table hot and local-only (the quickstart vocabulary is a
    few MiB: one process holds it whole): the hot rows inside the XLA program
    (``meta.hot_in_program``), or applied outside it as before, the dense math compiled
    (``jit``, ``meta.jit_compile``) or not. ``reuse``: as ``_step``'s (the same config's batches)."""
    return _reused(("hot", repr(cfg), in_program, jit), lambda: _new_hot_step(cfg, schema, batches, in_program, jit),
                   reuse)


def _new_hot_step(cfg: Config, schema, batches, in_program: bool, jit: bool = True):
    import numpy as np

    from gmeta_tf.embedding.hot.rows import HotRows
    from gmeta_tf.embedding.hot.select import HotSet

    model = DLRM(cfg.model, schema)
    d, e = make_optimizers(cfg.train)
    ids = {}
    for c in schema["categorical"] + schema["multi_hot"]:
        part = "cat" if c in schema["categorical"] else "multi"
        seen = np.concatenate([b[w][part][c["name"]].numpy().ravel() for b in batches for w in ("support", "query")])
        ids[c["name"]] = np.union1d(np.arange(int(c["cardinality"]), dtype=np.int64), seen[seen >= 0])
    hot_set = HotSet(ids, {t: 0 for t in ids}, {t: 1 for t in ids}, 0, 1, local_only={t: True for t in ids})
    rows = model.embeddings.use_hot(HotRows(model.tables, hot_set, LocalSync(), cfg.train.embedding_optimizer,
                                            cfg.train.embedding_learning_rate, {t: 1.0 for t in ids}))
    meta = replace(cfg.meta, jit_compile=jit, hot_in_program=in_program)
    step = TrainStep(model, meta, d, e, LocalSync())
    rows.load(e)
    return step


def measure_hot_in_program(cfg: Config, seconds: float = 8.0, smoke: bool = False) -> Dict[str, float]:
    """One process, every id hot: the step with the hot rows, the dense optimizer and the hot
    rows' lazy optimizer inside the XLA program (``meta.hot_in_program``, ``compiled``) against
    the compiled step before it (``previous``: the dense math in XLA, every apply outside) and
    the step not compiled at all (``uncompiled``, what ``meta.jit_compile: auto`` runs on CPU),
    interleaved in one process; wall and CPU tasks/s."""
    schema, batches = load_schema(cfg.data.path), _batches(cfg)
    steps = {"compiled": _hot_step(cfg, schema, batches, True, reuse=smoke),
             "previous": _hot_step(cfg, schema, batches, False),
             "uncompiled": _hot_step(cfg, schema, batches, False, jit=False)}
    return _side_by_side(steps, batches, _window(seconds, smoke), cfg.data.tasks_per_batch,
                         {"compiled_over_previous": ("compiled", "previous"),
                          "compiled_over_uncompiled": ("compiled", "uncompiled")})


def _side_by_side(steps: Dict[str, object], batches, window: Dict[str, float], T: int,
                  pairs: Dict[str, Tuple[str, str]]) -> Dict[str, float]:
    """``steps`` interleaved in one process (``window``: ``_window``'s): ``tasks_per_s_<step>``
    each, and for each pair ``name: (a, b)`` ``speedup_<name>`` (wall) and ``cpu_speedup_<name>``
    (CPU), a over b."""
    rates, cpu = _wall_and_cpu_rates(steps, batches, T=T, **window)
    out = {f"tasks_per_s_{k}": rates[k] for k in steps}
    for name, (a, b) in pairs.items():
        out[f"speedup_{name}"], out[f"cpu_speedup_{name}"] = rates[a] / rates[b], cpu[a] / cpu[b]
    return out


def _tf_call(step: TrainStep) -> TrainStep:
    """``step`` with its traced functions called as ``tf.function``s, as before ``FlatCall``."""
    for name in ("_compiled", "_compiled_ahead", "_compiled_local", "_prime"):
        fn = getattr(step, name, None)
        if fn is not None:
            setattr(step, name, fn.fn)
    return step


def measure_flat_call(cfg: Config, seconds: float = 8.0, smoke: bool = False) -> Dict[str, float]:
    """The step's traced function called flat (``gmeta_tf/meta/flat_call.py``) against the
    ``tf.function`` call it replaces, the same steps side by side in one process: the default
    step, and every id hot in the XLA program (``meta.hot_in_program``, the step JAX is compared
    with); wall and CPU tasks/s."""
    schema, batches = load_schema(cfg.data.path), _batches(cfg)
    variant = "jit" if jit_enabled(cfg.meta) else "nojit"
    steps = {"flat": _step(cfg, schema, variant, smoke), "tf_call": _tf_call(_step(cfg, schema, variant)),
             "in_program_flat": _hot_step(cfg, schema, batches, True, reuse=smoke),
             "in_program_tf_call": _tf_call(_hot_step(cfg, schema, batches, True))}
    return _side_by_side(steps, batches, _window(seconds, smoke), cfg.data.tasks_per_batch,
                         {"flat_call": ("flat", "tf_call"),
                          "flat_call_in_program": ("in_program_flat", "in_program_tf_call")})


if __name__ == "__main__":
    # ``python -m bench.meta_step {hot_in_program|flat_call} DATA [KEY=VALUE ...]``: that one comparison, on
    # prepared data (``bench.data.prepared_data``) with the quickstart config and the overrides.
    import json
    import sys

    from gmeta_tf.config.loader import load_config

    what = {"hot_in_program": measure_hot_in_program, "flat_call": measure_flat_call}
    if len(sys.argv) < 3 or sys.argv[1] not in what:
        sys.exit(f"usage: python -m bench.meta_step {{{'|'.join(what)}}} DATA [KEY=VALUE ...]")
    sets = [f"data.path={sys.argv[2]}", *sys.argv[3:]]
    print(json.dumps({"sets": sets, **what[sys.argv[1]](load_config("configs/quickstart.yaml", sets))}, indent=1))
