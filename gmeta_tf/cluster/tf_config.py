"""``TF_CONFIG`` as the Kubeflow training operator sets it, parsed once with clear errors.

    {"cluster": {"ps": ["h:2222", ...], "worker": ["h:2222", ...]},
     "task": {"type": "ps" | "worker", "index": 0}}
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import List, Optional

from gmeta_tf.errors import ClusterError


@dataclass
class TFConfig:
    ps: List[str]
    workers: List[str]
    task_type: str
    task_index: int

    @property
    def address(self) -> str:
        hosts = self.ps if self.task_type == "ps" else self.workers
        return hosts[self.task_index]


def parse_tf_config(raw: Optional[str]) -> TFConfig:
    if raw is None or not raw.strip():
        raise ClusterError("TF_CONFIG is not set: a TFJob pod gets it from the training operator; "
                           "outside Kubernetes pass --ps/--index or a config's cluster.ps")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({e}): {raw[:200]!r}") from None
    if not isinstance(doc, dict):
        raise ClusterError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    cluster, task = doc.get("cluster"), doc.get("task")
    if not isinstance(cluster, dict):
        raise ClusterError("TF_CONFIG has no 'cluster' object")
    if not isinstance(task, dict):
        raise ClusterError("TF_CONFIG has no 'task' object")

    def hosts(key: str) -> List[str]:
        value = cluster.get(key, [])
        if not isinstance(value, list) or not all(isinstance(h, str) and ":" in h for h in value):
            raise ClusterError(f"TF_CONFIG cluster.{key} must be a list of 'host:port' strings, got {value!r}")
        return value

    ps = hosts("ps")
    workers = hosts("worker") + hosts("chief")
    task_type = str(task.get("type", "")).lower()
    if task_type not in ("ps", "worker", "chief"):
        raise ClusterError(f"TF_CONFIG task.type must be 'ps' or 'worker', got {task.get('type')!r}")
    index = task.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ClusterError(f"TF_CONFIG task.index must be a non-negative integer, got {index!r}")
    task_type = "worker" if task_type == "chief" else task_type
    pool = ps if task_type == "ps" else workers
    if index >= len(pool):
        raise ClusterError(f"TF_CONFIG task.index {index} is out of range: cluster.{task_type} has {len(pool)} entries")
    return TFConfig(ps=ps, workers=workers, task_type=task_type, task_index=index)


def tf_config_from_env() -> Optional[TFConfig]:
    raw = os.environ.get("TF_CONFIG")
    return parse_tf_config(raw) if raw and raw.strip() else None
