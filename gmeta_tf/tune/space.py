"""The search space of ``gmeta tune``: a small YAML file, checked as strictly as a config.

Each entry names a dotted config key and either a range (``low``/``high``, optional ``log``,
``step`` and ``type: int``) or a list of ``choices``. A key is accepted only if the real config
loader accepts a sampled value for it (``validate_against_config``), so a typo or a value the
schema rejects fails before any trial trains, with the key and the file named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import yaml

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import METRIC_DIRECTIONS as SCHEMA_DIRECTIONS
from gmeta_tf.config.schema import Config, ConfigError, metric_direction
from gmeta_tf.errors import UserError

# Optuna's direction for each metric that can pick a best step (one table: config.schema).
METRIC_DIRECTIONS = {m: ("minimize" if d < 0 else "maximize") for m, d in SCHEMA_DIRECTIONS.items()}


def optuna_direction(metric: str) -> Optional[str]:
    """``minimize`` / ``maximize`` for any metric key with a known direction (``_finetune`` and
    ``_no_adapt`` variants too, as ``train.best_metric`` accepts them); None otherwise."""
    d = metric_direction(metric)
    return None if d is None else ("minimize" if d < 0 else "maximize")


class SpaceError(UserError):
    """A search-space file is malformed, or names a key or value the config does not accept."""


@dataclass(frozen=True)
class RangeParam:
    key: str
    low: float
    high: float
    log: bool = False
    is_int: bool = False
    step: Optional[float] = None

    def value(self, stored: Any) -> Any:
        return stored

    def suggest(self, trial) -> Any:
        if self.is_int:
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, step=self.step, log=self.log)

    def samples(self) -> List[Any]:
        """Values the config must accept: both ends (a range the schema half-rejects is an error)."""
        if self.is_int:
            return [int(self.low), int(self.high)]
        return [float(self.low), float(self.high)]


@dataclass(frozen=True)
class ChoiceParam:
    key: str
    choices: tuple

    @property
    def _as_text(self) -> bool:
        # Optuna stores only scalars as categorical choices; lists (layer sizes) go as YAML text.
        return any(isinstance(c, (list, dict)) for c in self.choices)

    def suggest(self, trial) -> Any:
        if self._as_text:
            return self.value(trial.suggest_categorical(self.key, [yaml_text(c) for c in self.choices]))
        return trial.suggest_categorical(self.key, list(self.choices))

    def value(self, stored: Any) -> Any:
        """The config value of a parameter as Optuna stored it."""
        return yaml.safe_load(stored) if self._as_text else stored

    def samples(self) -> List[Any]:
        return list(self.choices)


Param = Union[RangeParam, ChoiceParam]


@dataclass(frozen=True)
class SearchSpace:
    params: tuple  # of Param, in file order
    metric: Optional[str] = None  # None: the config's train.best_metric
    source: str = "<space>"

    def sample(self, trial) -> Dict[str, Any]:
        return {p.key: p.suggest(trial) for p in self.params}

    def values(self, stored: Mapping[str, Any]) -> Dict[str, Any]:
        """A finished trial's ``params`` as config values."""
        return {p.key: p.value(stored[p.key]) for p in self.params}

    def to_dict(self) -> dict:
        """A canonical form, stored with the study so a resumed study must use the same space."""
        out = {}
        for p in self.params:
            if isinstance(p, ChoiceParam):
                out[p.key] = {"choices": [yaml_text(c) for c in p.choices]}
            else:
                out[p.key] = {"low": p.low, "high": p.high, "log": p.log, "int": p.is_int, "step": p.step}
        return {"metric": self.metric, "space": out}


def yaml_text(value: Any) -> str:
    """``value`` as YAML text that parses back to the same value (``1e-05`` alone parses as a
    string in YAML 1.1; ``safe_dump`` writes ``1.0e-05``)."""
    text = yaml.safe_dump(value, default_flow_style=True)
    if text.endswith("\n...\n"):
        text = text[: -len("\n...\n")]
    return text.strip()


