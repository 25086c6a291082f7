"""Run directories on other filesystems: each failure is one line naming the path and the fix."""
import uuid

import numpy as np
import pytest
from click.testing import CliRunner

from gmeta_tf import storage
from gmeta_tf.cli.main import cli
from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError
from gmeta_tf.embedding.table_files import load_resplit
from gmeta_tf.errors import CheckpointError


def test_a_scheme_without_its_filesystem_names_the_path_and_the_fix():
    # tensorflow-io (the optional `s3` extra) is not installed in the test environment.
    with pytest.raises(CheckpointError, match=r"s3://bucket/run: .*no s3:// filesystem.*gmeta-tf\[s3\]"):
        storage.exists("s3://bucket/run")
    with pytest.raises(CheckpointError, match=r"foo://x/run: no filesystem for foo://.*gs://"):
        storage.makedirs("foo://x/run")


def test_cli_with_an_unreachable_run_uri_is_one_line():
    r = CliRunner().invoke(cli, ["eval", "--run", "s3://bucket/run"])
    assert r.exit_code == 2 and "s3://bucket/run" in r.output and "gmeta-tf[s3]" in r.output
    assert "Traceback" not in r.output


def test_missing_objects_are_named():
    base = f"ram://missing-{uuid.uuid4().hex}"
    with pytest.raises(CheckpointError, match=f"{base}/x.json: cannot read"):
        storage.read_text(f"{base}/x.json")
    with pytest.raises(ConfigError, match=f"config file {base}/config.yaml does not exist"):
        load_config(f"{base}/config.yaml")


def test_column_blocks_with_different_ids_cannot_be_joined():
    tables = f"ram://blocks-{uuid.uuid4().hex}/tables"
    storage.makedirs(tables)
    storage.write_bytes(f"{tables}/item.c0of2.npz", storage.npz_bytes(keys=np.array([1, 2]), values=np.ones((2, 2))))
    storage.write_bytes(f"{tables}/item.c1of2.npz", storage.npz_bytes(keys=np.array([1, 3]), values=np.ones((2, 2))))
    with pytest.raises(CheckpointError, match=r"item\.c1of2\.npz: its ids differ from item\.c0of2\.npz's"):
        load_resplit(tables, "item", ["item"])


def test_replace_file_writes_whole_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    import os

    from gmeta_tf.atomic_file import replace_file

    f = tmp_path / "placement.yaml"
    replace_file(f, "one\n")
    replace_file(f, b"two\n")
    assert f.read_text() == "two\n"

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        replace_file(f, "three\n")
    assert f.read_text() == "two\n" and sorted(p.name for p in tmp_path.iterdir()) == ["placement.yaml"]
