"""Worker mode: join the Horovod ring, pin a GPU, connect to the parameter servers.

``worker_runtime`` returns the ``train.runtime.Runtime`` that ``train`` runs with; nothing in the
model, the meta step or the checkpoint code knows whether it is distributed.

* PS addresses come from ``cluster.ps`` (``--ps`` / ``--set``) or, in a TFJob pod, ``TF_CONFIG``.
* Each worker is its own eager client (job ``worker<rank>``) of the ``ps`` job. TFRA tables are
  placed on ``/job:ps/task:i`` by name (``embedding/naming.py``); a job-wide namespace makes every
  worker bind the same PS resources.
* A worker's own task is ``localhost:<port>`` in the cluster it builds (TF's default), which a PS
  on another host cannot reach back. ``GMETA_WORKER_ADDRESS`` (set by the emulated-host launcher,
  launch/emulated_hosts.py) names the address the PS can route to; unset, nothing changes.
* A PS that cannot be reached within ``cluster.connect_timeout_s`` is a ``ClusterError`` naming
  its address, not a hang.
* So is the Gloo rendezvous, waited for before ``hvd.init()`` (``wait_for_rendezvous``): Horovod's
  store gives up after three connection attempts 0.5 s apart, so a rank that got there before
  worker 0 served it (a TFJob's pods start in any order) aborted the process.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, List, Optional

from gmeta_tf.cluster.tf_config import parse_tf_config, tf_config_from_env
from gmeta_tf.config.schema import Config
from gmeta_tf.errors import ClusterError
from gmeta_tf.plan.placement_file import TablePlacement, check_tasks, read_placement
from gmeta_tf.train.runtime import Runtime, connect_once

JOB_NAMESPACE = "gmeta"
WORKER_ADDRESS_ENV = "GMETA_WORKER_ADDRESS"  # "host" or "host:port": this worker as the PS sees it


def ps_addresses(cfg: Config) -> List[str]:
    if cfg.cluster.ps:
        return list(cfg.cluster.ps)
    tfc = tf_config_from_env()
    return list(tfc.ps) if tfc is not None else []


def is_distributed(cfg: Config) -> bool:
    """PS addresses configured, or started by a Horovod launcher (horovodrun / TFJob entrypoint)."""
    return bool(ps_addresses(cfg)) or "HOROVOD_RANK" in os.environ


def wait_reachable(addresses: List[str], timeout_s: float, role: str = "parameter server ps:{i}",
                   hint: str = "is 'gmeta ps serve' running there?") -> None:
    """Until each ``host:port`` accepts a connection; a ``ClusterError`` naming ``role`` (``{i}``:
    its index) and the address once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    for i, addr in enumerate(addresses):
        while True:
            try:
                connect_once(addr, 2.0)
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        f"{role.format(i=i)} at {addr} is not reachable after {timeout_s:.0f} s "
                        f"({e.strerror or e}); {hint}") from None
                time.sleep(0.5)


RENDEZVOUS_ADDR_ENV, RENDEZVOUS_PORT_ENV = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"


def wait_for_rendezvous(env: Dict[str, str], timeout_s: float) -> None:
    """Before ``hvd.init()``: until the Gloo rendezvous named in ``env`` accepts connections
    (module docstring). Nothing to wait for without one (one process; horovodrun serves it
    before it starts a rank, so there it returns at once)."""
    addr, port = env.get(RENDEZVOUS_ADDR_ENV), env.get(RENDEZVOUS_PORT_ENV)
    if addr and port:
        wait_reachable([f"{addr}:{port}"], timeout_s, role="the Gloo rendezvous",
                       hint="it is served by worker 0 (horovodrun, or rank 0's 'gmeta k8s entrypoint'): is it running?")


def rank0_rendezvous(env: Dict[str, str]) -> Optional[str]:
    """The Gloo rendezvous named in ``env`` when worker 0 serves it: in a TFJob's worker (the
    entrypoint's worker 0 serves it for its life, ``launch/tfjob_pod.py``), told by ``TF_CONFIG``
    naming this process a worker. None under horovodrun, whose driver serves it."""
    raw = env.get("TF_CONFIG", "")
    tfc = parse_tf_config(raw) if raw.strip() else None
    addr, port = env.get(RENDEZVOUS_ADDR_ENV), env.get(RENDEZVOUS_PORT_ENV)
    if tfc is None or tfc.task_type != "worker" or not (addr and port):
        return None
    return f"{addr}:{port}"


def load_placement(path: Optional[str]) -> Optional[Dict[str, TablePlacement]]:
    """``placement.yaml`` (written by ``gmeta plan``); the format is in ``plan/placement_file.py``."""
    return read_placement(path)


def _touch_every_ps(n: int) -> None:
    """Run one op on each PS and wait for it: the remote context exists once this returns."""
    import tensorflow as tf

    from gmeta_tf.embedding.devices import ps_device

    for t in range(n):
        with tf.device(ps_device(t)):
            value = tf.constant(1) + 1
        int(value.numpy())


