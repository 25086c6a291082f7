"""YAML + ``--set a.b=c`` overrides → a validated ``Config``.

dacite does the dict → dataclass conversion in strict mode, so an unknown key or a value of
the wrong type is rejected with its dotted path; we only re-word its errors into one
``ConfigError`` format that names the key (and the file, when there is one).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import dacite
import yaml

from gmeta_tf.config.schema import Config, ConfigError


def _int_to_float(value: Any) -> Any:
    # YAML writes 1 for 1.0; accept ints where floats are expected, but never bools.
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


_DACITE = dacite.Config(strict=True, type_hooks={float: _int_to_float})


class _Loader(yaml.SafeLoader):
    """PyYAML resolves floats by YAML 1.1, where ``1e-4`` and ``3e-3`` (no dot) are strings;
    a user writing a learning rate means a float, as YAML 1.2 reads it."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.steps=100"`` → (["train", "steps"], 100). The value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.steps=100")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: empty key segment")
    try:
        value = _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({e})") from None
    return key.split("."), value


def apply_overrides(raw: dict, overrides: Iterable[str]) -> dict:
    out = copy.deepcopy(raw)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for i, part in enumerate(path[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {'.'.join(path)}: '{'.'.join(path[: i + 1])}' is not a section")
            node = nxt
        node[path[-1]] = value
    return out


def config_from_dict(raw: Mapping[str, Any], source: Optional[str] = None) -> Config:
    where = f" (in {source})" if source else ""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config{where}: top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        _reject_unknown_keys(Config, raw)
        cfg = dacite.from_dict(Config, dict(raw), config=_DACITE)
        _reject_bools_for_numbers(cfg)
        return cfg
    except dacite.UnexpectedDataError as e:
        keys = ", ".join(sorted(e.keys))
        raise ConfigError(f"unknown config key(s) {keys}{where}") from None
    except dacite.WrongTypeError as e:
        raise ConfigError(
            f"config key '{e.field_path}'{where}: expected {_type_name(e.field_type)}, got {e.value!r}"
        ) from None
    except dacite.MissingValueError as e:
        raise ConfigError(f"config key '{e.field_path}'{where}: missing value") from None
    except dacite.DaciteError as e:
        raise ConfigError(f"config{where}: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None


def _reject_unknown_keys(cls: type, raw: Mapping[str, Any], path: str = "") -> None:
    """Name an unknown key with its section and the keys that section has (dacite names
    neither), so ``model.embeding_dim`` reads as a typo in ``model``, not a mystery."""
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        if key not in hints:
            where = f"section '{path[:-1]}'" if path else "the top level"
            raise ConfigError(f"unknown config key '{path}{key}' ({where} has: {', '.join(hints)})")
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, Mapping):
            _reject_unknown_keys(hints[key], value, f"{path}{key}.")


def _reject_bools_for_numbers(obj: Any, path: str = "") -> None:
    """dacite accepts ``true`` for an int field (bool is an int subclass); a config must not.
    An infinite or NaN float passes every ``> 0`` check in the schema and fails only at the
    first step (or deep in scikit-learn at evaluation), so it is refused here by key."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            _reject_bools_for_numbers(value, key + ".")
        elif isinstance(value, bool) and hints[f.name] in (int, float):
            raise ConfigError(f"config key '{key}': expected {hints[f.name].__name__}, got {value!r}")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"config key '{key}': must be a finite number, got {value!r}")


def _type_name(t: Any) -> str:
    """``one of adam, adagrad`` for an enum (a ``Literal``, optional or not); else the type."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    if typing.get_origin(t) is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:
        return _type_name(args[0]) + " (or null)"
    return getattr(t, "__name__", None) or str(t).replace("typing.", "")


def load_config(path: Optional[str | Path] = None, overrides: Iterable[str] = ()) -> Config:
    """Load ``path`` (or the defaults when None), then apply ``--set`` overrides."""
    raw: dict = {}
    source = None
    if path is not None:
        source = str(path)
        text = _read_config_text(source)
        try:
            raw = _yaml(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {source} is not valid YAML: {e}") from None
    overrides = list(overrides)
    merged = apply_overrides(raw, overrides)
    return config_from_dict(merged, source + (" + --set" if overrides else "") if source else None)


def _read_config_text(source: str) -> str:
    """A local file, or (for a run directory in a bucket) any URI ``gmeta_tf.storage`` reaches."""
    if "://" in source:
        from gmeta_tf import storage

        if not storage.exists(source):
            raise ConfigError(f"config file {source} does not exist")
        return storage.read_text(source)
    p = Path(source)
    if not p.is_file():
        raise ConfigError(f"config file {source} does not exist")
    return p.read_text()


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_text(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def dump_config(cfg: Config, path: str | Path) -> None:
    from gmeta_tf import storage

    storage.write_text(str(path), config_text(cfg))
