"""gmeta's one-process meta step beside the same step in JAX (``bench/jax_step.py``), one window.

    python -m bench.jax_compare --jax-python .venv-jax/bin/python [--rounds 5 --seconds 3]   # + OUT/compare.json
    python -m bench.jax_compare --jax-python .venv-jax/bin/python --dump /tmp/hlo   # then bench/hlo_compare.py

Why one window: on a shared 2-core box the load drifts by more than the difference being
measured, so the steps run in alternating rounds (gmeta uncompiled, gmeta with
``meta.jit_compile: true``, JAX), each round a few seconds, and every figure is the median over
rounds. ``gmeta_in_program`` is the step whose tables are arrays too, as JAX's are: every id of
every table hot and local-only (the quickstart vocabulary is a few MiB), ``meta.hot_in_program``
(the rows' gather, the dense math, the dense Adam and the rows' lazy Adam in one XLA program, no
TFRA op in the step): the same work as JAX's one ``jax.jit``. Besides the whole steps, each side's dense math alone is timed (``gmeta_xla_dense``:
``DenseStep``'s XLA program on looked-up rows; ``jax_dense``: the same function in JAX), which
compares the two XLA programs without TFRA. The JAX step lives in its own process and venv (JAX is a bench-only dependency); it
waits on a pipe while TensorFlow runs, and TensorFlow waits while it runs.

Both train on the same 8 batches from gmeta's reader (the quickstart config on the bench's
data): they are written to ``batches.npz`` with every feature's ids remapped to ``[0, rows)``,
since JAX's tables are arrays. ``--dump`` instead runs the compiled gmeta step and the JAX step
a few times each with ``--xla_dump_to`` (``DIR/tf``, ``DIR/jax``) for ``bench/hlo_compare.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from gmeta_tf import exit_codes


def write_batches(batches, schema: dict, cat: List[str], multi: List[str], out: Path, ref=None) -> None:
    """``batches.npz`` for ``bench/jax_step.py``: ids per feature remapped to dense indices, and
    with ``ref`` (``reference``) gmeta's starting point and its loss and gradients on batch 0."""
    import numpy as np

    feats = cat + multi
    arrays: Dict[str, object] = {"features": np.array(feats), "multi": np.array([f in multi for f in feats]),
                                 "num_batches": np.array(len(batches))}
    sizes = []
    for f in feats:
        kind = "multi" if f in multi else "cat"
        seen = np.unique(np.concatenate([b[p][kind][f].numpy().ravel() for b in batches for p in ("support", "query")]))
        seen = seen[seen >= 0]
        card = next(int(c.get("cardinality", 0)) for c in schema["categorical"] + schema["multi_hot"] if c["name"] == f)
        sizes.append(max(card, len(seen)))
        if ref is not None:
            ids, rows = ref["rows"][f]
            arrays[f"ref/index/{f}"], arrays[f"ref/rows/{f}"] = np.searchsorted(seen, ids), rows
        for i, b in enumerate(batches):
            for p in ("support", "query"):
                ids = b[p][kind][f].numpy()
                arrays[f"{i}/{p}/ids/{f}"] = np.where(ids >= 0, np.searchsorted(seen, ids), -1).astype(np.int32)
    for i, b in enumerate(batches):
        arrays[f"{i}/task_mask"] = b["task_mask"].numpy()
        for p in ("support", "query"):
            for k in ("dense", "label", "mask"):
                arrays[f"{i}/{p}/{k}"] = b[p][k].numpy()
    arrays["rows"] = np.array(sizes)
    if ref is not None:
        arrays["ref/loss"] = np.array(ref["loss"])
        arrays.update({f"ref/params/{k}": v for k, v in ref["params"].items()})
        arrays.update({f"ref/grads/{k}": v for k, v in ref["grads"].items()})
    np.savez(out / "batches.npz", **arrays)


