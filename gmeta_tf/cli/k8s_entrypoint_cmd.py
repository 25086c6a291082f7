"""``gmeta k8s entrypoint``: the container command of every TFJob replica (see launch/tfjob_pod.py)."""
from __future__ import annotations

import logging
import os

import click

from gmeta_tf.cli.common import friendly_errors
from gmeta_tf.cli.train_cmd import run_training, train_config, train_options


@click.command("entrypoint")
@train_options(with_ps=False)
@friendly_errors
def entrypoint_cmd(config_path, overrides, data, run_dir, algo, steps, resume, warm_start):
    """Serve as a PS or train as a Horovod worker, as TF_CONFIG says."""
    from gmeta_tf.cluster.tf_config import parse_tf_config
    from launch.tfjob_pod import health_port, start_rendezvous_if_rank0, worker_env

    tfc = parse_tf_config(os.environ.get("TF_CONFIG"))
    if tfc.task_type == "ps":
        from ps.server import serve

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        serve(tfc.ps, tfc.task_index, health_port=health_port())
        return
    cfg = train_config(config_path, overrides, data, algo, steps, ",".join(tfc.ps) if tfc.ps else None)
    os.environ.update(worker_env(tfc))
    from gmeta_tf.train.rank_life import rank_life

    # The container's PID 1 gets no default SIGTERM action from the kernel: without a handler the
    # kubelet's SIGTERM is dropped and the pod lingers until SIGKILL. rank_life's watch handles it
    # from here, the rendezvous and start-up included: every rank checkpoints at the first step
    # they agree on, then exits 143 (gmeta_tf/train/preemption.py), or exits 143 when the grace
    # period runs out first. A lost PS exits CLUSTER_FAULT (200): the rendered restartPolicy
    # (ExitCode) retries both (gmeta_tf/exit_codes.py).
    with rank_life(cfg, run_dir, log=lambda m: click.echo(m)):
        rendezvous = start_rendezvous_if_rank0(tfc)
        try:
            # A restarted pod continues the job (a warm start only applies before its first checkpoint).
            summary, rt = run_training(cfg, run_dir, resume=True, warm_start=warm_start)
        finally:
            if rendezvous is not None:
                rendezvous.stop()
    if rt is None or rt.rank == 0:
        click.echo(f"trained {cfg.meta.algo} to step {summary['steps']} over {summary['ranks']} worker(s); "
                   f"run directory {run_dir}")
