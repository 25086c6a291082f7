"""Predicted per-step cost of one PS from the set of shards it holds.

CONTRACT (shared by search, baselines, calibration and the bench suite)::

    model = load_cost_model(path_or_None)          # None -> the default shipped with the package
    ms = model.ps_cost(shards, samples_per_step)   # float, milliseconds per training step

``samples_per_step`` is how many samples' ids reach the PS tier per step (all workers together:
workers x tasks_per_batch x (support + query)); each shard gets ``pooling x samples_per_step``
lookups. An empty shard list costs 0.

PLACEHOLDER: this analytic model stands in until the calibrated, fitted (scikit-learn) model
replaces it; keep the two names above stable.
"""
from __future__ import annotations

from typing import Optional, Sequence

from gmeta_tf.plan.spec import Shard


class CostModel:
    def ps_cost(self, shards: Sequence[Shard], samples_per_step: int) -> float:
        if not shards:
            return 0.0
        per_table = 0.3  # ms of fixed per-table op overhead (lookup + update kernels)
        lookups_dim = sum(s.pooling * samples_per_step * s.dim for s in shards)
        return per_table * len(shards) + 2e-5 * lookups_dim


def load_cost_model(path: Optional[str] = None) -> CostModel:
    return CostModel()