def reference(cfg, schema: dict, batch) -> Dict[str, object]:
    """gmeta's uncompiled step at its start on ``batch``: the dense weights, every feature's
    looked-up rows (by id), the loss and the dense gradients, for ``bench/jax_step.py`` to
    check that it computes the same step before it is timed."""
    import numpy as np
    import tensorflow as tf

    from bench.meta_step import _step

    step = _step(cfg, schema, "nojit")
    model = step.model
    loss, dense_grads, _ = step.gradients(batch)

    @tf.function(autograph=False)
    def rows(b):
        sparse = model.embeddings.lookup(b, trainable=True, per_task=False)
        return [(f.rows, f.support_pos, f.query_pos) for f in sparse.features]

    names = [c["name"] for c in schema["categorical"]] + [c["name"] for c in schema["multi_hot"]]
    by_feature = {}
    for f, (r, sp, qp) in zip(names, rows(batch)):
        kind = "multi" if f in model.multi_names else "cat"
        ids = np.concatenate([batch[p][kind][f].numpy().ravel() for p in ("support", "query")])
        pos = np.concatenate([sp.numpy().ravel(), qp.numpy().ravel()])
        by_feature[f] = (ids[ids >= 0], r.numpy()[pos[ids >= 0]])
    return {"loss": float(loss), "rows": by_feature,
            "params": {k: v.numpy() for k, v in model.dense_variables.items()},
            "grads": {k: tf.convert_to_tensor(g).numpy() for k, g in zip(model.dense_variables, dense_grads)}}


class DenseProgram:
    """gmeta's compiled dense math alone (``DenseStep``'s XLA program) behind the ``step(batch)``
    the rate loop calls: the rows are looked up once (TFRA is not timed) and every call runs the
    program on them, as ``DenseStep.run`` does inside the step."""

    def __init__(self, step, batch):
        import tensorflow as tf

        from gmeta_tf.meta.dense_step import _SAMPLE_KEYS, padded_rows

        dense, model = step._dense_step, step.model

        @tf.function(autograph=False)
        def inputs(b):
            sparse = model.embeddings.lookup(b, trainable=True, per_task=False)
            return padded_rows(sparse), [(f.support_pos, f.query_pos, f.support_valid, f.query_valid)
                                         for f in sparse.features]

        rows, positions = inputs(batch)
        samples = {w: {k: batch[w][k] for k in _SAMPLE_KEYS if k in batch[w]} for w in ("support", "query")}
        samples["task_mask"] = batch["task_mask"]
        params = [model.dense_variables[n].read_value() for n in dense.names]
        self.args = (list(rows), params, [tuple(p) for p in positions], samples)
        self.compiled = dense._compiled

    def step(self, batch):
        return {"loss": self.compiled(*self.args)[0]}


