"""The server's settings: one table of options, read from flags, environment and TOML.

Every option has a flag (`--max-sessions`), an environment variable
(`TTYSERVE_MAX_SESSIONS`) and a key in the `--config` file (`max_sessions`);
a flag beats the environment, which beats the file, which beats the default.
Any bad key, type or value names its source and key.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from ..backends.kinds import BackendKind
from ..defaults import (
    DEFAULT_DETACHED_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_LINGER,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CONNECTION,
    DEFAULT_SCROLLBACK,
    DEFAULT_SHUTDOWN_TIMEOUT,
)
from ..errors import ConfigError, UsageError
from ..protocol.frames import DEFAULT_MAX_FRAME
from ..protocol.messages import ChannelCredit
from ..protocol.server import DEFAULT_STDIN_WINDOW
from .policy import DEFAULT_MAX_ARGV_BYTES, DEFAULT_MAX_CWD_BYTES, DEFAULT_MAX_ENV_BYTES

ENV_PREFIX = "TTYSERVE_"
Positive = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(ge=0)]


class ServeConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Everything `ttyserve serve` can be told. Defaults are the secure ones."""

    listen: list[str] = []
    stdio: bool = False
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False
    allow_uid: list[int] = []
    command: str | None = None
    allow_command: list[str] = []
    allow_env: list[str] = []
    allow_origin: list[str] = []
    max_connections: Positive = DEFAULT_MAX_CONNECTIONS
    max_sessions: Positive = DEFAULT_MAX_SESSIONS
    max_sessions_per_connection: Positive = DEFAULT_MAX_SESSIONS_PER_CONNECTION
    handshake_timeout: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_HANDSHAKE_TIMEOUT
    max_frame: Annotated[int, msgspec.Meta(ge=4096, le=16 << 20)] = DEFAULT_MAX_FRAME
    stdin_window: ChannelCredit = DEFAULT_STDIN_WINDOW
    max_argv_bytes: Positive = DEFAULT_MAX_ARGV_BYTES
    max_env_bytes: Positive = DEFAULT_MAX_ENV_BYTES
    max_cwd_bytes: Positive = DEFAULT_MAX_CWD_BYTES
    linger: Seconds = DEFAULT_LINGER
    shutdown_timeout: Seconds = DEFAULT_SHUTDOWN_TIMEOUT
    journal: str | None = None
    spawn: BackendKind = "auto"
    scrollback: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_SCROLLBACK
    detached_timeout: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_DETACHED_TIMEOUT
    record: str | None = None
    record_input: bool = False


@dataclass(frozen=True)
class Option:
    key: str
    help: str
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()


OPTIONS: tuple[Option, ...] = (
    Option("listen", "unix:PATH, tcp:HOST:PORT, tls:HOST:PORT, or ws:HOST:PORT and "
           "wss:HOST:PORT for browsers (repeatable)", "ADDR"),
    Option("stdio", "serve one connection on stdin and stdout, then exit (what a carrier "
           "starts: ssh HOST ttyserve serve --stdio); no token, no listener"),
    Option("token_file", "file (mode 600) holding the token TCP and TLS clients must send "
           "(or the token itself in TTYSERVE_TOKEN)", "FILE"),
    Option("tls_cert", "certificate chain (PEM) for tls: listeners", "FILE"),
    Option("tls_key", "private key (PEM) for tls: listeners", "FILE"),
    Option("insecure", "allow TCP without a token, and non-loopback TCP without TLS"),
    Option("allow_uid", "another uid allowed on Unix sockets (repeatable)", "UID"),
    Option("command", "default command when a client sends no argv (default: login shell)",
           "CMD"),
    Option("allow_command", "glob a client's argv[0] must match (repeatable)", "PATTERN"),
    Option("allow_env", "glob of env names clients may set when commands are restricted "
           "(repeatable)", "PATTERN"),
    Option("allow_origin", "another origin (scheme://host[:port]) whose pages may open the "
           "WebSocket of ws: and wss: listeners (repeatable)", "ORIGIN"),
    Option("max_connections", "open connections at once", "N"),
    Option("max_sessions", "sessions at once, all connections", "N"),
    Option("max_sessions_per_connection", "sessions at once on one connection",
           "N"),
    Option("handshake_timeout", "seconds a client has for hello and open", "S"),
    Option("max_frame", "largest frame payload accepted, bytes", "BYTES"),
    Option("stdin_window", "STDIN credit per session on windowed connections, bytes", "BYTES"),
    Option("max_argv_bytes", "largest argv of an open, bytes", "BYTES"),
    Option("max_env_bytes", "largest env of an open, bytes", "BYTES"),
    Option("max_cwd_bytes", "longest cwd of an open, bytes", "BYTES"),
    Option("linger", "output drain grace after a process exits, seconds", "S"),
    Option("shutdown_timeout", "graceful shutdown watchdog, seconds", "S"),
    Option("journal", "append session records to this file (fsync'd JSON lines)", "FILE"),
    Option("scrollback", "output a detachable session keeps for the next attach, bytes",
           "BYTES"),
    Option("detached_timeout", "seconds a detached session waits for an attach before it is "
           "hung up (and an ended one's exit is dropped)", "S"),
    Option("record", "write every PTY session to DIR/ID.cast (asciicast v3)", "DIR"),
    Option("record_input", "record what is typed too (it holds passwords)"),
    Option("spawn", "how processes start: posix_spawn (the fast path, glibc 2.29+ on Linux), "
           "portable (ptyprocess and subprocess, any POSIX system) or auto",
           "KIND"),
)


