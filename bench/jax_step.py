"""The quickstart meta step written in JAX, as one ``jax.jit``: a yardstick for TF's XLA program.

Bench only (issue 43): it runs in ``.venv-jax`` (``make jax-venv``, ``bench/requirements-jax.txt``),
never imports gmeta_tf or TensorFlow, and reads the batches ``bench/jax_compare.py`` wrote from
gmeta's own reader (``batches.npz``), so both steps train on the same ids, features and labels.

The math is gmeta's default quickstart step (``configs/quickstart.yaml``): MAML, second order,
``adapt: top`` (the three top layers adapt), one inner SGD step at lr 0.5 on the support's mean
sigmoid cross-entropy, the query's on the adapted weights, the mean over the batch's tasks;
Adam (Keras' constants, eps 1e-7) on the dense weights, lr 0.003, and lazy Adam, lr 0.01, on the
touched rows of every table (``jnp.unique`` with a static bound, as ``dense_step.padded_rows``).
Tasks are ``jax.vmap`` ped (gmeta tiles the adapted weights to ``[T, ...]``: the same per-task
gradients). Tables are plain arrays, one per feature, donated to the step, so the row updates
are in-place scatters; everything the step does is in one XLA program.

    .venv-jax/bin/python bench/jax_step.py DIR --serve   # a round per stdin line "SECONDS"
    (first line out: ``{"jax_version": ..., "jaxlib_version": ..., "first_loss": ...}``)
    .venv-jax/bin/python bench/jax_step.py DIR --dump /tmp/hlo-jax   # XLA_FLAGS set here
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from gmeta_tf import exit_codes

# Model shapes of configs/quickstart.yaml (the bench's data: 3 dense features, 6 categorical
# tables and one multi-hot, embedding dim 16, concat interaction).
EMBED_DIM = 16
BOTTOM = [32]
TOP = [64, 32]
INNER_LR = 0.5
LR, EMB_LR = 0.003, 0.01
BETA1, BETA2, EPS = 0.9, 0.999, 1e-7
INIT_STDDEV = 0.05


def load(path: str):
    """The batches (``bench/jax_compare.py``'s ``batches.npz``): per part dense/label/mask and
    every feature's ids remapped to ``[0, rows)`` (-1: padding), plus the tables' sizes."""
    z = np.load(path)
    feats = [str(f) for f in z["features"]]
    multi = [bool(m) for m in z["multi"]]
    sizes = [int(s) for s in z["rows"]]
    n = int(z["num_batches"])
    batches = []
    for b in range(n):
        batch = {"task_mask": z[f"{b}/task_mask"]}
        for part in ("support", "query"):
            batch[part] = {k: z[f"{b}/{part}/{k}"] for k in ("dense", "label", "mask")}
            batch[part]["ids"] = [z[f"{b}/{part}/ids/{f}"] for f in feats]
        batches.append(batch)
    return feats, multi, sizes, batches


def reference(path: str, state, feats):
    """gmeta's starting point, when ``batches.npz`` has one: its dense weights and the rows of
    batch 0's ids put into ``state`` (in place), and its loss and dense gradients there."""
    z = np.load(path)
    if "ref/loss" not in z:
        return None
    for k in state["params"]:
        state["params"][k] = z[f"ref/params/{k}"]
    for i, f in enumerate(feats):
        idx, rows = z[f"ref/index/{f}"], z[f"ref/rows/{f}"]
        state["tables"][i][idx] = rows
    return {"loss": float(z["ref/loss"]), "grads": {k: z[f"ref/grads/{k}"] for k in state["params"]}}


def init_state(n_dense: int, sizes, seed: int = 0):
    """Dense weights (Glorot-uniform, zero biases, as ``DenseTower``), tables N(0, 0.05²),
    and zero Adam slots."""
    rng = np.random.default_rng(seed)
    params = {}

    def layer(name, fan_in, fan_out):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        params[f"{name}/w"] = rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)
        params[f"{name}/b"] = np.zeros(fan_out, np.float32)

    d = n_dense
    for i, out in enumerate([*BOTTOM, EMBED_DIM]):
        layer(f"bottom/{i}", d, out)
        d = out
    d = (len(sizes) + 1) * EMBED_DIM
    for i, out in enumerate([*TOP, 1]):
        layer(f"top/{i}", d, out)
        d = out
    tables = [(rng.standard_normal((s, EMBED_DIM)) * INIT_STDDEV).astype(np.float32) for s in sizes]
    zeros = lambda xs: [np.zeros_like(x) for x in xs]  # noqa: E731
    return {"params": params, "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()},
            "tables": tables, "tm": zeros(tables), "tv": zeros(tables), "t": np.zeros((), np.float32)}