class JaxProcess:
    """``bench/jax_step.py --serve`` behind a pipe: one timed round per ``round`` call."""

    def __init__(self, python: str, data: Path):
        script = Path(__file__).resolve().parent / "jax_step.py"
        self.proc = subprocess.Popen([python, str(script), str(data), "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        first = self.proc.stdout.readline().strip()  # after its compile: which JAX, its first loss
        if not first:
            raise RuntimeError("bench/jax_step.py did not start (is .venv-jax made? `make jax-venv`)")
        self.started = json.loads(first)
        self.versions = {k: self.started[k] for k in ("jax_version", "jaxlib_version")}

    def round(self, seconds: float, what: str = "") -> float:
        """tasks/s of the step (or with ``what="dense"`` of its dense math alone) over a round."""
        self.proc.stdin.write(f"{seconds} {what}\n")
        return float(self.proc.stdout.readline().split()[0])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def compare(cfg, jax_python: str, out: Path, rounds: int, seconds: float) -> Dict[str, object]:
    from bench.meta_step import _batches, _hot_step, _step, _wall_and_cpu_rates
    from gmeta_tf.metaio.reader import load_schema

    schema = load_schema(cfg.data.path)
    batches = _batches(cfg)
    T = cfg.data.tasks_per_batch
    model_names = ([c["name"] for c in schema["categorical"]], [c["name"] for c in schema["multi_hot"]])
    write_batches(batches, schema, *model_names, out, ref=reference(cfg, schema, batches[0]))
    steps = {"gmeta_nojit": _step(cfg, schema, "nojit"), "gmeta_jit": _step(cfg, schema, "jit"),
             "gmeta_in_program": _hot_step(cfg, schema, batches, in_program=True)}
    steps["gmeta_xla_dense"] = DenseProgram(steps["gmeta_jit"], batches[0])
    jax = JaxProcess(jax_python, out)
    per: Dict[str, List[float]] = {name: [] for name in [*steps, "jax", "jax_dense"]}
    try:
        for _ in range(rounds):
            for name, step in steps.items():
                per[name].append(_wall_and_cpu_rates({name: step}, batches, seconds, T, rounds=1)[0][name])
            per["jax"].append(jax.round(seconds))
            per["jax_dense"].append(jax.round(seconds, "dense"))
    finally:
        jax.close()
    med = {name: statistics.median(r) for name, r in per.items()}
    ratios = {"gmeta_nojit_over_jax": med["gmeta_nojit"] / med["jax"], "gmeta_jit_over_jax": med["gmeta_jit"] / med["jax"],
              "gmeta_in_program_over_jax": med["gmeta_in_program"] / med["jax"],
              "xla_dense_tf_over_jax": med["gmeta_xla_dense"] / med["jax_dense"]}
    # a ratio says nothing without the two stacks it compares: each carries them (and the top
    # level, for a reader of one key)
    versions = {**jax.versions, "tensorflow_version": tensorflow_version()}
    return {"tasks_per_s": med, "ms_per_step": {n: 1000.0 * T / r for n, r in med.items()}, **ratios,
            "ratios": {k: {"value": v, **versions} for k, v in ratios.items()}, **versions,
            "rounds": per, "rounds_n": rounds, "seconds_per_round": seconds,
            "jax_first_loss": jax.started.get("first_loss"), "load": os.getloadavg()[0]}


def tensorflow_version() -> str:
    import tensorflow as tf

    return tf.__version__


def dump(cfg, jax_python: str, out: Path) -> None:
    """The compiled gmeta step's XLA program(s) under ``out/tf``, JAX's under ``out/jax``."""
    from bench.meta_step import _batches, _step
    from gmeta_tf.metaio.reader import load_schema

    schema = load_schema(cfg.data.path)
    batches = _batches(cfg)
    step = _step(cfg, schema, "jit")
    for b in batches[:3]:
        step.step(b)["loss"].numpy()
    write_batches(batches, schema, [c["name"] for c in schema["categorical"]],
                  [c["name"] for c in schema["multi_hot"]], out, ref=reference(cfg, schema, batches[0]))
    script = Path(__file__).resolve().parent / "jax_step.py"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    subprocess.run([jax_python, str(script), str(out), "--dump", str(out / "jax")], check=True, env=env)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jax-python", default=".venv-jax/bin/python")
    ap.add_argument("--data", help="prepared data (default: the bench's, bench/data.py)")
    ap.add_argument("--out", default="bench/out/jax-compare")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per step per round")
    ap.add_argument("--dump", help="dump both steps' HLO under DIR/tf and DIR/jax instead of timing")
    ap.add_argument("--set", action="append", default=[], help="config override, e.g. meta.inner_steps=3")
    args = ap.parse_args(argv)
    out = Path(args.dump or args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dump:  # before TensorFlow loads XLA
        os.environ["XLA_FLAGS"] = f"--xla_dump_to={out / 'tf'} --xla_dump_hlo_as_text"

    import gmeta_tf  # noqa: F401
    from gmeta_tf.config.loader import load_config

    data = args.data
    if data is None:
        from bench.data import prepared_data

        data, _ = prepared_data()
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data}", *args.set])
    if args.dump:
        dump(cfg, args.jax_python, out)
        print(f"HLO dumps: {out / 'tf'} {out / 'jax'}; python -m bench.hlo_compare {out / 'tf'} {out / 'jax'}")
        return exit_codes.DONE.code
    res = compare(cfg, args.jax_python, out, args.rounds, args.seconds)
    text = json.dumps(res, indent=1)
    (out / "compare.json").write_text(text)
    print(text)
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
