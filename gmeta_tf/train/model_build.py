"""The model a run's config describes, built the same way for training and for loading a run.

Its own module because two sides need it and neither should reach into the other: the trainer
(``trainer.py``) builds it to train, and ``trained_run.py`` rebuilds it with local tables to
evaluate, export or serve a finished run.
"""
from __future__ import annotations

from gmeta_tf.config.schema import Config
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.runtime import Runtime

CONFIG_FILE = "config.yaml"  # the run's config, written by the trainer once a (re)start is accepted
SUMMARY_FILE = "train_summary.json"


def build_model(cfg: Config, schema: dict, rt: Runtime) -> DLRM:
    model = DLRM(cfg.model, schema, namespace=rt.namespace, ps_tasks=rt.ps_tasks,
                 placement=rt.placement, bp_v2=rt.bp_v2)
    if cfg.meta.inner_solver == "newton" and cfg.meta.learn_ridge_lambda and cfg.meta.algo != "erm":
        from gmeta_tf.meta.inner_loop import add_ridge_prior

        add_ridge_prior(model, cfg.meta.ridge_lambda)
    if cfg.meta.support_half_life > 0 and cfg.meta.algo != "erm":
        from gmeta_tf.meta.inner_loop import add_support_recency

        add_support_recency(model, cfg.meta.support_half_life)
    if cfg.model.neighbourhood and cfg.meta.algo != "erm":
        from gmeta_tf.meta.neighbourhood import add_neighbourhood

        add_neighbourhood(model, cfg.model.neighbourhood_dim, seed=cfg.model.seed)
    return model


