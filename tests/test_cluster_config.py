"""Errors of the cluster settings that need no running process."""
import pytest

from gmeta_tf.cluster.worker import load_placement
from gmeta_tf.errors import ClusterError
from launch.local_cluster import launch_local


def test_placement_file_is_read(tmp_path):
    f = tmp_path / "placement.yaml"
    f.write_text("tables:\n  item_id: [0, 1]\n  hour: {ps: [1]}\n")
    assert load_placement(str(f)) == {"item_id": [0, 1], "hour": [1]}
    assert load_placement(None) is None


@pytest.mark.parametrize("text, words", [
    ("tables: [1, 2]\n", "expected a 'tables' mapping"),
    ("tables:\n  item_id: []\n", "table 'item_id' needs a non-empty list"),
    ("tables:\n  item_id: [zero]\n", "table 'item_id' needs a non-empty list"),
])
def test_bad_placement_names_file_and_table(tmp_path, text, words):
    f = tmp_path / "placement.yaml"
    f.write_text(text)
    with pytest.raises(ClusterError, match=words) as e:
        load_placement(str(f))
    assert str(f) in str(e.value)


def test_missing_placement_file_is_named(tmp_path):
    with pytest.raises(ClusterError, match="nope.yaml"):
        load_placement(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("workers, ps", [(0, 1), (2, -1)])
def test_launch_local_rejects_bad_counts_before_starting_anything(workers, ps):
    with pytest.raises(ClusterError, match="--workers must be >= 1"):
        launch_local(workers, ps, [])