_RANGE_FIELDS = {"low", "high", "log", "type", "step"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_param(key: str, entry: Any, where: str) -> Param:
    at = f"{where}: space key '{key}'"
    if not isinstance(entry, Mapping):
        raise SpaceError(f"{at}: expected a mapping such as {{low: 0.01, high: 1.0, log: true}} "
                         f"or {{choices: [a, b]}}, got {entry!r}")
    fields = set(entry)
    if "choices" in fields:
        if fields != {"choices"}:
            raise SpaceError(f"{at}: 'choices' cannot be combined with {', '.join(sorted(fields - {'choices'}))}")
        choices = entry["choices"]
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{at}: choices must be a non-empty list, got {choices!r}")
        if len({yaml_text(c) for c in choices}) != len(choices):
            raise SpaceError(f"{at}: choices repeat a value: {choices!r}")
        return ChoiceParam(key, tuple(choices))
    unknown = fields - _RANGE_FIELDS
    if unknown:
        raise SpaceError(f"{at}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                         f"(a range takes low, high, log, step, type; or give choices)")
    for name in ("low", "high"):
        if name not in entry:
            raise SpaceError(f"{at}: missing '{name}' (or give choices)")
        if not _number(entry[name]):
            raise SpaceError(f"{at}: {name} must be a number, got {entry[name]!r}")
    low, high = entry["low"], entry["high"]
    kind = entry.get("type", "float")
    if kind not in ("float", "int"):
        raise SpaceError(f"{at}: type must be float or int, got {kind!r}")
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{at}: log must be true or false, got {log!r}")
    step = entry.get("step")
    if step is not None and (not _number(step) or step <= 0):
        raise SpaceError(f"{at}: step must be a number > 0, got {step!r}")
    if not low < high:
        raise SpaceError(f"{at}: bad range: low ({low}) must be < high ({high})")
    if log and low <= 0:
        raise SpaceError(f"{at}: bad range: a log range needs low > 0, got low {low}")
    if log and step is not None:
        raise SpaceError(f"{at}: step cannot be combined with log: true")
    if kind == "int":
        for name, v in (("low", low), ("high", high), ("step", step)):
            if v is not None and float(v) != int(v):
                raise SpaceError(f"{at}: type int needs a whole {name}, got {v!r}")
    return RangeParam(key, float(low), float(high), log=log, is_int=kind == "int",
                      step=float(step) if step is not None else None)


def parse_space(raw: Any, source: str = "<space>") -> SearchSpace:
    where = f"search space {source}"
    if not isinstance(raw, Mapping):
        raise SpaceError(f"{where}: top level must be a mapping with 'space' (and optional 'metric')")
    unknown = set(raw) - {"space", "metric"}
    if unknown:
        raise SpaceError(f"{where}: unknown top-level key(s) {', '.join(sorted(map(str, unknown)))} "
                         f"(expected space, metric)")
    metric = raw.get("metric", "auto")
    if metric != "auto" and optuna_direction(metric) is None:
        raise SpaceError(f"{where}: metric must be auto or one of {', '.join(METRIC_DIRECTIONS)}, got {metric!r}")
    space = raw.get("space")
    if not isinstance(space, Mapping) or not space:
        raise SpaceError(f"{where}: 'space' must be a non-empty mapping of config key -> range or choices")
    params = []
    for key, entry in space.items():
        if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
            raise SpaceError(f"{where}: space key {key!r} is not a dotted config key such as meta.inner_lr")
        params.append(parse_param(key, entry, where))
    return SearchSpace(tuple(params), None if metric == "auto" else metric, source)


def load_space(path: str | Path) -> SearchSpace:
    p = Path(path)
    if not p.is_file():
        raise SpaceError(f"search space {path} does not exist")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise SpaceError(f"search space {path} is not valid YAML: {e}") from None
    return parse_space(raw, str(path))


# (config overrides {dotted key: value}) -> Config, through the real loader
BuildConfig = Callable[[Dict[str, Any]], Config]


def config_builder(config_path: Optional[str], sets: Sequence[str]) -> BuildConfig:
    """``--config`` and ``--set`` items, then a trial's values as more ``--set`` items: the path
    every command's config takes (``cli.common.build_config``), so the same checks apply."""
    sets = list(sets)
    return lambda extra: load_config(config_path, sets + [f"{k}={yaml_text(v)}" for k, v in extra.items()])


def validate_against_config(space: SearchSpace, build: BuildConfig) -> None:
    """Apply every key's sample values through ``build`` (the real loader): an unknown key or
    a value the schema rejects is a ``SpaceError`` naming the key and file."""
    for p in space.params:
        for value in p.samples():
            try:
                build({p.key: value})
            except ConfigError as e:
                raise SpaceError(f"search space {space.source}: space key '{p.key}' value {value!r} "
                                 f"is not accepted by the config: {e}") from None
