"""What a TFJob pod runs (``gmeta k8s entrypoint``): the role comes from ``TF_CONFIG``.

* ``ps``: a parameter server on its ``TF_CONFIG`` address, readiness probe on
  ``GMETA_HEALTH_PORT``.
* ``worker``: a Horovod rank without ``horovodrun``: rank = task index, size = number of
  workers; worker 0 hosts the Gloo rendezvous on ``GMETA_RENDEZVOUS_PORT`` and every rank
  reaches it at worker 0's host. The ``HOROVOD_*`` variables are exactly what
  ``horovodrun --gloo`` would set (``launch/gloo_rendezvous.py``). Then ``gmeta train`` runs
  against the PS of ``TF_CONFIG``, always resuming from the run directory's latest checkpoint,
  so a restarted pod (``restartPolicy: OnFailure``) continues the job.
"""
from __future__ import annotations

import os
from typing import Dict, Optional

from gmeta_tf.cluster.tf_config import TFConfig
from gmeta_tf.errors import ClusterError
from launch.tfjob_ports import (
    GLOO_IFACE_ENV,
    HEALTH_PORT,
    HEALTH_PORT_ENV,
    POD_IFACE,
    RENDEZVOUS_PORT,
    RENDEZVOUS_PORT_ENV,
)

DEFAULT_RENDEZVOUS_PORT = RENDEZVOUS_PORT  # a pod's, unless GMETA_RENDEZVOUS_PORT says otherwise
DEFAULT_HEALTH_PORT = HEALTH_PORT  # a PS pod's, unless GMETA_HEALTH_PORT says otherwise


def _int_env(env: Dict[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ClusterError(f"{key}={raw!r} is not a port number") from None


def health_port(env: Optional[Dict[str, str]] = None) -> int:
    """A PS pod's readiness probe port: ``GMETA_HEALTH_PORT``, else the TFJob's."""
    return _int_env(dict(os.environ if env is None else env), HEALTH_PORT_ENV, DEFAULT_HEALTH_PORT)


def worker_hostnames(tfc: TFConfig):
    # One Horovod "host" per worker pod; names only need to differ (pods may share an IP in tests).
    return [f"worker-{i}" for i in range(len(tfc.workers))]


def worker_env(tfc: TFConfig, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    from launch.gloo_rendezvous import rank_env

    env = dict(os.environ if env is None else env)
    if not tfc.workers:
        raise ClusterError("TF_CONFIG cluster.worker is empty: a worker needs the worker list")
    port = _int_env(env, RENDEZVOUS_PORT_ENV, DEFAULT_RENDEZVOUS_PORT)
    host0 = tfc.workers[0].rsplit(":", 1)[0]
    return rank_env(tfc.task_index, worker_hostnames(tfc), host0, port, env.get(GLOO_IFACE_ENV, POD_IFACE))


def start_rendezvous_if_rank0(tfc: TFConfig, env: Optional[Dict[str, str]] = None):
    from launch.gloo_rendezvous import GlooRendezvous

    env = dict(os.environ if env is None else env)
    if tfc.task_index != 0:
        return None
    port = _int_env(env, RENDEZVOUS_PORT_ENV, DEFAULT_RENDEZVOUS_PORT)
    try:
        return GlooRendezvous(worker_hostnames(tfc), port).start()
    except OSError as e:
        raise ClusterError(f"worker 0 cannot serve the Gloo rendezvous on port {port}: {e.strerror}") from None
