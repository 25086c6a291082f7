"""Shared fixtures. Data is kept small: the CI machine has 2 cores shared with other jobs."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import task_format as fmt


@pytest.hookimpl(trylast=True)  # after tests/faults/conftest.py marks its modules
def pytest_collection_modifyitems(items):
    """Files with the most real-process (``integration``) tests run first.

    ``make test`` hands whole files to its two xdist workers in collection order
    (``--dist loadfile``), and alphabetical order put long cluster files (test_tfjob_emulation,
    test_wire_distributed) last: one worker ran them while the other sat idle. The count of
    integration tests is the cost proxy that needs no timing file (a clean clone has none);
    the order inside a file is kept (a stable sort)."""
    weight = Counter(str(item.path) for item in items if item.get_closest_marker("integration"))
    items.sort(key=lambda item: -weight[str(item.path)])


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    """~14k rows / 200 users of synthetic click data (with its columns.json sidecar)."""
    from gmeta_tf.data.synth import synth

    out = tmp_path_factory.mktemp("synth") / "raw"
    synth(str(out), tasks=200, seed=1, rows_per_file=5000)
    return out


@pytest.fixture
def small_cfg() -> PrepareConfig:
    """Task construction sized for the 200-user synthetic set."""
    return PrepareConfig(query=4, max_support=8, min_task_size=30, max_task_size=150,
                         valid_frac=0.15, test_frac=0.25, shards=3, rows_per_group=7, seed=5)


def read_inputs_table(path: Path) -> pa.Table:
    """All input rows in global row order (files of a directory sorted by name)."""
    files = sorted(p for p in Path(path).iterdir() if p.suffix == ".parquet")
    return pa.concat_tables([pq.read_table(f) for f in files])


def read_split(out: Path, split: str) -> pa.Table:
    files = sorted((Path(out) / split).glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


# ------------------------------------------------------------------ tiny CSV data sets

CSV_HEADER = ["uid", "y", "when", "city", "item", "tags", "x1", "x2"]


def csv_rows(n_users: int = 12, per_user: int = 12, seed: int = 0) -> List[Dict[str, str]]:
    """Rows as strings (so tests can corrupt single cells), users interleaved, times shuffled."""
    rng = np.random.default_rng(seed)
    rows = []
    times = 1000 + rng.permutation(n_users * per_user) * 10  # distinct, unordered
    for i in range(n_users * per_user):
        u = i % n_users
        rows.append({
            "uid": f"u{u}",
            "y": str(int(rng.random() < 0.4)),
            "when": str(int(times[i])),
            "city": f"c{u % 5}",
            "item": str(int(rng.integers(0, 50))),
            "tags": "|".join(str(int(t)) for t in rng.integers(0, 20, rng.integers(1, 4))),
            "x1": f"{rng.normal():.4f}",
            "x2": str(int(rng.integers(0, 100))),
        })
    return rows


def write_csv(path: Path, rows: List[Dict[str, str]], header=CSV_HEADER) -> Path:
    lines = [",".join(header)] + [",".join(r.get(h, "") for h in header) for r in rows]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


@pytest.fixture
def csv_cfg() -> PrepareConfig:
    """Explicit mapping for ``csv_rows`` data (12 users × 12 samples)."""
    return PrepareConfig(
        task_col="uid", label_col="y", label_kind="click", categorical=["city", "item"],
        multi_hot=["tags"], dense=["x1", "x2"], time_col="when",
        query=2, max_support=8, min_task_size=3, valid_frac=0.25, test_frac=0.25, shards=1,
    )


@pytest.fixture
def hash_of():
    return lambda s: int(fmt.hash_strings([s])[0])


# Helpers are handed out as fixtures so test modules never import conftest (which breaks
# depending on pytest's import mode and whether tests/ is a package).
@pytest.fixture
def read_table():
    return read_inputs_table


@pytest.fixture
def split_table():
    return read_split


@pytest.fixture
def csv_data():
    class _CSV:
        header = CSV_HEADER
        rows = staticmethod(csv_rows)
        write = staticmethod(write_csv)

    return _CSV


@pytest.fixture(scope="session")
def prepared_2500(tmp_path_factory) -> Path:
    """2,500 synthetic users prepared with the quickstart config: the training tests' data."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    root = tmp_path_factory.mktemp("prepared2500")
    synth(str(root / "raw"), tasks=2500, seed=0)
    prepare([str(root / "raw")], str(root / "prepared"), load_config("configs/quickstart.yaml").prepare)
    return root / "prepared"


@pytest.fixture(scope="session")
def id_profile_2500(prepared_2500, tmp_path_factory) -> Path:
    """The id profile of ``prepared_2500`` (every sample), in a directory next to, not inside, the
    shared data: what the hot split's tests read (``hot.profile``)."""
    from gmeta_tf.data.id_profile import profile_ids, write_profile

    out = tmp_path_factory.mktemp("hot_profile")
    write_profile(out, profile_ids(prepared_2500), {"sample": 1.0})
    return out


