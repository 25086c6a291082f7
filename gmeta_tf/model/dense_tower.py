"""The DLRM dense tower, written functionally so the inner loop can run it on fast weights.

MAML needs the tower evaluated with *per-task* weights: the inner loop tiles every adapted
weight to ``[T, ...]`` and updates all T copies at once. Keras layers own their weights, so
the tower is a pure function ``forward(params, dense, emb)`` over a dict of tensors; each
weight may be shared (``[in, out]``) or per task (``[T, in, out]``), and the batched matmul
picks the right contraction. The ``tf.Variable`` s themselves live in ``DenseTower.variables``.

Layout: dense features → bottom MLP → a D-vector; with the F embedding vectors it forms F+1
vectors, combined by ``dot`` (pairwise dot products + the bottom vector) or ``concat``;
then the top MLP → one logit (click) or one score (rating).
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import tensorflow as tf

from gmeta_tf.config.schema import ModelConfig

Params = Dict[str, tf.Tensor]


def _linear(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """``x [T, N, in]`` times a shared ``w [in, out]`` or a per-task ``w [T, in, out]``."""
    if w.shape.rank == 2:
        y = tf.einsum("tni,io->tno", x, w)
        return y + b
    y = tf.matmul(x, w)
    return y + b[:, None, :]


class DenseTower:
    def __init__(self, cfg: ModelConfig, n_dense: int, n_sparse: int):
        self.cfg = cfg
        self.n_dense = n_dense
        self.n_sparse = n_sparse
        d = cfg.embedding_dim
        rng = np.random.default_rng(cfg.seed)
        self.variables: Dict[str, tf.Variable] = {}
        self.bottom_layers: List[str] = []
        self.top_layers: List[str] = []

        in_dim = n_dense
        if n_dense > 0:
            for i, out_dim in enumerate([*cfg.bottom_mlp, d]):
                self._add_layer(f"bottom/{i}", in_dim, out_dim, rng)
                self.bottom_layers.append(f"bottom/{i}")
                in_dim = out_dim
        n_vec = n_sparse + (1 if n_dense > 0 else 0)
        if cfg.interaction == "dot":
            top_in = n_vec * (n_vec - 1) // 2 + (d if n_dense > 0 else 0)
        else:
            top_in = n_vec * d
        for i, out_dim in enumerate([*cfg.top_mlp, 1]):
            self._add_layer(f"top/{i}", top_in, out_dim, rng)
            self.top_layers.append(f"top/{i}")
            top_in = out_dim
        iu = np.triu_indices(n_vec, k=1)
        self._pair_index = tf.constant(iu[0] * n_vec + iu[1], tf.int32)
        self._n_vec = n_vec

    def _add_layer(self, name: str, fan_in: int, fan_out: int, rng: np.random.Generator) -> None:
        limit = np.sqrt(6.0 / (fan_in + fan_out))  # Glorot-uniform
        w = rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)
        self.variables[f"{name}/w"] = tf.Variable(w, name=f"{name}/w".replace("/", "_"))
        self.variables[f"{name}/b"] = tf.Variable(
            np.zeros(fan_out, np.float32), name=f"{name}/b".replace("/", "_"))

    def names(self, which: str) -> List[str]:
        """Weight names adapted in the inner loop: ``head`` (the last layer), ``top`` or
        ``dense`` (bottom + top)."""
        if which == "head":
            layers = self.top_layers[-1:]
        else:
            layers = self.top_layers if which == "top" else self.bottom_layers + self.top_layers
        return [f"{layer}/{p}" for layer in layers for p in ("w", "b")]

    @property
    def head_layer(self) -> str:
        return self.top_layers[-1]

    def forward(self, params: Params, dense: tf.Tensor, emb: tf.Tensor) -> tf.Tensor:
        """``dense [T, N, Dd]``, ``emb [T, N, F, D]`` → scores ``[T, N]``."""
        return self.head(params, self.hidden(params, dense, emb))

    def head(self, params: Params, hidden: tf.Tensor) -> tf.Tensor:
        """The last layer: ``hidden [T, N, H]`` → scores ``[T, N]``."""
        last = self.head_layer
        return _linear(hidden, params[f"{last}/w"], params[f"{last}/b"])[:, :, 0]

    def hidden(self, params: Params, dense: tf.Tensor, emb: tf.Tensor) -> tf.Tensor:
        """Everything but the last layer: the features a per-task head is fitted on ``[T, N, H]``."""
        bottom = None
        if self.n_dense > 0:
            x = dense
            for i, layer in enumerate(self.bottom_layers):
                x = _linear(x, params[f"{layer}/w"], params[f"{layer}/b"])
                if i < len(self.bottom_layers) - 1:
                    x = tf.nn.relu(x)
            bottom = x
        # [T, N, V, D]. Not a stack of per-feature slices: each slice's gradient is a full-size
        # tensor, and summing F of them was a tenth of the uncompiled step (docs/profile.md).
        v = emb if bottom is None else tf.concat([bottom[:, :, None, :], emb], axis=2)
        if self.cfg.interaction == "dot":
            z = tf.matmul(v, v, transpose_b=True)  # [T, N, V, V]
            shape = tf.shape(z)
            z = tf.reshape(z, [shape[0], shape[1], self._n_vec * self._n_vec])
            x = tf.gather(z, self._pair_index, axis=2)
            if bottom is not None:
                x = tf.concat([bottom, x], axis=2)
        else:
            shape = tf.shape(v)
            x = tf.reshape(v, [shape[0], shape[1], self._n_vec * self.cfg.embedding_dim])
        for layer in self.top_layers[:-1]:
            x = tf.nn.relu(_linear(x, params[f"{layer}/w"], params[f"{layer}/b"]))
        return x