def own_job(rank: int, env: Optional[Dict[str, str]] = None) -> Dict[str, List[str]]:
    """This worker's entry in the cluster it connects to, from ``GMETA_WORKER_ADDRESS``: ``{}``
    when unset (TF then adds ``localhost:<free port>``); without a port, a free one on that host."""
    import socket

    raw = (os.environ if env is None else env).get(WORKER_ADDRESS_ENV, "").strip()
    if not raw:
        return {}
    host, sep, port = raw.rpartition(":") if raw.count(":") == 1 else (raw, "", "")
    host = host if sep else raw
    if sep and not port.isdigit():
        raise ClusterError(f"{WORKER_ADDRESS_ENV}={raw!r}: the port must be a number")
    if not sep:
        try:
            with socket.socket() as s:
                s.bind((host, 0))
                port = str(s.getsockname()[1])
        except OSError as e:
            raise ClusterError(f"{WORKER_ADDRESS_ENV}={raw!r} is not an address of this host: "
                               f"{e.strerror or e}") from None
    return {f"worker{rank}": [f"{host}:{port}"]}


def connect_rank0_first(ps: List[str], sync, gate=None) -> None:
    """Open this rank's eager context on every PS: rank 0 alone, then every other rank at once.

    Why rank 0 first (docs/startup.md): in TF 2.16, ``EagerServiceImpl::CreateContext`` on a PS
    that holds no eager context yet replaces the PS-wide collective executor manager and frees
    the old one, while every context created before keeps a raw pointer to it. Two ranks whose
    first contact with a fresh PS overlaps both find "no context yet"; the second replacement
    frees the manager the first rank's context holds, and that context's next uncached kernel
    (``GetOrCreateKernelAndDevice`` → ``FindOrCreate`` on the freed manager) kills the PS with
    SIGSEGV. Once one context exists on a PS no later one replaces the manager, so after one
    barrier the other ranks connect together: two phases, whatever the number of workers.
    ``gate`` (an elastic ring, ``train/elastic.py``'s ``StartGate``) replaces the barrier: a worker
    joining a running ring must do no collective before the ring's ``run_fn``.
    """
    import tensorflow as tf

    def connect() -> None:
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec({"ps": ps, **own_job(sync.rank)}), job_name=f"worker{sync.rank}", make_master_device_default=False)
        _touch_every_ps(len(ps))  # returns once this rank's context exists on every PS

    if gate is not None:
        gate.rank0_first(sync.rank, "ps-connected", connect)
        return
    if sync.rank == 0:
        connect()
    sync.barrier()
    if sync.rank != 0:
        connect()


def pin_gpu(local_rank: int) -> Optional[str]:
    """Give each rank the GPU of its local rank (dense compute); PS processes stay on CPU."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    gpu = gpus[local_rank % len(gpus)]
    tf.config.set_visible_devices(gpu, "GPU")
    tf.config.experimental.set_memory_growth(gpu, True)
    return gpu.name


def worker_runtime(cfg: Config, log: Callable[[str], None] = print, status_dir: Optional[str] = None):
    """This rank's ``Runtime``. ``status_dir``: the rank's status directory, where an elastic ring
    (``cluster.elastic``) keeps its start-up gates (``train/elastic.py``)."""
    from gmeta_tf.embedding.wire import Wire
    from gmeta_tf.train.dense_sync import HorovodSync

    gate = None
    if cfg.cluster.elastic:
        from gmeta_tf.train.elastic import start_gate

        gate = start_gate(os.environ, status_dir)
    wait_for_rendezvous(dict(os.environ), cfg.cluster.connect_timeout_s)
    sync = HorovodSync.create(Wire(cfg.cluster.wire), elastic=cfg.cluster.elastic,
                              dense_compression=cfg.cluster.dense_compression)
    rank_log = (lambda msg: log(f"[rank {sync.rank}] {msg}")) if sync.size > 1 else log
    gpu = pin_gpu(sync.local_rank)
    ps = ps_addresses(cfg)
    if sync.size > 1 and not ps:
        raise ClusterError(
            f"{sync.size} workers but no parameter servers: each rank would train its own copy of "
            "the embedding tables. Pass --ps host:port,... (or cluster.ps / TF_CONFIG), or use "
            "'gmeta launch local --workers N --ps M'")
    placement = load_placement(cfg.cluster.placement)
    if ps:
        wait_reachable(ps, cfg.cluster.connect_timeout_s)
        connect_rank0_first(ps, sync, gate)
        if placement:
            check_tasks(placement, len(ps))
    rank_log(f"worker {sync.rank}/{sync.size}: {len(ps)} PS ({', '.join(ps) or 'local tables'}), "
             f"device {gpu or 'CPU'}, wire {sync.wire.dtype}"
             + (f" (auto, link {cfg.cluster.link_rate or 'rate unknown'})" if cfg.cluster.wire_dtype == "auto" else "")
             + (", dense gradients int8" if sync.dense_compression == "int8" and sync.size > 1 else ""))
    return Runtime(sync=sync, ps_tasks=len(ps), namespace=JOB_NAMESPACE if ps else None,
                   placement=placement, bp_v2=bool(ps), log=rank_log, ps_addresses=ps, start_gate=gate,
                   rank0_rendezvous=rank0_rendezvous(dict(os.environ)))