@pytest.fixture(scope="session")
def hot_profile(id_profile_2500) -> Path:
    """``id_profile_2500``'s profile file (``hot.profile``)."""
    return id_profile_2500 / "id_profile.npz"


@pytest.fixture(scope="session")
def prepared_kinds(tmp_path_factory):
    """Small prepared data sets of both label kinds (synthetic, 150 users each): ``{kind: dir}``."""
    from gmeta_tf.config.schema import PrepareConfig
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    out = {}
    for kind in ("click", "rating"):
        root = tmp_path_factory.mktemp(f"prep-{kind}")
        synth(str(root / "raw"), tasks=150, seed=3, kind=kind)
        prepare([str(root / "raw")], str(root / "prepared"),
                PrepareConfig(query=6, max_support=12, min_task_size=10, test_frac=0.3, valid_frac=0.1, shards=2))
        out[kind] = root / "prepared"
    return out


@pytest.fixture(scope="session")
def prepared_rating_te(tmp_path_factory) -> Path:
    """``prepared_kinds``'s rating data, prepared with target encoding of ``item_id`` as well."""
    from gmeta_tf.config.schema import PrepareConfig
    from gmeta_tf.data.prepare import prepare
    from gmeta_tf.data.synth import synth

    root = tmp_path_factory.mktemp("prep-rating-te")
    synth(str(root / "raw"), tasks=150, seed=3, kind="rating")
    prepare([str(root / "raw")], str(root / "prepared"),
            PrepareConfig(query=6, max_support=12, min_task_size=10, test_frac=0.3, valid_frac=0.1, shards=2,
                          target_encoding=["item_id"], target_encoding_prior=3.0))
    return root / "prepared"


@pytest.fixture(scope="session")
def exported_model(request, prepared_kinds, tmp_path_factory):
    """``exported_model(name)``: run ``name`` of ``serve_fixture.RUNS`` trained and exported once
    per session (the xdist workers share it), as (run dir, export dir, export.json)."""
    import json

    from serve_fixture import RUNS, train_and_export
    from session_share import once_per_session

    from gmeta_tf import export_format

    done = {}

    def get(name: str):
        if name not in done:
            kind = RUNS[name][0]
            data = request.getfixturevalue("prepared_rating_te") if kind == "rating_te" else prepared_kinds[kind]
            # once per session, shared by the xdist workers (test_export, test_serve_http, ...)
            root = once_per_session(tmp_path_factory, f"run-{name}", lambda out: train_and_export(data, out, name))
            manifest = json.loads((root / "export" / export_format.PATH).read_text())
            done[name] = (root / "run", root / "export", manifest)
        return done[name]

    return get


# The 2-worker + 2-PS quickstart run several integration files compare against (test_distributed,
# test_tfjob_emulation): `gmeta launch local` with cluster_helpers' LAUNCH_LOCAL_* settings.
@pytest.fixture(scope="session")
def launch_local_2w2ps(prepared_2500, tmp_path_factory):
    """``(run dir, launcher stdout, launch id)`` of an uninterrupted ``gmeta launch local --workers
    2 --ps 2`` of the quickstart config for ``LAUNCH_LOCAL_STEPS`` with ``LAUNCH_LOCAL_SETS``."""
    import json
    import uuid

    from cluster_helpers import LAUNCH_ID_ENV, LAUNCH_LOCAL_SETS, LAUNCH_LOCAL_STEPS, run_gmeta
    from session_share import once_per_session

    def make(root: Path):
        launch_id = uuid.uuid4().hex
        args = ["launch", "local", "--workers", "2", "--ps", "2", "--timeout", "500", "--config",
                "configs/quickstart.yaml", "--data", str(prepared_2500), "--out", str(root / "run"),
                "--steps", str(LAUNCH_LOCAL_STEPS)]
        for s in LAUNCH_LOCAL_SETS:
            args += ["--set", s]
        r = run_gmeta(args, timeout=600, env={LAUNCH_ID_ENV: launch_id})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        (root / "launch.json").write_text(json.dumps({"stdout": r.stdout, "launch_id": launch_id}))

    root = once_per_session(tmp_path_factory, "launch_local_2w2ps", make)
    done = json.loads((root / "launch.json").read_text())
    return root / "run", done["stdout"], done["launch_id"]


@pytest.fixture(scope="session")
def launch_local_2w2ps_auc(launch_local_2w2ps, tmp_path_factory) -> float:
    """The test-task AUC of ``launch_local_2w2ps``'s model (``evaluate``, once a session): the
    number the tests that train the same settings another way compare theirs with."""
    import json

    from session_share import once_per_session

    from gmeta_tf.evaluation.evaluate import evaluate
    from gmeta_tf.train.trained_run import load_trained

    def make(root: Path):
        cfg, model, _ = load_trained(launch_local_2w2ps[0])
        root.mkdir(parents=True, exist_ok=True)
        (root / "auc.json").write_text(json.dumps(evaluate(model, cfg, cfg.meta.algo)["auc"]))

    return json.loads((once_per_session(tmp_path_factory, "launch_local_2w2ps_auc", make) / "auc.json").read_text())
