"""A server's settings read from where an operator writes them: flags, environment, TOML.

Every option of `ServerSettings` has a flag (`--max-sessions`), an environment variable
(`TTYSERVE_MAX_SESSIONS`) and a key in the `--config` file (`max_sessions`); a flag beats
the environment, which beats the file, which beats the default. Any bad key, type or value
names its source and key.
"""

from __future__ import annotations

import argparse
import os
import tomllib
import typing
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from ..errors import ConfigError, UsageError
from .settings import ServerSettings, options

ENV_PREFIX = "TTYSERVE_"
# What a carrier asks for on its command line, never a host's setting: a TTYSERVE_STDIO or
# a file must not turn a daemon into a stdio server.
FLAG_ONLY = frozenset({"stdio", "persist"})


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def _shown(value: object, metavar: str | None) -> str:
    """A default as people read it: 1 MiB rather than 1048576."""
    if metavar == "BYTES" and isinstance(value, int) and value >= 1024:
        for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def help_text(key: str) -> str:
    """The option's help, with its default taken from ServerSettings (never retyped)."""
    _, meta, default = options()[key]
    assert meta.description is not None
    if default in (None, False, [], msgspec.NODEFAULT):
        return meta.description
    return f"{meta.description} (default {_shown(default, _metavar(meta))})"


def _metavar(meta: msgspec.Meta) -> str | None:
    value = (meta.extra or {}).get("metavar")
    return str(value) if value else None


def _is_list(kind: object) -> bool:
    return typing.get_origin(_bare(kind)) is list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option; absent flags stay absent (so lower sources can apply)."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with any of these keys")
    for key, (kind, meta, _) in options().items():
        common: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS,
                                  "help": help_text(key)}
        if _bare(kind) is bool:
            parser.add_argument(flag(key), action="store_true", **common)
        else:
            parser.add_argument(flag(key), action="append" if _is_list(kind) else "store",
                                metavar=_metavar(meta), **common)


def _bare(kind: object) -> object:
    """``kind`` without its Annotated metadata."""
    return typing.get_args(kind)[0] if typing.get_origin(kind) is Annotated else kind


def _from_environment(environ: Mapping[str, str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for key, (kind, _, _) in options().items():
        text = environ.get(env_name(key))
        if text is None or key in FLAG_ONLY:
            continue
        if _bare(kind) is bool:
            lowered = text.strip().lower()
            if lowered not in ("1", "true", "yes", "0", "false", "no", ""):
                raise ConfigError(f"{env_name(key)}={text!r}: expected true or false")
            values[key] = lowered in ("1", "true", "yes")
        elif _is_list(kind):
            values[key] = [item for item in text.replace(",", " ").split() if item]
        else:
            values[key] = text
    return values


def _from_file(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    known = options()
    for key in data:
        if key in FLAG_ONLY:
            raise ConfigError(f"config file {path}: {key!r} is a command-line flag only")
        if key not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
    return data


def _validate(values: dict[str, object], source: str,
              error: type[ConfigError]) -> dict[str, object]:
    """``values`` converted to their options' types, one key at a time so a failure names it
    as ``source`` spells it (a file's: `config file PATH`)."""
    known = options()
    converted: dict[str, object] = {}
    for key, value in values.items():
        try:
            converted[key] = msgspec.convert(value, known[key][0],
                                             strict=source.startswith("config file"))
        except msgspec.ValidationError as exc:
            name = {"flag": flag(key), "environment": env_name(key)}.get(source, key)
            raise error(f"{source}: {name}: {exc}") from exc
    return converted


def load(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
         ) -> ServerSettings:
    """Merge default < file < environment < flags; raise ConfigError naming the culprit."""
    environ = os.environ if environ is None else environ
    flags = {key: getattr(args, key) for key in options() if hasattr(args, key)}
    config_path = args.config or environ.get(env_name("config"))
    file_values = _from_file(config_path) if config_path else {}
    merged = {
        **_validate(file_values, f"config file {config_path}", ConfigError),
        **_validate(_from_environment(environ), "environment", ConfigError),
        **_validate(flags, "flag", UsageError),
    }
    if flags.get("persist") and not flags.get("stdio"):
        raise UsageError("--persist relays a carrier's stdin and stdout: give --stdio too")
    if flags.get("stdio") and "listen" not in flags:
        merged.pop("listen", None)  # a host's TTYSERVE_LISTEN or file is for its daemon
    return ServerSettings(**merged)  # type: ignore[arg-type]  # each value converted above