# what a carrier asks for on its command line, never a host's setting: a TTYSERVE_STDIO or
# a file must not turn a daemon into a stdio server
FLAG_ONLY = frozenset({"stdio"})


def _field_types() -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(ServeConfig)}


def _shown(value: object, metavar: str | None) -> str:
    """A default as people read it: 1 MiB rather than 1048576."""
    if metavar == "BYTES" and isinstance(value, int) and value >= 1024:
        for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"{value // size} {unit}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def help_text(option: Option) -> str:
    """The option's help, with its default taken from ServeConfig (never retyped)."""
    default = next(f.default for f in msgspec.structs.fields(ServeConfig) if f.name == option.key)
    if default in (None, False, [], msgspec.NODEFAULT):
        return option.help
    return f"{option.help} (default {_shown(default, option.metavar)})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option; absent flags stay absent (so lower sources can apply)."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with any of these keys")
    types = _field_types()
    for option in OPTIONS:
        kind = types[option.key]
        if kind is bool:
            parser.add_argument(option.flag, dest=option.key, action="store_true",
                                default=argparse.SUPPRESS, help=help_text(option))
        elif str(kind).startswith("list"):
            parser.add_argument(option.flag, dest=option.key, action="append",
                                default=argparse.SUPPRESS, metavar=option.metavar,
                                help=help_text(option))
        else:
            parser.add_argument(option.flag, dest=option.key, default=argparse.SUPPRESS,
                                metavar=option.metavar, help=help_text(option))


def _from_environment(environ: Mapping[str, str]) -> dict[str, object]:
    types = _field_types()
    values: dict[str, object] = {}
    for option in OPTIONS:
        text = environ.get(option.env)
        if text is None or option.key in FLAG_ONLY:
            continue
        kind = str(types[option.key])
        if types[option.key] is bool:
            lowered = text.strip().lower()
            if lowered not in ("1", "true", "yes", "0", "false", "no", ""):
                raise ConfigError(f"{option.env}={text!r}: expected true or false")
            values[option.key] = lowered in ("1", "true", "yes")
        elif kind.startswith("list"):
            values[option.key] = [item for item in text.replace(",", " ").split() if item]
        else:
            values[option.key] = text
    return values


def _from_file(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    known = {option.key for option in OPTIONS}
    for key in data:
        if key in FLAG_ONLY:
            raise ConfigError(f"config file {path}: {key!r} is a command-line flag only")
        if key not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
    return data


def _validate(values: dict[str, object], source: str,
              error: type[ConfigError]) -> dict[str, object]:
    """``values`` converted to their options' types, one key at a time so a failure names it."""
    types = _field_types()
    converted: dict[str, object] = {}
    for key, value in values.items():
        try:
            converted[key] = msgspec.convert(value, types[key], strict=source == "file")
        except msgspec.ValidationError as exc:
            raise error(f"{source}: {_name(key, source)}: {exc}") from exc
    return converted


def _name(key: str, source: str) -> str:
    """How ``source`` spells ``key``: `--max-sessions`, `TTYSERVE_MAX_SESSIONS` or the key."""
    option = next(o for o in OPTIONS if o.key == key)
    return {"flag": option.flag, "environment": option.env}.get(source, key)


def load(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeConfig:
    """Merge default < file < environment < flags; raise ConfigError naming the culprit."""
    environ = os.environ if environ is None else environ
    flags = {o.key: getattr(args, o.key) for o in OPTIONS if hasattr(args, o.key)}
    config_path = args.config or environ.get(ENV_PREFIX + "CONFIG")
    file_values = _from_file(config_path) if config_path else {}
    merged = {
        **_validate(file_values, "file", ConfigError),
        **_validate(_from_environment(environ), "environment", ConfigError),
        **_validate(flags, "flag", UsageError),
    }
    if flags.get("stdio") and "listen" not in flags:
        merged.pop("listen", None)  # a host's TTYSERVE_LISTEN or file is for its daemon
    return msgspec.convert(merged, ServeConfig)


def option_keys() -> Sequence[str]:
    return [option.key for option in OPTIONS]
