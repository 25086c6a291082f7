"""``gmeta train --warm-start``: yesterday's run, today's data (new users, new item ids)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.config.loader import load_config
from gmeta_tf.embedding.table_files import read_table
from gmeta_tf.errors import CheckpointError, DataError

pytestmark = pytest.mark.integration  # trains three small runs

SETS = ["data.tasks_per_batch=8", "data.support=8", "data.query=8", "data.shuffle_buffer=64",
        "model.embedding_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[16]", "train.log_every=10",
        "train.eval_every=10", "train.early_stop_patience=100", "train.checkpoint_every=10"]


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Two days of one synthetic world: day 1 has new users and, in the long tail, new item ids."""
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    root = tmp_path_factory.mktemp("days")
    out = {}
    for day in (0, 1):
        synth(str(root / f"raw{day}"), tasks=400, seed=5, day=day)
        prepare([str(root / f"raw{day}")], str(root / f"day{day}"), load_config("configs/quickstart.yaml").prepare)
        out[day] = root / f"day{day}"
    return out


def _cfg(data: Path, *extra):
    return load_config("configs/quickstart.yaml", [f"data.path={data}", *SETS, *extra])


@pytest.fixture(scope="module")
def yesterday(days, tmp_path_factory):
    from gmeta_tf.train.trainer import train

    run = tmp_path_factory.mktemp("yesterday") / "run"
    train(_cfg(days[0], "train.steps=60"), run)
    return run


def _rows(ckpt_dir: Path, table: str) -> dict:
    keys, values = read_table(str(ckpt_dir), table)
    return dict(zip(keys.tolist(), values))


def _dense_optimizer_iterations(ckpt_dir: Path) -> int:
    reader = tf.train.load_checkpoint(str(ckpt_dir / "dense"))
    name = next(n for n in reader.get_variable_to_shape_map() if n.startswith("dense_optimizer/_iterations"))
    return int(reader.get_tensor(name))


def test_warm_start_carries_weights_rows_and_slots_and_learns_new_ids(days, yesterday, tmp_path):
    from gmeta_tf.train.trainer import train

    source = json.loads((yesterday / "train_summary.json").read_text())
    source_ckpt = yesterday / "checkpoints" / f"ckpt-{source['best']['step']:08d}"
    # Validation logloss picks the best step here: it is what the comparison at the end reads.
    today = ("train.steps=20", "train.best_metric=logloss")
    warm = train(_cfg(days[1], *today), tmp_path / "warm", warm_start=str(yesterday))
    scratch = train(_cfg(days[1], *today), tmp_path / "scratch")

    assert warm["start_step"] == 0 and warm["last_step"] == 20
    assert warm["warm_start"]["checkpoint"] == str(source_ckpt)  # the source's best step by default
    assert warm["warm_start"]["step"] == source["best"]["step"]
    assert json.loads((tmp_path / "warm" / "warm_start.json").read_text()) == warm["warm_start"]
    # The dense optimizer continues: its step counter counts yesterday's steps too.
    ckpt = tmp_path / "warm" / "checkpoints" / "ckpt-00000020"
    assert _dense_optimizer_iterations(ckpt) == _dense_optimizer_iterations(source_ckpt) + 20
    # Rows (and their Adam slots) of ids today's data never touched are yesterday's, bit for bit;
    # today's new ids got rows of their own.
    table_dir = ckpt / "tables"
    slot_tables = sorted({p.name.split("-", 1)[0] for p in table_dir.iterdir()} - {"item_id"})
    old, new = _rows(source_ckpt, "item_id"), _rows(ckpt, "item_id")
    kept = [k for k in old if k in new and np.array_equal(old[k], new[k])]
    assert len(kept) > 0.5 * len(old)  # most of yesterday's items are not in today's batches
    assert set(old) <= set(new)  # nothing of yesterday's was lost
    assert len(set(new) - set(old)) > 100  # today's new items
    assert slot_tables  # the optimizer's slot tables were checkpointed too
    # Warm start is worth it: its first validation is better than a from-scratch run's. Logloss,
    # not per-user AUC: at this size (8 queries a user, 10 steps) per-user AUC is noise, 0.49-0.59
    # across four model seeds of the scratch run, while the warm run's logloss was lower by
    # 0.014-0.029 in all eight runs (both model.init_rows modes, four seeds each).
    first_warm, first_scratch = warm["validation"][0]["logloss"], scratch["validation"][0]["logloss"]
    assert first_warm < first_scratch - 0.005, (first_warm, first_scratch)


def test_a_restarted_warm_run_resumes_its_own_checkpoint(days, yesterday, tmp_path):
    from gmeta_tf.train.trainer import train

    run = tmp_path / "warm"
    train(_cfg(days[1], "train.steps=10"), run, warm_start=f"{yesterday}@latest")
    again = train(_cfg(days[1], "train.steps=20"), run, warm_start=f"{yesterday}@latest")
    assert again["start_step"] == 10 and again["last_step"] == 20
    assert again["warm_start"]["checkpoint"].endswith("ckpt-00000060")  # still names its source


@pytest.mark.parametrize("change, key", [("model.top_mlp=[32]", "model.top_mlp"),
                                         ("model.embedding_dim=4", "model.embedding_dim"),
                                         ("train.optimizer=adagrad", "train.optimizer")])
def test_a_mismatched_config_is_refused_naming_the_key_and_writes_nothing(days, yesterday, tmp_path, change, key):
    from gmeta_tf.train.trainer import train

    run = tmp_path / "warm"
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        train(_cfg(days[1], "train.steps=10", change), run, warm_start=str(yesterday))
    assert not run.exists()


def test_mismatched_data_and_bad_sources_are_one_line_errors(days, yesterday, tmp_path, prepared_kinds):
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli
    from gmeta_tf.train.trainer import train

    with pytest.raises(DataError, match="warm-start from.*label"):  # rating data for a click model
        train(_cfg(prepared_kinds["rating"], "train.steps=10"), tmp_path / "a", warm_start=str(yesterday))
    with pytest.raises(CheckpointError, match="no complete checkpoint for step 7"):
        train(_cfg(days[1], "train.steps=10"), tmp_path / "b", warm_start=f"{yesterday}@7")
    result = CliRunner().invoke(cli, ["train", "--config", "configs/quickstart.yaml", "--data", str(days[1]),
                                      "--out", str(tmp_path / "c"), "--warm-start", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "neither a run directory" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_run_that_trained_from_scratch_does_not_name_a_warm_start(days, yesterday, tmp_path):
    """Case 8: `gmeta train --warm-start A` cut off before its first checkpoint, then re-run
    without --warm-start, trains from scratch: neither train_summary.json nor warm_start.json
    may name A as its origin (a real warm start still names it: the tests above). The cut-off is
    an exception at the first validation (what a kill -9 leaves is the same: the warm start
    recorded, no checkpoint; nothing on the exception's way out touches the run directory)."""
    from gmeta_tf.train.trainer import train

    class Killed(Exception):
        pass

    def die(step, metrics):
        raise Killed(step)

    run = tmp_path / "run"
    with pytest.raises(Killed):
        train(_cfg(days[1], "train.steps=100", "train.checkpoint_every=100"), run, warm_start=str(yesterday),
              on_validation=die)
    assert (run / "warm_start.json").exists() and not list(run.glob("checkpoints/ckpt-*"))

    scratch = train(_cfg(days[1], "train.steps=10"), run)
    assert scratch["start_step"] == 0 and scratch["warm_start"] is None
    assert not (run / "warm_start.json").exists()
    assert json.loads((run / "train_summary.json").read_text())["warm_start"] is None