def make_step(multi, sizes):
    import jax
    import jax.numpy as jnp

    adapted = [f"top/{i}/{p}" for i in range(len(TOP) + 1) for p in ("w", "b")]

    def linear(x, p, name):
        return x @ p[f"{name}/w"] + p[f"{name}/b"]

    def forward(p, dense, emb):
        """One task: ``dense [N, Dd]``, ``emb [N, F, D]`` → scores ``[N]`` (concat interaction)."""
        x = dense
        for i in range(len(BOTTOM) + 1):
            x = linear(x, p, f"bottom/{i}")
            if i < len(BOTTOM):
                x = jax.nn.relu(x)
        v = jnp.concatenate([x[:, None, :], emb], axis=1)
        x = v.reshape(v.shape[0], -1)
        for i in range(len(TOP)):
            x = jax.nn.relu(linear(x, p, f"top/{i}"))
        return linear(x, p, f"top/{len(TOP)}")[:, 0]

    def task_loss(p, dense, emb, label, mask):
        s = forward(p, dense, emb)
        ce = jnp.maximum(s, 0) - s * label + jnp.log1p(jnp.exp(-jnp.abs(s)))  # sigmoid cross-entropy
        return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    def one_task(ad, shared, sup, qry):
        """MAML for one task: an SGD step on the support, differentiable, then the query loss."""
        g = jax.grad(lambda a: task_loss({**shared, **a}, *sup))(ad)
        fast = jax.tree_util.tree_map(lambda w, gw: w - INNER_LR * gw, ad, g)
        return task_loss({**shared, **fast}, *qry)

    def embed(rows, ids_list):
        out = []
        for r, ids, m in zip(rows, ids_list, multi):
            valid = (ids >= 0).astype(jnp.float32)
            e = r[jnp.maximum(ids, 0)] * valid[..., None]
            if m:
                e = jnp.sum(e, axis=-2) / jnp.maximum(jnp.sum(valid, -1, keepdims=True), 1.0)
            out.append(e)
        return jnp.stack(out, axis=2)  # [T, N, F, D]

    def objective(params, rows, sup_pos, qry_pos, batch):
        ad = {k: params[k] for k in adapted}
        shared = {k: v for k, v in params.items() if k not in ad}
        parts = {}
        for part, pos in (("support", sup_pos), ("query", qry_pos)):
            b = batch[part]
            parts[part] = (b["dense"], embed(rows, pos), b["label"], b["mask"])
        q = jax.vmap(one_task, in_axes=(None, None, 0, 0))(ad, shared, parts["support"], parts["query"])
        tm = batch["task_mask"]
        return jnp.sum(q * tm) / jnp.maximum(jnp.sum(tm), 1.0)

    def adam(w, m, v, g, t, lr):
        m = BETA1 * m + (1 - BETA1) * g
        v = BETA2 * v + (1 - BETA2) * g * g
        lr_t = lr * jnp.sqrt(1 - BETA2 ** t) / (1 - BETA1 ** t)
        return w - lr_t * m / (jnp.sqrt(v) + EPS), m, v

    def touched(tables, batch):
        """Unique ids per table, padded to the static bound (every id position + 1), their rows
        and every position's index into them; the fill id is out of range, so its gather reads
        0 and its scatter is dropped."""
        uniq, sup_pos, qry_pos = [], [], []
        for f, size in enumerate(sizes):
            s_ids, q_ids = batch["support"]["ids"][f], batch["query"]["ids"][f]
            flat = jnp.concatenate([s_ids.ravel(), q_ids.ravel()])
            flat = jnp.where(flat >= 0, flat, size)
            u, inv = jnp.unique(flat, size=flat.size + 1, fill_value=size, return_inverse=True)
            inv = inv.reshape(-1)
            sup_pos.append(jnp.where(s_ids >= 0, inv[: s_ids.size].reshape(s_ids.shape), -1))
            qry_pos.append(jnp.where(q_ids >= 0, inv[s_ids.size:].reshape(q_ids.shape), -1))
            uniq.append(u)
        rows = [t.at[u].get(mode="fill", fill_value=0.0) for t, u in zip(tables, uniq)]
        return uniq, rows, sup_pos, qry_pos

    def loss_and_grads(params, tables, batch):
        uniq, rows, sup_pos, qry_pos = touched(tables, batch)
        loss, (g_dense, g_rows) = jax.value_and_grad(objective, argnums=(0, 1))(params, rows, sup_pos, qry_pos, batch)
        return loss, g_dense, uniq, rows, g_rows

    def step(state, batch):
        loss, g_dense, uniq, rows, g_rows = loss_and_grads(state["params"], state["tables"], batch)
        t = state["t"] + 1.0
        new = {"t": t, "params": {}, "m": {}, "v": {}, "tables": [], "tm": [], "tv": []}
        for k, w in state["params"].items():
            new["params"][k], new["m"][k], new["v"][k] = adam(w, state["m"][k], state["v"][k], g_dense[k], t, LR)
        for table, tm, tv, u, r, g in zip(state["tables"], state["tm"], state["tv"], uniq, rows, g_rows):
            m_rows = tm.at[u].get(mode="fill", fill_value=0.0)
            v_rows = tv.at[u].get(mode="fill", fill_value=0.0)
            r2, m2, v2 = adam(r, m_rows, v_rows, g, t, EMB_LR)  # lazy: the touched rows only
            new["tables"].append(table.at[u].set(r2, mode="drop"))
            new["tm"].append(tm.at[u].set(m2, mode="drop"))
            new["tv"].append(tv.at[u].set(v2, mode="drop"))
        return new, loss

    def dense(params, rows, sup_pos, qry_pos, batch):
        """The dense math alone, what gmeta compiles (``DenseStep``): rows in, gradients out."""
        return jax.value_and_grad(objective, argnums=(0, 1))(params, rows, sup_pos, qry_pos, batch)

    return jax.jit(step, donate_argnums=0), jax.jit(loss_and_grads), jax.jit(touched), jax.jit(dense)


