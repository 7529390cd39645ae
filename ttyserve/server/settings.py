"""Every setting of a server, in one validated schema.

Each field marked an option is a flag (`--max-sessions`), an environment variable
(`TTYSERVE_MAX_SESSIONS`) and a key of the `--config` TOML file (`max_sessions`):
config.py reads them from there, and its help text is written here once, beside the
default (taken from defaults.py). A program that builds `ServerSettings` itself gets
the same validation as `serve`: ConfigError naming the setting.
"""

from __future__ import annotations

import contextvars
import functools
import os
import re
import shlex
import typing
from typing import Annotated, Any, Literal

import msgspec

from ..backends.cgroups import MIN_PIDS_MAX, Limits
from ..backends.kinds import BackendKind
from ..defaults import (
    DEFAULT_DETACHED_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_KEEP_ENDED,
    DEFAULT_LINGER,
    DEFAULT_MAX_ARGV_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CWD_BYTES,
    DEFAULT_MAX_ENV_BYTES,
    DEFAULT_MAX_OBSERVERS,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CONNECTION,
    DEFAULT_MAX_SHARE_TTL,
    DEFAULT_SCROLLBACK,
    DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_STDIN_WINDOW,
    DEFAULT_TARGET_IDLE,
    DEFAULT_TARGET_WINDOW,
    DEFAULT_UPGRADE_DRAIN,
)
from ..errors import ConfigError
from ..protocol.frames import DEFAULT_MAX_FRAME
from ..web.origin import normal_origin
from .auth import Access
from .policy import Policy
from .principals import load_principals

_checking = contextvars.ContextVar("_checking", default=False)  # __post_init__'s own convert
_ORIGIN = re.compile(r"https?://([a-z0-9.\-]+|\[[0-9a-f:.]+\])(:\d{1,5})?")


def option(help: str, metavar: str | None = None, **constraints: Any) -> msgspec.Meta:
    """What makes a field an option: its help (and the placeholder its flag shows)."""
    return msgspec.Meta(description=help, extra={"metavar": metavar} if metavar else {},
                        **constraints)


class ServerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything one server and its connections share, read-only while serving."""

    listen: Annotated[list[str], option(
        "unix:PATH, tcp:HOST:PORT, tls:HOST:PORT, or ws:HOST:PORT and wss:HOST:PORT for "
        "browsers (repeatable)", "ADDR")] = []
    stdio: Annotated[bool, option(
        "serve one connection on stdin and stdout, then exit (what a carrier starts: ssh "
        "HOST ttyserve serve --stdio); no token, no listener")] = False
    persist: Annotated[bool, option(
        "with --stdio: relay to the user's own server on the default socket, starting it in "
        "the background when none answers, so sessions outlive the carrier")] = False
    token_file: Annotated[str | None, option(
        "file (mode 600) holding the token TCP and TLS clients must send (or the token itself "
        "in TTYSERVE_TOKEN)", "FILE")] = None
    principals: Annotated[str | None, option(
        "TOML file of named principals, each known by its token's SHA-256, with the targets "
        "it may open and whether it may run sessions here: every listener then admits only "
        "their tokens (read again at SIGHUP)", "FILE")] = None
    targets: Annotated[str | None, option(
        "TOML file of named hosts behind this server, each reached through a carrier "
        "(ssh://, via:), where clients may open sessions by name (read again at SIGHUP)",
        "FILE")] = None
    target_idle: Annotated[float, option(
        "seconds a target's carrier connection stays up without a session there",
        "S", ge=0)] = DEFAULT_TARGET_IDLE
    target_window: Annotated[int, option(
        "output credit a session on a target gets beyond what its clients took, bytes "
        "(what this server buffers per session at most)", "BYTES", ge=4096,
        le=(1 << 31) - 1)] = DEFAULT_TARGET_WINDOW
    tls_cert: Annotated[str | None, option(
        "certificate chain (PEM) for tls: listeners", "FILE")] = None
    tls_key: Annotated[str | None, option("private key (PEM) for tls: listeners", "FILE")] = None
    insecure: Annotated[bool, option(
        "allow TCP without a token, and non-loopback TCP without TLS")] = False
    allow_uid: Annotated[list[int], option(
        "another uid allowed on Unix sockets (repeatable)", "UID")] = []
    command: Annotated[str | list[str] | None, option(
        "default command when a client sends no argv, split as a shell splits words (default: "
        "the login shell)", "CMD")] = None
    allow_command: Annotated[list[str], option(
        "glob a client's argv[0] must match (repeatable)", "PATTERN")] = []
    allow_env: Annotated[list[str], option(
        "glob of env names clients may set when commands are restricted (repeatable)",
        "PATTERN")] = []
    allow_origin: Annotated[list[str], option(
        "another origin (scheme://host[:port]) whose pages may open the WebSocket of ws: and "
        "wss: listeners (repeatable)", "ORIGIN")] = []
    max_connections: Annotated[int, option("open connections at once", "N", ge=1)] = (
        DEFAULT_MAX_CONNECTIONS)
    max_sessions: Annotated[int, option("sessions at once, all connections", "N", ge=1)] = (
        DEFAULT_MAX_SESSIONS)
    max_sessions_per_connection: Annotated[int, option(
        "sessions at once on one connection", "N", ge=1)] = DEFAULT_MAX_SESSIONS_PER_CONNECTION
    handshake_timeout: Annotated[float, option(
        "seconds a client has for hello and open", "S", gt=0)] = DEFAULT_HANDSHAKE_TIMEOUT
    max_frame: Annotated[int, option(
        "largest frame payload accepted, bytes", "BYTES", ge=4096, le=16 << 20)] = (
        DEFAULT_MAX_FRAME)
    stdin_window: Annotated[int, option(
        "STDIN credit per session on windowed connections, bytes", "BYTES", ge=1,
        le=(1 << 31) - 1)] = DEFAULT_STDIN_WINDOW
    max_argv_bytes: Annotated[int, option("largest argv of an open, bytes", "BYTES", ge=1)] = (
        DEFAULT_MAX_ARGV_BYTES)
    max_env_bytes: Annotated[int, option("largest env of an open, bytes", "BYTES", ge=1)] = (
        DEFAULT_MAX_ENV_BYTES)
    max_cwd_bytes: Annotated[int, option("longest cwd of an open, bytes", "BYTES", ge=1)] = (
        DEFAULT_MAX_CWD_BYTES)
    linger: Annotated[float, option(
        "output drain grace after a process exits, seconds", "S", ge=0)] = DEFAULT_LINGER
    shutdown_timeout: Annotated[float, option(
        "graceful shutdown watchdog, seconds", "S", ge=0)] = DEFAULT_SHUTDOWN_TIMEOUT
    journal: Annotated[str | None, option(
        "append session records to this file (fsync'd JSON lines)", "FILE")] = None
    scrollback: Annotated[int, option(
        "output a detachable session keeps for the next attach, bytes", "BYTES", ge=0)] = (
        DEFAULT_SCROLLBACK)
    detached_timeout: Annotated[float, option(
        "seconds a detached session waits for an attach before it is hung up (and an ended "
        "one's exit is dropped)", "S", gt=0)] = DEFAULT_DETACHED_TIMEOUT
    keep_ended: Annotated[float, option(
        "seconds an ended detachable session stays attachable after its exit went out, for "
        "a client that lost it (0: forgotten at once)", "S", ge=0)] = DEFAULT_KEEP_ENDED
    max_observers: Annotated[int, option(
        "observers one session may have at once (section 11; beyond it, busy)", "N",
        ge=0)] = DEFAULT_MAX_OBSERVERS
    max_share_ttl: Annotated[int, option(
        "longest a grant made by share may last, seconds", "S", ge=1)] = DEFAULT_MAX_SHARE_TTL
    record: Annotated[str | None, option(
        "write every PTY session to DIR/ID.cast (asciicast v3)", "DIR")] = None
    record_input: Annotated[bool, option(
        "record what is typed too (it holds passwords)")] = False
    cgroup: Annotated[str, option(
        "auto, off, or a cgroup v2 directory under which every session's process tree runs in "
        "a cgroup of its own, killed as a whole when the session is ended (auto: a ttyserve "
        "child of the server's own cgroup, where it may write)", "auto|off|DIR",
        min_length=1)] = "auto"
    log_format: Annotated[Literal["text", "json"], option(
        "what each line on stderr is: text for people, or json, one object with time "
        "(RFC 3339, UTC), level, message and, where they apply, worker and session, for a "
        "log system", "text|json")] = "text"
    leftovers: Annotated[Literal["kill", "leave"], option(
        "what is still running in a session's cgroup once its process exited and its output "
        "ended: kill it, or leave it running (as ssh does)", "kill|leave")] = "kill"
    session_memory_max: Annotated[int, option(
        "memory a session's cgroup may use, bytes (memory.max; 0: no limit)", "BYTES",
        ge=0)] = 0
    session_pids_max: Annotated[int, option(
        "processes a session's cgroup may hold at once (pids.max; at least 64; 0: no limit)",
        "N",
        ge=0)] = 0
    session_cpu_max: Annotated[float, option(
        "CPUs a session's cgroup may use, such as 0.5 (cpu.max; 0: no limit)", "CPUS",
        ge=0)] = 0
    upgrade_drain: Annotated[float, option(
        "at an upgrade in place (SIGUSR2), seconds the sessions that cannot be reattached may "
        "end by themselves before they are hung up", "S", ge=0)] = DEFAULT_UPGRADE_DRAIN
    workers: Annotated[str, option(
        "worker processes under one supervisor: N, or auto (one per CPU the server may run "
        "on); 1 is a single process. serve --stdio is always one", "N|auto",
        pattern=r"^(auto|[1-9][0-9]{0,3})$")] = "auto"
    spawn: Annotated[BackendKind, option(
        "how processes start: posix_spawn (the fast path, glibc 2.29+ on Linux), portable "
        "(ptyprocess and subprocess, any POSIX system) or auto", "KIND")] = "auto"
    # Not options: what a program embedding a server, or `serve` itself, sets.
    token: str | None = None  # what TCP, TLS and web clients must send (serve: token_file)
    default_cwd: str | None = None  # where sessions run that ask for no cwd (the server's)

    def __post_init__(self) -> None:
        """Every value within its type and range, as `serve` checks what it reads: the
        settings converted to themselves once more (msgspec checks what it converts, not
        what a program constructs)."""
        if _checking.get():
            return
        checking = _checking.set(True)
        try:
            msgspec.convert(msgspec.structs.asdict(self), type(self), strict=True)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid setting: {exc}") from None
        finally:
            _checking.reset(checking)
        if 0 < self.session_pids_max < MIN_PIDS_MAX:
            raise ConfigError(f"session_pids_max {self.session_pids_max}: at least "
                              f"{MIN_PIDS_MAX} (the server's own threads count toward it "
                              "while it starts a session), or 0 for no limit")
        if self.cgroup == "off" and self.limits.controllers():
            raise ConfigError("the session limits need a cgroup for each session: not with "
                              "cgroup off")
        if self.persist and not self.stdio:
            raise ConfigError("persist relays a carrier's stdio: it needs stdio too")
        if self.command is not None and not self.default_argv:
            raise ConfigError(f"command {self.command!r} names no program")
        for origin in self.allow_origin:
            if not _ORIGIN.fullmatch(normal_origin(origin)):
                raise ConfigError(f"allow_origin {origin!r}: expected an origin such as "
                                  "https://example.com or http://127.0.0.1:8080")

    @property
    def default_argv(self) -> list[str]:
        """What a session runs when its `open` names nothing: the command, else the user's
        login shell (as sshd runs it)."""
        if isinstance(self.command, str):
            return shlex.split(self.command)
        if self.command is not None:
            return list(self.command)
        return login_shell()

    @property
    def access(self) -> Access:
        """Who may connect: the token, the uids allowed besides the server's own, or the
        principals (the file read now: ConfigError naming it when it cannot be used)."""
        return Access(token=self.token, allowed_uids=frozenset(self.allow_uid),
                      principals=load_principals(self.principals) if self.principals
                      else None)

    @property
    def policy(self) -> Policy:
        """What clients may run: command and env patterns, request sizes."""
        return Policy(self.allow_command, self.allow_env, self.max_argv_bytes,
                      self.max_env_bytes, self.max_cwd_bytes)

    @property
    def allowed_origins(self) -> frozenset[str]:
        """The other origins whose pages may open the WebSocket, as browsers write them."""
        return frozenset(normal_origin(origin) for origin in self.allow_origin)

    @property
    def limits(self) -> Limits:
        """What each session's cgroup may use."""
        return Limits(self.session_memory_max or None, self.session_pids_max or None,
                      self.session_cpu_max or None)

    @property
    def worker_count(self) -> int:
        """How many worker processes serve: 1 with --stdio; `auto` is one per CPU this
        process may run on."""
        if self.stdio:
            return 1
        if self.workers == "auto":
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
                os.cpu_count() or 1)
        return int(self.workers)

    @property
    def keeps_detached(self) -> bool:
        """Whether a session may outlive its connection (not with `serve --stdio`, whose one
        connection ends the server)."""
        return not self.stdio


@functools.cache
def options() -> dict[str, tuple[Any, msgspec.Meta, Any]]:
    """Every option, in order: its name, its type, its Meta (help, placeholder), its
    default; read once, not to be changed. (Not msgspec.structs.fields: it imports
    typing_extensions, 15 ms of start-up for every `serve --stdio` a carrier starts.)"""
    hints = typing.get_type_hints(ServerSettings, include_extras=True)
    defaults = msgspec.structs.asdict(ServerSettings())
    found = {}
    for name in ServerSettings.__struct_fields__:
        meta = next((m for m in getattr(hints[name], "__metadata__", ())
                     if isinstance(m, msgspec.Meta) and m.description), None)
        if meta is not None:
            found[name] = (hints[name], meta, defaults.get(name))
    return found


def login_shell() -> list[str]:
    """The user's login shell as sshd runs it when no command is given."""
    import pwd

    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    except KeyError:
        shell = "/bin/sh"
    return [shell, "-l"]
