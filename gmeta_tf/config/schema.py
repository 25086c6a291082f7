"""The one configuration schema shared by the CLI, the trainer and the launchers.

Every section is a typed dataclass. YAML files and ``--set a.b=c`` overrides are merged into a
plain dict first and converted once (``gmeta_tf.config.loader``), so there is exactly one place
where keys and types are checked and one error format (``ConfigError`` naming the dotted key).
Value ranges are checked in ``__post_init__`` for the same reason: a bad value must fail at
load time with the key's name, not deep inside a ``tf.function``.
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Literal, Optional, Tuple, Union

from gmeta_tf.config.rates import bit_rate


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type, or an out-of-range value."""


def _require(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")


# Every metric ``gmeta eval`` reports that can pick a best checkpoint: +1 higher is better.
METRIC_DIRECTIONS = {"mae": -1, "rmse": -1, "logloss": -1, "auc": 1, "auc_pooled": 1,
                     "p_at_5": 1, "ndcg_at_5": 1}


def metric_direction(name: str) -> Optional[int]:
    """+1 / -1 for a metric key (``mae``, ``auc_finetune``, ``rmse_no_adapt`` ...); None if unknown."""
    base = re.sub(r"_(no_adapt|finetune)$", "", name)
    return METRIC_DIRECTIONS.get(base)


@dataclass
class PrepareConfig:
    """Column mapping and task construction for ``gmeta data prepare``.

    Column names are the *input* table's names. Left empty, they are read from the sidecar
    ``columns.json`` that ``gmeta data synth`` writes next to its Parquet files.
    """

    task_col: Optional[str] = None
    label_col: Optional[str] = None
    label_kind: Optional[Literal["click", "rating"]] = None
    categorical: List[str] = field(default_factory=list)
    multi_hot: List[str] = field(default_factory=list)
    dense: List[str] = field(default_factory=list)
    time_col: Optional[str] = None
    query: int = 16
    max_support: int = 64
    min_task_size: int = 24
    max_task_size: int = 100_000
    split_by: Literal["time", "random"] = "time"
    valid_frac: float = 0.1
    test_frac: float = 0.2
    seed: int = 0
    shards: int = 4
    rows_per_group: int = 512
    on_bad_rows: Literal["error", "skip"] = "error"
    # Categorical columns that get two extra dense features per sample, fitted on the train
    # split's labels (``gmeta_tf/data/target_encoding.py``): the id's shrunk mean label and its
    # log count. They tell the model what a rare id's own embedding row cannot learn.
    target_encoding: List[str] = field(default_factory=list)
    target_encoding_prior: float = 5.0  # pseudo-count k of the global mean in the shrunk mean
    # Cross-validation over tasks (``make quality``): ``folds`` = K > 0 deals the tasks (seeded, by
    # task id) into K equal folds; fold ``fold`` is the test split, the next ``valid_frac`` of all
    # tasks, taken from the following folds, the valid split, the rest train (``data/split.py``).
    # ``test_frac`` is then unused. Preparing folds 0..K-1 makes every task a test task exactly once.
    folds: int = 0
    fold: int = 0
    # How prepare runs (``gmeta_tf/data/prepare.py``): ``duckdb`` streams the input and sorts on
    # disk, so its memory does not grow with the input (only the task list is held); ``memory``
    # holds every input row (~400 B each), the reference the other is tested against.
    engine: Literal["duckdb", "memory"] = "duckdb"
    # DuckDB's memory limit; it spills to the output's temp dir beyond it. Most of prepare's peak
    # RSS (10M rows: 1,361 MiB at 1GiB, 832 MiB at 512MiB, no slower; bench/prepare_engines.py).
    memory_limit: str = "512MiB"
    # "I/N": prepare only part I of N (``gmeta data prepare --part``), so N machines prepare one log:
    # tasks go to splits and shards by a hash of (task id, seed), part I writes the shards s with
    # s % N == I. None: the whole data set with the seeded shuffle of ``data/split.py``.
    part: Optional[str] = None

    def part_index(self) -> Optional[Tuple[int, int]]:
        """``part`` as (I, N), or None."""
        if self.part is None:
            return None
        i, n = self.part.split("/")
        return int(i), int(n)

    def __post_init__(self) -> None:
        _require(re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", self.memory_limit or "") is not None,
                 "prepare.memory_limit", f"must be a size like 1GiB or 512MB, got {self.memory_limit!r}")
        if self.part is not None:
            m = re.fullmatch(r"(\d+)/(\d+)", str(self.part))
            _require(m is not None and int(m.group(2)) >= 1 and int(m.group(1)) < int(m.group(2)),
                     "prepare.part", f"must be I/N with 0 <= I < N, got {self.part!r}")
            _require(int(m.group(2)) <= self.shards, "prepare.part",
                     f"N ({m.group(2)}) must be <= prepare.shards ({self.shards}): each part writes whole shards")
            _require(self.folds == 0, "prepare.part", "cannot be combined with prepare.folds")
            _require(not self.target_encoding, "prepare.part",
                     "cannot be combined with prepare.target_encoding (its tables are fitted on every train task)")
        _require(
            len(set(self.target_encoding)) == len(self.target_encoding) and all(self.target_encoding),
            "prepare.target_encoding",
            f"must be distinct, non-empty column names, got {self.target_encoding}",
        )
        _require(
            math.isfinite(self.target_encoding_prior) and self.target_encoding_prior > 0,
            "prepare.target_encoding_prior",
            f"must be > 0 (an id never seen in training gets the global mean), got {self.target_encoding_prior}",
        )
        _require(self.query >= 1, "prepare.query", f"must be >= 1, got {self.query}")
        _require(self.max_support >= 1, "prepare.max_support", f"must be >= 1, got {self.max_support}")
        _require(
            self.min_task_size >= self.query + 1,
            "prepare.min_task_size",
            f"must be >= query + 1 = {self.query + 1} so every task keeps a support sample, "
            f"got {self.min_task_size}",
        )
        _require(
            self.max_task_size >= self.min_task_size,
            "prepare.max_task_size",
            f"must be >= min_task_size ({self.min_task_size}), got {self.max_task_size}",
        )
        for key in ("valid_frac", "test_frac"):
            v = getattr(self, key)
            _require(0.0 <= v < 1.0, f"prepare.{key}", f"must be in [0, 1), got {v}")
        _require(
            self.valid_frac + self.test_frac < 1.0,
            "prepare.test_frac",
            "valid_frac + test_frac must leave some tasks for training",
        )
        _require(self.shards >= 1, "prepare.shards", f"must be >= 1, got {self.shards}")
        _require(self.rows_per_group >= 1, "prepare.rows_per_group", "must be >= 1")
        _require(self.folds == 0 or self.folds >= 2, "prepare.folds",
                 f"must be 0 (a train / valid / test split by fractions) or >= 2 folds, got {self.folds}")
        _require(0 <= self.fold < max(self.folds, 1), "prepare.fold",
                 f"must be in 0..{max(self.folds, 1) - 1} (prepare.folds is {self.folds}), got {self.fold}")
        _require(self.folds == 0 or self.valid_frac + 1.0 / self.folds < 1.0, "prepare.valid_frac",
                 f"with {self.folds} folds, valid_frac + 1/folds must leave some tasks for training")


@dataclass
class DataConfig:
    """Where the prepared (task-major) data lives and how batches of tasks are shaped."""

    path: str = "runs/demo/data/prepared"
    tasks_per_batch: int = 32  # T
    support: int = 16  # S: support samples per task (padded / truncated, masked)
    query: int = 16  # Q: query samples per task
    max_multi_hot: int = 8  # ids kept per multi-hot feature value
    shuffle_buffer: int = 2048
    parallel_reads: int = 2
    prefetch: int = 4  # tf.data batches read ahead of the step (hot.prefetch is about cold embedding rows)
    seed: int = 0
    # ``fixed``: a training task's support / query are as prepared (query = its latest samples).
    # ``resample``: re-dealt at random each epoch (gmeta_tf/metaio/episodes.py), so every sample
    # is a query target over the epochs. Valid and test splits always keep the prepared split.
    episodes: Literal["fixed", "resample"] = "fixed"
    # ``uniform``: with ``episodes: resample``, each training task keeps k of its re-dealt support
    # samples, k drawn uniformly from 1..``support`` per task and epoch (episodes.py), so training
    # sees the few-shot supports a cold user is scored with. ``none``: every support as full as
    # the task allows. Valid and test are never drawn.
    support_size_draw: Literal["none", "uniform"] = "none"
    # ``{feature: k}``: ids of a categorical / multi-hot feature seen fewer than k times in the
    # train split are read as one shared ``task_format.RARE_ID`` (``metaio/rare_ids.py``), so
    # rare items share one trained embedding row instead of each memorising a few users. The
    # prepared files keep the real ids; only what the model sees changes.
    min_id_count: Dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, k in self.min_id_count.items():
            _require(k >= 1, f"data.min_id_count.{name}", f"must be >= 1, got {k}")
        for key in ("tasks_per_batch", "support", "query", "max_multi_hot", "parallel_reads"):
            _require(getattr(self, key) >= 1, f"data.{key}", f"must be >= 1, got {getattr(self, key)}")
        _require(self.shuffle_buffer >= 0, "data.shuffle_buffer", "must be >= 0")
        _require(self.prefetch >= 0, "data.prefetch", "must be >= 0")
        _require(self.support_size_draw in ("none", "uniform"), "data.support_size_draw",
                 f"must be one of none, uniform, got {self.support_size_draw!r}")
        _require(self.support_size_draw == "none" or self.episodes == "resample", "data.support_size_draw",
                 "draws from re-dealt episodes: set data.episodes: resample too")


# ``model.fuse_tables``' values, checked here only (``ModelConfig``); ``fused.resolve`` decides ``auto``.
FUSE_TABLES = ("auto", True, False)
HOT_SPLIT = ("auto", True, False)
# ``hot.select``'s values, checked here only (``HotConfig``); ``hot/rows.py`` resolves ``auto``.
HOT_SELECT = ("auto", "bytes", "count")
# ``cluster.wire_dtype``'s values, checked here only (``ClusterConfig``); ``embedding/wire.py`` casts.
WIRE_DTYPES = ("auto", "float32", "bfloat16")
# ``cluster.wire_dtype: auto`` sends bfloat16 over links known to run at this rate or slower.
WIRE_AUTO_BF16_AT_MOST = "100mbit"


def wire_dtype_for(setting: str, link_bit_s: Optional[int]) -> str:
    """The dtype ``cluster.wire_dtype`` means on links of ``link_bit_s`` (None: unknown or
    loopback). ``auto``: bfloat16 where the link is known to be at most ``WIRE_AUTO_BF16_AT_MOST``,
    else float32. Why the line is there (docs/network.md, measured on emulated links, 2 workers
    + 2 PS): bfloat16 halves ~115 of the busiest link's ~136 kB a step, ~57 kB, which is 4.6 ms
    at 100 Mbit/s and 0.46 ms at 1 Gbit/s, while its casts and its two-half all-reduce cost the
    step ~6% on unshaped links (0.94x float32's tasks/s, median of three passes), about 2.5 ms:
    it pays below ~180 Mbit/s, and was measured ahead at 100 Mbit/s and 5 Mbit/s."""
    if setting != "auto":
        return setting
    return "bfloat16" if link_bit_s is not None and link_bit_s <= bit_rate(WIRE_AUTO_BF16_AT_MOST) else "float32"


# ``cluster.dense_compression``'s values, checked here only; ``train/int8_wire.py`` encodes.
DENSE_COMPRESSION = ("none", "int8")


@dataclass
class ModelConfig:
    """DLRM: per-feature TFRA tables, bottom MLP on dense features, interaction, top MLP."""

    embedding_dim: int = 16
    bottom_mlp: List[int] = field(default_factory=lambda: [32])
    top_mlp: List[int] = field(default_factory=lambda: [64, 32])
    interaction: Literal["dot", "concat"] = "dot"
    init_stddev: float = 0.05
    seed: int = 0
    # L2 penalty on every looked-up embedding (per sample, as in biased matrix factorisation):
    # it shrinks a rarely seen id toward zero, so its score leans on the shared features, the
    # way a shrunk item mean leans on the global mean. Without it, id rows memorise the few
    # training users who rated an item and cold-user error rises after a few hundred steps.
    embedding_l2: float = 0.0
    # The training loss for rating labels (clicks always use log loss). ``squared`` fits the
    # conditional mean (RMSE's optimum); ``absolute`` fits the conditional median (MAE's
    # optimum): star ratings are skewed toward the high end, so for MAE the median is the better
    # point prediction. Only the outer objective (the query loss of MAML, ERM's loss) uses it:
    # the inner loop keeps fitting a user's support with squared error.
    rating_loss: Literal["squared", "absolute"] = "squared"
    # A ranking term added to the meta-learner's outer (query) loss, times ``ranking_loss_weight``:
    # ``listnet`` (listwise) or ``pairwise`` (RankNet) on each task's query order, so training asks
    # for the order a cold user is shown, which a pointwise loss does not (gmeta_tf/model/heads.py).
    # ``none``: the pointwise loss alone. ERM's loss is unaffected.
    ranking_loss: Literal["none", "listnet", "pairwise"] = "none"
    ranking_loss_weight: float = 1.0
    # A meta-learner's adapted user also gains its support residuals on the query items most like
    # the items they were on (item neighbourhood with learned keys and attention,
    # gmeta_tf/meta/neighbourhood.py); keys ``neighbourhood_dim`` wide. ERM runs ignore it.
    neighbourhood: bool = False
    neighbourhood_dim: int = 16
    # ``{table: N}``: keep at most N rows in that table (continuous training on ever newer ids).
    # After every step the least-updated rows beyond N go, with their optimizer slots
    # (``EmbeddingTable.evict``; TFRA's FrequencyRestrictPolicy counts the updates, and the counts
    # are checkpointed, so a resume evicts exactly as an uninterrupted run).
    max_rows: Dict[str, int] = field(default_factory=dict)
    # Which lookups draw an initial row. ``missing``: a trainable lookup finds the ids first and
    # draws rows only for the ids the table does not hold, each a deterministic N(0, init_stddev²)
    # of (table, id), the same on every rank and after a resume (embedding/initial_rows.py).
    # ``all``: TFRA's initializer draws a random row for every looked-up id on the PS and keeps
    # those of the missing ids (the behaviour before this key).
    init_rows: Literal["missing", "all"] = "missing"
    # How a step's lookups and optimizer applies reach the PS. ``per_ps``: one request per PS
    # (and row width) for all the tables it holds, the PS finding, filling and updating the rows
    # itself (embedding/ps_requests.py): the same tables, files and step, 14 RPCs a step instead
    # of 214 at the quickstart's 7 tables on 2 PS. Tables with max_rows, init_rows: all or a column
    # split keep TFRA's path (a hot tier's cold rows go in the request). ``per_table``: TFRA's own for every table, one find
    # per table and shard, a find and an insert per table, shard and slot table on the apply.
    # ``auto``: per_ps where the tables are on parameter servers, per_table in one process
    # (no round trips to save there; make bench measured it level: 0.93-1.06x in five runs).
    ps_requests: Literal["auto", "per_table", "per_ps"] = "auto"
    # Fused tables (embedding/fused.py): the tables on the same PS list (or the one process)
    # with the same dim are the members of one TFRA table whose keys carry the table's slot in
    # their top bits, so a step's hash-table ops are per fused table, not per feature. Config,
    # the planner, checkpoint files, warm start and export still see one table per feature.
    # ``auto``: fused (fewer hash-table ops and less PS CPU a step, one process a little faster:
    # docs/profile.md; decided in embedding/fused.py, ``resolve``); true / false force it. Tables
    # with max_rows, init_rows: all or a column split are never fused.
    fuse_tables: Union[bool, Literal["auto"]] = "auto"
    # The hot/cold split (``hot.budget`` sizes it). ``true``: as ``hot.budget`` says (0: off);
    # ``false``: off whatever the budget; ``auto``: on only where the network cost model
    # (gmeta_tf/embedding/hot/auto.py) predicts a faster step with it than without, given
    # ``cluster.link_rate``; the log says which and why, in ms and in link bytes. Without a link
    # rate bytes are free, and ``auto`` keeps the split off (make bench: 0.88x on loopback). Under
    # ``auto`` only rows that save link bytes are hot (``hot.select``); none: off.
    hot_split: Union[bool, Literal["auto"]] = True
    # How often the hot tier's replicas sync (gmeta_tf/embedding/hot/stale.py). ``1``: every
    # step, each rank applying the mean gradient over ranks (exact, the behaviour before this
    # key). ``k > 1``: each rank trains its own replica for k steps, accumulating the gradients of
    # the rows it touches; every k-th step (and before a checkpoint or an eviction) the touched
    # rows' accumulated gradients are exchanged, and every rank resets those rows to their value
    # at the last sync and takes one optimizer step with the mean: replicas identical again, one
    # exchange per k steps, rows up to k-1 steps stale between ranks. Needs the hot tier on.
    hot_sync_every: int = 1

    def __post_init__(self) -> None:
        for name, n in self.max_rows.items():
            _require(isinstance(n, int) and n >= 1, f"model.max_rows.{name}", f"must be an integer >= 1, got {n!r}")
        _require(self.embedding_dim >= 1, "model.embedding_dim", "must be >= 1")
        _require(self.embedding_l2 >= 0, "model.embedding_l2", f"must be >= 0, got {self.embedding_l2}")
        _require(self.ranking_loss_weight >= 0, "model.ranking_loss_weight", f"must be >= 0, got {self.ranking_loss_weight}")
        _require(self.neighbourhood_dim >= 1, "model.neighbourhood_dim", f"must be >= 1, got {self.neighbourhood_dim}")
        for key in ("bottom_mlp", "top_mlp"):
            sizes = getattr(self, key)
            _require(all(int(s) >= 1 for s in sizes), f"model.{key}", f"layer sizes must be >= 1, got {sizes}")
        _require(self.init_stddev > 0, "model.init_stddev", "must be > 0")
        _require(self.init_rows in ("missing", "all"), "model.init_rows",
                 f"must be one of missing, all, got {self.init_rows!r}")
        _require(self.ps_requests in ("auto", "per_table", "per_ps"), "model.ps_requests",
                 f"must be one of auto, per_table, per_ps, got {self.ps_requests!r}")
        _require(self.fuse_tables in FUSE_TABLES, "model.fuse_tables",
                 f"must be one of auto, true, false, got {self.fuse_tables!r}")
        _require(self.hot_split in HOT_SPLIT, "model.hot_split",
                 f"must be one of auto, true, false, got {self.hot_split!r}")
        _require(isinstance(self.hot_sync_every, int) and not isinstance(self.hot_sync_every, bool)
                 and self.hot_sync_every >= 1, "model.hot_sync_every",
                 f"must be an integer >= 1 (1: sync the hot rows every step), got {self.hot_sync_every!r}")
        _require(self.hot_sync_every == 1 or self.hot_split is not False, "model.hot_sync_every",
                 f"is {self.hot_sync_every}, but model.hot_split is false: there are no hot replicas to "
                 f"sync; drop model.hot_sync_every or turn the split on")


@dataclass
class MetaConfig:
    """MAML inner loop. ``algo`` picks the outer objective; ``adapt`` what the inner loop moves.

    * ``maml``: second order (the outer gradient flows through the inner updates).
    * ``fomaml``: first order (inner gradients are treated as constants).
    * ``erm``: no inner loop; plain mini-batch training on support+query samples (baseline).
    """

    algo: Literal["maml", "fomaml", "erm"] = "maml"
    inner_steps: int = 1
    inner_lr: float = 0.1
    # ``head``: the last layer only; ``top``: the top MLP; ``dense``: bottom + top MLP;
    # ``dense+embedding``: also the task's own embedding rows.
    adapt: Literal["head", "top", "dense", "dense+embedding"] = "top"
    embedding_inner_lr: float = 0.5
    # How the inner loop moves the adapted weights. ``sgd``: ``inner_steps`` steps of
    # ``inner_lr``. ``newton`` (needs adapt: head): ``inner_steps`` regularised Newton steps on
    # the last layer, (XᵀWX + λI)⁻¹ Xᵀ(y − ŷ) over the support's last hidden features X; for
    # ratings one step is the exact ridge-regression fit of a per-user head, and for a bias
    # alone it is the shrunk mean residual of the item-mean + user-bias baseline, with λ the
    # pseudo-count. It needs no learning rate and cannot overshoot.
    inner_solver: Literal["sgd", "newton"] = "sgd"
    ridge_lambda: float = 5.0
    # newton: learn λ per head feature in the outer loop, starting from ``ridge_lambda``.
    learn_ridge_lambda: bool = False
    # newton: > 0 weighs each support sample by 0.5^(age / h) in the fit, age = how many of the
    # task's support samples are newer (support slots are in time order), starting from
    # h = ``support_half_life`` and learned in the outer loop. A user's taste drifts, so its latest
    # ratings say most about its next ones (evaluation's query is a cold user's latest samples).
    # 0: every support sample weighs the same. Serving: send the support oldest first.
    support_half_life: float = 0.0
    # newton, ratings: the loss the per-task head fits the support with. ``absolute`` fits it by
    # least absolute deviations (``irls_steps`` re-weighted ridge solves, a sample weighing
    # 1 / max(|residual|, a quarter of the label std)): a user's few odd ratings then pull its head
    # far less, and the adapted score is a median, what MAE rewards. ``squared``: one ridge solve.
    support_loss: Literal["squared", "absolute"] = "squared"
    irls_steps: int = 3
    # The training step's dense math (inner loop, query loss, outer gradient) as one XLA
    # program (gmeta_tf/meta/dense_step.py); TFRA lookups and applies stay outside it. ``auto``
    # compiles where ``make bench`` measured it faster (docs/profile.md: nowhere on CPU today);
    # true / false force it.
    jit_compile: Union[bool, Literal["auto"]] = "auto"
    # The hot tier's rows inside that XLA program too (issue 43): the step gathers the hot rows
    # from their worker-local variables, computes, and applies the dense optimizer and the hot
    # rows' lazy Adam / Adagrad in the one program; TFRA is left only the cold ids (looked up
    # before it, applied after). The same training as with it off. With several workers what
    # crosses them leaves the program (Horovod has no XLA lowering on CPU): the dense gradients,
    # and the hot rows' gradients at the steps that exchange them (every step, or the close of a
    # model.hot_sync_every window); inside a window the hot rows' whole step stays in it. Needs
    # meta.jit_compile: true and a hot tier.
    hot_in_program: bool = False

    def __post_init__(self) -> None:
        _require(isinstance(self.hot_in_program, bool), "meta.hot_in_program",
                 f"must be true or false, got {self.hot_in_program!r}")
        _require(not self.hot_in_program or self.jit_compile is True, "meta.hot_in_program",
                 f"puts the hot rows in the compiled step's XLA program and needs meta.jit_compile: true, "
                 f"got {self.jit_compile!r}")
        _require(self.inner_steps >= 1, "meta.inner_steps", f"must be >= 1, got {self.inner_steps}")
        _require(self.inner_solver == "sgd" or self.adapt == "head", "meta.inner_solver",
                 f"'newton' fits the last layer only and needs meta.adapt: head, got {self.adapt!r}")
        _require(self.ridge_lambda > 0, "meta.ridge_lambda", f"must be > 0, got {self.ridge_lambda}")
        _require(self.support_half_life >= 0, "meta.support_half_life", f"must be >= 0, got {self.support_half_life}")
        _require(self.support_half_life == 0 or self.inner_solver == "newton", "meta.support_half_life",
                 "weighs the support in the Newton head's fit and needs meta.inner_solver: newton")
        _require(self.support_loss == "squared" or self.inner_solver == "newton", "meta.support_loss",
                 "'absolute' re-weights the Newton head's fit and needs meta.inner_solver: newton")
        _require(self.irls_steps >= 1, "meta.irls_steps", f"must be >= 1, got {self.irls_steps}")
        _require(self.inner_lr > 0, "meta.inner_lr", f"must be > 0, got {self.inner_lr}")
        _require(self.embedding_inner_lr > 0, "meta.embedding_inner_lr", "must be > 0")


@dataclass
class TrainConfig:
    steps: int = 600
    optimizer: Literal["adam", "adagrad"] = "adam"
    learning_rate: float = 0.003
    embedding_optimizer: Literal["adam", "adagrad"] = "adam"
    embedding_learning_rate: float = 0.01
    # Horovod sums nothing for us: gradients are averaged over ranks. With ``scale_lr`` the
    # learning rates are multiplied by the number of ranks (the usual linear-scaling rule for a
    # global batch that grows with the ranks); off by default so 1 and N ranks take equal steps.
    scale_lr: bool = False
    log_every: int = 50
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    seed: int = 0
    # Validation while training (gmeta_tf/train/validation.py): every ``eval_every`` steps the
    # valid split's users are adapted and scored exactly as ``gmeta eval`` does; the best step's
    # checkpoint is kept and is what ``gmeta eval`` uses. 0 turns validation off.
    eval_every: int = 0
    # Stop after this many validations in a row without a better ``best_metric`` (0: never).
    early_stop_patience: int = 0
    # ``auto``: mae for ratings, auc for clicks; any metric key of ``gmeta eval`` (e.g. rmse,
    # logloss, ndcg_at_5, mae_finetune for an ERM run judged after fine-tuning).
    best_metric: str = "auto"
    # Seconds between SIGTERM (or SIGINT) and the exit: every rank agrees on one step, saves a
    # checkpoint there and exits 143 within it; past it the process exits at once (a checkpoint
    # being written stays absent). 25 fits Kubernetes' default terminationGracePeriodSeconds (30),
    # and `gmeta k8s render` sets the pods' period to this plus a margin.
    preemption_grace_s: float = 25.0
    # Training steps per compiled call (``TrainStep.steps``): k steps unrolled into one
    # ``tf.function``, so the Python round trip between steps (the call, its argument
    # conversion, reading the loss back) is paid once per k steps. Each unrolled step is the
    # same step (one lookup, one all-reduce carrying the stop vote, one apply; the cold-row
    # prefetch reads the next step's rows), so training is the same as with 1 to float
    # precision. Calls end at every log, validation and checkpoint step, at the last step and at
    # GMETA_PAUSE_AT_STEP, so losses, validations and checkpoints land on the same steps; a stop
    # request is acted on at the end of the call (the checkpoint holds its last step). Each call
    # length traces once. With ``model.max_rows`` (eviction between steps) calls are one step.
    steps_per_call: int = 1
    # With ``cluster.elastic``: every this many steps each rank copies its dense weights, their
    # optimizer state and the step to host memory (Horovod Elastic's commit); a lost worker rolls
    # the survivors back to the last one (docs/fault_tolerance.md, "Elastic workers"). A commit
    # lands on the first call end at or past each multiple; lower loses fewer steps, costs a copy.
    elastic_commit_every: int = 10

    def __post_init__(self) -> None:
        _require(self.steps >= 0, "train.steps", f"must be >= 0, got {self.steps}")
        _require(isinstance(self.elastic_commit_every, int) and not isinstance(self.elastic_commit_every, bool)
                 and self.elastic_commit_every >= 1, "train.elastic_commit_every",
                 f"must be an integer >= 1 (steps between elastic commits), got {self.elastic_commit_every!r}")
        _require(isinstance(self.steps_per_call, int) and not isinstance(self.steps_per_call, bool)
                 and self.steps_per_call >= 1, "train.steps_per_call",
                 f"must be an integer >= 1 (steps unrolled into one compiled call), got {self.steps_per_call!r}")
        _require(self.preemption_grace_s > 0, "train.preemption_grace_s",
                 f"must be > 0 seconds, got {self.preemption_grace_s}")
        _require(self.eval_every >= 0, "train.eval_every", f"must be >= 0, got {self.eval_every}")
        _require(self.early_stop_patience >= 0, "train.early_stop_patience",
                 f"must be >= 0, got {self.early_stop_patience}")
        _require(self.early_stop_patience == 0 or self.eval_every > 0, "train.early_stop_patience",
                 "needs train.eval_every > 0 (early stopping counts validations)")
        _require(self.best_metric == "auto" or metric_direction(self.best_metric) is not None,
                 "train.best_metric", f"unknown metric {self.best_metric!r}; one of auto, "
                 + ", ".join(sorted(METRIC_DIRECTIONS)) + " (optionally with _no_adapt or _finetune)")
        _require(self.learning_rate > 0, "train.learning_rate", "must be > 0")
        _require(self.embedding_learning_rate > 0, "train.embedding_learning_rate", "must be > 0")
        _require(self.log_every >= 1, "train.log_every", "must be >= 1")
        _require(self.checkpoint_every >= 1, "train.checkpoint_every", "must be >= 1")
        _require(self.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")


@dataclass
class EvalConfig:
    split: Literal["train", "valid", "test"] = "test"
    # Inner steps used to adapt an unseen task; None = the trained ``meta.inner_steps``.
    adapt_steps: Optional[int] = None
    # ERM runs are also reported fine-tuned on each task's support set (``*_finetune`` keys).
    finetune_steps: int = 5
    finetune_lr: float = 0.05
    max_tasks: int = 0  # 0 = all tasks of the split
    # Baselines scored next to the model on the same users (``baselines`` in eval.json; see
    # gmeta_tf/evaluation/baselines.py). ``item_feature``: the categorical feature that names the
    # item; None = the first categorical feature of schema.json.
    item_feature: Optional[str] = None
    # Pseudo-samples at the global mean added to every item's training statistics:
    # (sum + k·global) / (n + k), so an item seen once barely moves away from the global mean.
    # The defaults sit at the flat optimum of the cold-user MAE on MovieLens latest-small (any
    # k in 2..10 and user k in 0..5 is within 1%): a baseline deliberately left weak proves nothing.
    baseline_shrinkage: float = 5.0
    # The same for a cold user's bias, fitted on its support set: sum(y − item) / (n_support + k).
    baseline_user_shrinkage: float = 2.0
    # Ranking view (p_at_5, ndcg_at_5): a rated query item is relevant when its rating is >= this
    # (clicks: label 1).
    relevance_threshold: float = 4.0
    # Paired comparisons in ``gmeta eval`` (model − baseline per user, gmeta_tf/evaluation/paired.py):
    # a percentile bootstrap over users with this many resamples, confidence level and seed.
    bootstrap_resamples: int = 2000
    bootstrap_confidence: float = 0.95
    bootstrap_seed: int = 0

    def __post_init__(self) -> None:
        _require(self.adapt_steps is None or self.adapt_steps >= 1, "eval.adapt_steps", "must be >= 1")
        _require(self.finetune_steps >= 0, "eval.finetune_steps", "must be >= 0")
        _require(self.max_tasks >= 0, "eval.max_tasks", "must be >= 0")
        _require(self.item_feature is None or bool(self.item_feature), "eval.item_feature",
                 "must be a categorical feature name or null")
        _require(self.baseline_shrinkage >= 0, "eval.baseline_shrinkage", "must be >= 0")
        _require(self.baseline_user_shrinkage >= 0, "eval.baseline_user_shrinkage", "must be >= 0")
        _require(math.isfinite(self.relevance_threshold), "eval.relevance_threshold", "must be a finite number")
        _require(self.bootstrap_resamples >= 100, "eval.bootstrap_resamples",
                 f"must be >= 100 (a percentile interval from fewer is mostly noise), got {self.bootstrap_resamples}")
        _require(0 < self.bootstrap_confidence < 1, "eval.bootstrap_confidence",
                 f"must be in (0, 1), e.g. 0.95, got {self.bootstrap_confidence}")


# Horovod's own bounds on ``--blacklist-cooldown-range`` (horovod/runner/elastic/discovery.py).
ELASTIC_COOLDOWN_BOUNDS_S = (1, 3600)


def check_elastic_cooldown(value) -> None:
    """``cluster.elastic_cooldown_s``: null, or [MIN, MAX] whole seconds within Horovod's bounds.
    Checked here, not left to horovodrun: horovodrun would refuse it only once the PS are up, in
    a traceback that names its own flag, not the key."""
    if value is None:
        return
    lo, hi = ELASTIC_COOLDOWN_BOUNDS_S
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
          and lo <= value[0] <= value[1] <= hi)
    _require(ok, "cluster.elastic_cooldown_s",
             f"must be [MIN, MAX] whole seconds with {lo} <= MIN <= MAX <= {hi} (horovodrun's "
             f"--blacklist-cooldown-range), or null for a lost host never to return; got {value!r}")


@dataclass
class ClusterConfig:
    """Parameter servers. Empty ``ps`` = the embedded default (local tables, one process)."""

    ps: List[str] = field(default_factory=list)
    connect_timeout_s: float = 60.0
    # Deprecated and ignored (docs/startup.md): ranks no longer create tables one by one with a
    # pause between them. Still accepted so that older configs load; setting it warns.
    table_create_settle_s: Optional[float] = None
    # Optional explicit table → PS placement file written by ``gmeta plan``.
    placement: Optional[str] = None
    # Each host's link rate, both directions (``1gbit``, ``100mbit``: decimal bit/s as tc writes
    # them); None: unknown or loopback, bytes cost nothing. What ``model.hot_split: auto`` and
    # the planner's network term read; ``gmeta launch local --network`` knows it for its hosts.
    link_rate: Optional[str] = None
    # The dtype of floating tensors while they cross a link (gmeta_tf/embedding/wire.py): rows
    # from the PS and their gradients back (one request per PS), the dense gradients' and the hot
    # rows' exchange between workers. ``bfloat16`` halves those bytes; what a process keeps
    # (rows, optimizer slots, dense weights) and all math stay float32, ids travel exact.
    # Validation users could not tell it from float32 on either dataset (issue 41, docs/network.md's
    # quality guard), but its casts cost the step where bytes are cheap, so the default ``auto``
    # sends bfloat16 only over links known (``cluster.link_rate``) to be 100 Mbit/s or slower
    # (``wire_dtype_for``), float32 elsewhere; ``float32``: every value arrives as it left.
    wire_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # The dense gradients' all-reduce only (gmeta_tf/train/int8_wire.py): ``int8`` sends each
    # value as one byte with a float32 scale per 128 values, and feeds what rounding dropped into
    # the next step (error feedback), a quarter of float32's bytes; ``none``: ``wire_dtype``.
    # Opt-in: it changes the math (docs/network.md's quality guard says by how much).
    dense_compression: Literal["none", "int8"] = "none"
    # Horovod Elastic (``gmeta launch local --elastic`` sets it): a lost worker rolls the others
    # back to their last commit (``train.elastic_commit_every``) and they go on as a smaller ring,
    # with no restart; a lost PS still restarts from the checkpoint (docs/fault_tolerance.md).
    elastic: bool = False
    # With ``cluster.elastic``: horovodrun's ``--blacklist-cooldown-range MIN MAX`` (seconds). A
    # lost worker's host is left out of the ring for a cool-down that starts near ``2 * MIN`` and
    # doubles at each further loss of that host, capped at ``MAX``; then horovodrun starts a new
    # worker there and the ring re-grows at its next commit. null: a lost host never returns.
    elastic_cooldown_s: Optional[List[int]] = field(default_factory=lambda: [1, 10])
    # With ``cluster.elastic``: how many times the ring may re-form after a failure (horovodrun's
    # ``--reset-limit``, and each rank's own count): past it the job fails, naming the last error,
    # instead of rolling back and failing again for ever.
    elastic_reset_limit: int = 3

    @property
    def link_rate_bit_s(self) -> Optional[int]:
        return None if self.link_rate is None else bit_rate(self.link_rate)

    @property
    def wire(self) -> str:
        """The wire dtype this job sends (``cluster.wire_dtype``, ``auto`` decided by ``link_rate``)."""
        return wire_dtype_for(self.wire_dtype, self.link_rate_bit_s)

    def __post_init__(self) -> None:
        _require(self.connect_timeout_s > 0, "cluster.connect_timeout_s", "must be > 0")
        _require(self.wire_dtype in WIRE_DTYPES, "cluster.wire_dtype",
                 f"must be one of {', '.join(WIRE_DTYPES)}, got {self.wire_dtype!r}")
        _require(isinstance(self.elastic, bool), "cluster.elastic", f"must be true or false, got {self.elastic!r}")
        _require(self.dense_compression in DENSE_COMPRESSION, "cluster.dense_compression",
                 f"must be one of {', '.join(DENSE_COMPRESSION)}, got {self.dense_compression!r}")
        _require(not (self.elastic and self.dense_compression == "int8"), "cluster.dense_compression",
                 "int8 keeps per-rank error-feedback residuals sized by the ring, which an elastic ring "
                 "(cluster.elastic) resizes under the step; use none with --elastic")
        check_elastic_cooldown(self.elastic_cooldown_s)
        _require(isinstance(self.elastic_reset_limit, int) and not isinstance(self.elastic_reset_limit, bool)
                 and self.elastic_reset_limit >= 0, "cluster.elastic_reset_limit",
                 f"must be an integer >= 0 (re-formings of an elastic ring), got {self.elastic_reset_limit!r}")
        if self.link_rate is not None:
            _require(bit_rate(self.link_rate) is not None and bit_rate(self.link_rate) > 0, "cluster.link_rate",
                     f"expected a bit rate such as 1gbit or 100mbit (tc's units; not bytes), got {self.link_rate!r}")
        if self.table_create_settle_s is not None:
            warnings.warn("config key 'cluster.table_create_settle_s' is deprecated and ignored: start-up no "
                          "longer pauses per rank (docs/startup.md); remove it from the config", FutureWarning,
                          stacklevel=2)
        for i, addr in enumerate(self.ps):
            _require(
                isinstance(addr, str) and ":" in addr,
                f"cluster.ps[{i}]",
                f"must be host:port, got {addr!r}",
            )


_BYTE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
               "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(text: str) -> Optional[int]:
    """``256MiB`` / ``1.5GB`` / ``1048576`` → bytes (binary and decimal units, case-insensitive);
    ``None`` when ``text`` is not a size. The one parser for ``hot.budget`` and ``--mem-per-ps``."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _BYTE_UNITS:
        return None
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])


def parse_bytes(value: Union[int, str], key: str) -> int:
    """A config byte size (an int or a ``byte_size`` string); a ``ConfigError`` naming ``key``."""
    if isinstance(value, int) and not isinstance(value, bool):
        _require(value >= 0, key, f"must be >= 0, got {value}")
        return value
    n = byte_size(value)
    _require(n is not None, key, f"expected a byte size such as 256MiB, 64MB or 1048576, got {value!r}")
    return n


@dataclass
class HotConfig:
    """Hot/cold embedding split (``gmeta_tf/embedding/hot``): the most-looked-up rows live on every worker.

    ``budget`` is per worker and counts each hot row with its optimizer slots (Adam: 3 × dim
    floats); 0 turns the split off and training is exactly the plain PS path. The rows are
    chosen from the id profile that ``gmeta data profile`` writes next to ``schema.json``.
    """

    budget: Union[int, str] = 0
    profile: Optional[str] = None  # default: <data.path>/id_profile.npz
    # Rows seen fewer times than this in the profile are never hot, whatever the budget.
    min_count: int = 1
    # Read the next batch's cold rows during this step and write this step's cold updates during
    # the next (embedding/hot/prefetch.py): PS round-trips overlap compute. Exact for one worker; across
    # workers, others' updates arrive up to one step later. Off: cold rows take TFRA's shadow path.
    prefetch: bool = True
    # Which rows may be hot (gmeta_tf/embedding/hot/by_bytes.py). ``count``: the most looked-up
    # rows the budget holds. ``bytes``: only rows whose expected touches save more link bytes as
    # hot rows than their sync costs (for the job's worker count, ``model.hot_sync_every`` and
    # ``cluster.wire_dtype``), then the most looked-up of those the budget holds. ``auto``:
    # ``bytes`` under ``model.hot_split: auto``, ``count`` otherwise (the behaviour before this key).
    select: str = "auto"

    def __post_init__(self) -> None:
        parse_bytes(self.budget, "hot.budget")
        _require(self.min_count >= 1, "hot.min_count", f"must be >= 1, got {self.min_count}")
        _require(self.select in HOT_SELECT, "hot.select",
                 f"must be one of {', '.join(HOT_SELECT)}, got {self.select!r}")

    @property
    def budget_bytes(self) -> int:
        return parse_bytes(self.budget, "hot.budget")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    meta: MetaConfig = field(default_factory=MetaConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    hot: HotConfig = field(default_factory=HotConfig)

    def __post_init__(self) -> None:
        # A k > 1 with no hot tier would be silently meaningless; ``hot_split: auto`` deciding
        # the tier off at run time is logged instead (hot/rows.py).
        _require(self.model.hot_sync_every == 1 or self.hot.budget_bytes > 0, "model.hot_sync_every",
                 f"is {self.model.hot_sync_every}, but hot.budget is 0 (no hot tier): there are no hot "
                 f"replicas to sync; set hot.budget or drop model.hot_sync_every")
        if self.meta.hot_in_program:
            _require(self.hot.budget_bytes > 0 and self.model.hot_split is not False, "meta.hot_in_program",
                     "puts the hot tier's rows in the compiled step, but there is no hot tier (hot.budget is 0 "
                     "or model.hot_split is false); set hot.budget or drop meta.hot_in_program")
        if self.cluster.elastic:
            self._check_elastic()
        _require(self.model.hot_sync_every == 1 or self.train.steps_per_call == 1, "train.steps_per_call",
                 f"is {self.train.steps_per_call} with model.hot_sync_every {self.model.hot_sync_every}: a "
                 f"compiled call of several steps syncs the hot rows at every step; use one of the two")

    def _check_elastic(self) -> None:
        """What an elastic ring (``cluster.elastic``) cannot carry through a lost worker: the hot
        tier's replicated rows live outside the state a commit copies, and a learning rate scaled
        by the ring's start size would stay scaled after it shrinks."""
        _require(not (self.hot.budget_bytes > 0 and self.model.hot_split is not False), "cluster.elastic",
                 f"cannot roll back the hot tier's replicated rows (hot.budget {self.hot.budget!r}, "
                 f"model.hot_split {self.model.hot_split!r}); set hot.budget: 0 or model.hot_split: false")
        _require(not self.train.scale_lr, "cluster.elastic",
                 "with train.scale_lr the learning rates are scaled by the ring's size at start, which an "
                 "elastic ring changes; set train.scale_lr: false")
