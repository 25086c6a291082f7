"""Options and error handling shared by every ``gmeta`` sub-command.

Every command that takes a config accepts ``--config`` and repeatable ``--set a.b=c`` and
builds its ``Config`` through ``load_config`` alone: there is no second argument parser.
Expected failures (bad config, bad data, unreachable PS) are ``UserError`` subclasses and are
printed as one clear line with exit code 2 instead of a stack trace.
"""
from __future__ import annotations

import functools
import os
import sys

import click

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import Config, ConfigError
from gmeta_tf.errors import Preempted, UserError


def config_options(f):
    f = click.option(
        "--set", "overrides", multiple=True, metavar="KEY=VALUE",
        help="Override a config key, e.g. --set train.steps=100 (repeatable).",
    )(f)
    f = click.option(
        "--config", "config_path", type=click.Path(dir_okay=False), default=None,
        help="YAML config (see configs/quickstart.yaml). Defaults apply when omitted.",
    )(f)
    return f


def build_config(config_path, overrides, extra: dict | None = None) -> Config:
    """Load the config, then apply command-line shortcuts (``--steps`` …) as ``--set`` items."""
    sets = list(overrides)
    for key, value in (extra or {}).items():
        if value is not None:
            sets.append(f"{key}={value}")
    return load_config(config_path, sets)


def friendly_errors(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except (UserError, ConfigError) as e:
            click.echo(f"error: {e}", err=True)
            if isinstance(e, Preempted):
                # Everything is saved; Horovod's exit-time shutdown would wait for peers that have
                # already gone, holding the pod until the grace period's SIGKILL.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(e.exit_code)
            sys.exit(getattr(e, "exit_code", 2))
    return wrapper


def write_output(text: str, out_file: str | None) -> bool:
    """``text`` to ``out_file``, or to stdout when it is None; True when a file was written."""
    if out_file is None:
        click.echo(text, nl=False)
        return False
    try:
        with open(out_file, "w") as fh:
            fh.write(text)
    except OSError as e:
        raise UserError(f"cannot write {out_file}: {e.strerror}") from None
    return True