def check(loss_and_grads, state, batch, ref) -> float:
    """The largest relative difference between this step's loss and dense gradients and
    gmeta's (``ref``: uncompiled TF, same weights, rows and batch), scaled by each tensor's
    largest magnitude."""
    loss, g_dense, *_ = loss_and_grads(state["params"], state["tables"], batch)
    worst = abs(float(loss) - ref["loss"]) / max(abs(ref["loss"]), 1e-12)
    for k, g in g_dense.items():
        r = ref["grads"][k]
        worst = max(worst, float(np.abs(np.asarray(g) - r).max() / max(np.abs(r).max(), 1e-12)))
    return worst


def run_rounds(step, state, batches, seconds: float, tasks: int):
    """tasks/s over one round of at least ``seconds`` (and 2 steps), results waited for."""
    n, t0 = 0, time.perf_counter()
    while True:
        state, loss = step(state, batches[n % len(batches)])
        n += 1
        if time.perf_counter() - t0 >= seconds and n >= 2:
            break
    loss.block_until_ready()
    return state, n * tasks / (time.perf_counter() - t0), float(loss)


def dense_rounds(dense, args, seconds: float, tasks: int):
    """tasks/s of the dense math alone (one batch's rows and positions, looked up once)."""
    n, t0 = 0, time.perf_counter()
    while True:
        out = dense(*args)
        n += 1
        if time.perf_counter() - t0 >= seconds and n >= 2:
            break
    jax_block(out)
    return n * tasks / (time.perf_counter() - t0)


def jax_block(tree):
    import jax

    jax.block_until_ready(tree)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="the directory bench/jax_compare.py wrote batches.npz to")
    ap.add_argument("--serve", action="store_true", help="one timed round per stdin line (its seconds)")
    ap.add_argument("--dump", help="dump the step's HLO here (before and after optimization)")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    if args.dump:  # before jax is imported: XLA reads its flags once
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_dump_to={args.dump} --xla_dump_hlo_as_text").strip()
    import jax

    feats, multi, sizes, batches = load(os.path.join(args.data, "batches.npz"))
    tasks = int(batches[0]["task_mask"].shape[0])
    step, loss_and_grads, touched, dense = make_step(multi, sizes)
    state = init_state(batches[0]["support"]["dense"].shape[-1], sizes)
    ref = reference(os.path.join(args.data, "batches.npz"), state, feats)
    state = jax.device_put(state)
    batches = [jax.device_put(b) for b in batches]
    if ref is not None:  # gmeta's weights, rows, loss and dense gradients on batch 0
        diff = check(loss_and_grads, state, batches[0], ref)
        print(f"check against gmeta (loss, dense gradients, batch 0): max relative difference {diff:.2e}",
              file=sys.stderr, flush=True)
        if diff > 1e-4:
            raise SystemExit("bench/jax_step.py computes another step than gmeta's; fix it before timing it")
    _, rows, sup_pos, qry_pos = touched(state["tables"], batches[0])
    dense_args = (state["params"], rows, sup_pos, qry_pos, batches[0])
    jax_block(dense(*dense_args))  # trace + compile, before the step donates the state
    dense_args = jax.tree_util.tree_map(lambda x: x.copy(), dense_args)
    state, loss = step(state, batches[0])  # trace + compile
    # the first line bench/jax_compare.py reads: which JAX measured (``jaxlib`` is its own
    # package; ``jax.lib.__version__``, read here before, is an internal alias)
    import jaxlib

    print(json.dumps({"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
                      "first_loss": round(float(loss), 4)}), flush=True)
    if args.dump:
        return exit_codes.DONE.code
    if not args.serve:
        state, rate, loss = run_rounds(step, state, batches, args.seconds, tasks)
        print(f"{rate:.1f} tasks/s, loss {loss:.4f}")
        return exit_codes.DONE.code
    for line in sys.stdin:  # "SECONDS" (the step) or "SECONDS dense" (its dense math alone)
        seconds, *what = line.split()
        if what == ["dense"]:
            print(f"{dense_rounds(dense, dense_args, float(seconds), tasks)} 0", flush=True)
            continue
        state, rate, loss = run_rounds(step, state, batches, float(seconds), tasks)
        print(f"{rate} {loss}", flush=True)
    return exit_codes.DONE.code


if __name__ == "__main__":
    sys.exit(main())
