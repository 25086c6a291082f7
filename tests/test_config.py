import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError


def test_quickstart_loads_and_overrides_apply():
    cfg = load_config("configs/quickstart.yaml", ["train.steps=7", "model.top_mlp=[8, 4]", "meta.inner_lr=1"])
    assert cfg.train.steps == 7 and cfg.model.top_mlp == [8, 4]
    assert cfg.meta.inner_lr == 1.0 and isinstance(cfg.meta.inner_lr, float)
    assert cfg.data.tasks_per_batch == 32


@pytest.mark.parametrize("sets, message", [
    (["train.stepz=3"], "stepz"),
    (["nosuch.key=1"], "nosuch"),
    (["train.steps=abc"], "train.steps"),
    (["meta.algo=reptile"], "meta.algo"),
    (["meta.inner_steps=0"], "meta.inner_steps"),
    (["data.tasks_per_batch=true"], "data.tasks_per_batch"),
    (["cluster.ps=[localhost]"], "cluster.ps[0]"),
    (["train.steps"], "KEY=VALUE"),
])
def test_bad_keys_and_values_name_the_key(sets, message):
    with pytest.raises(ConfigError, match=r".*" + message.replace("[", r"\[").replace("]", r"\]")):
        load_config("configs/quickstart.yaml", sets)


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  embeding_dim: 8\n")
    with pytest.raises(ConfigError, match=r"embeding_dim.*c\.yaml"):
        load_config(f)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(f)


def test_deprecated_settle_pause_still_loads_but_warns_and_is_unset_by_default():
    """Start-up no longer pauses per rank (docs/startup.md); old configs must still load."""
    assert load_config("configs/quickstart.yaml").cluster.table_create_settle_s is None
    with pytest.warns(FutureWarning, match="cluster.table_create_settle_s"):
        cfg = load_config("configs/quickstart.yaml", ["cluster.table_create_settle_s=3"])
    assert cfg.cluster.table_create_settle_s == 3
