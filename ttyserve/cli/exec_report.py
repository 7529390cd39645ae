"""What `exec` says and returns, with or without an event loop: its options, its output
(raw bytes, or JSON lines with --json), and each failure's words and exit code.

Nothing here imports anyio: the loop-free path (exec_direct.py) shares it with the
anyio one (exec_cmd.py), so both say and return the same things.
"""

from __future__ import annotations

import errno
import signal
import sys

import msgspec

from ..addresses import Address
from ..client.retry import backoff, retriable
from ..defaults import DEFAULT_HEARTBEAT, DEFAULT_REMOTE_COMMAND
from ..errors import (
    CarrierError,
    ConnectionLost,
    ErrorCode,
    RemoteProtocolError,
    RequestError,
    TargetFailure,
)
from ..exitcodes import ExecExit, exec_spawn_failure_code
from ..lines import write_all
from ..protocol.messages import Error, SignalName, error_message, members

FORWARDED: dict[signal.Signals, SignalName] = {
    signal.SIGINT: "INT", signal.SIGTERM: "TERM", signal.SIGHUP: "HUP", signal.SIGQUIT: "QUIT",
}


class ExecOptions(msgspec.Struct, frozen=True):
    address: Address
    argv: list[str]
    pty: bool | None = None  # None: a PTY when stdin is a terminal
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    retries: int = 0
    json: bool = False
    token: str | None = None
    tls_ca: str | None = None
    detachable: bool = False
    detach_key: bytes | None = None  # typed at a terminal in raw mode: detach (None: never)
    attach: str | None = None  # `ttyserve attach ID`: take over this session, start nothing
    steal: bool = False
    observe: bool = False  # attach as an observer (section 11): watch, never type
    grant: str | None = None  # come in with a grant instead of the token
    remote_command: str = DEFAULT_REMOTE_COMMAND  # what a carrier runs on the far side
    target: str = ""  # the address as given, for messages (default: as it parsed)
    on_target: str | None = None  # the door's target the session runs on (section 15)
    resume: float | None = None  # seconds to come back within after a lost connection
    heartbeat: int | None = None  # seconds between heartbeats (DEFAULT_HEARTBEAT with resume)

    def __post_init__(self) -> None:
        if not self.target:
            msgspec.structs.force_setattr(self, "target", str(self.address))
        if self.resume is not None and self.heartbeat is None:
            msgspec.structs.force_setattr(self, "heartbeat", DEFAULT_HEARTBEAT)

    @property
    def multiplex(self) -> bool:
        """A connection that carries a detachable session stays open after its exit, so the
        client can `release` it (a single-session one closes at once)."""
        return self.detachable or self.attach is not None or self.resume is not None


class ExecFailure(Exception):
    """`exec` cannot go on; ``code`` is its exit code, the message says why, ``members``
    make the `--json` error event; ``told`` marks a line of the contract's own wording."""

    def __init__(self, code: int, message: str, members: dict[str, object] | None = None,
                 told: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.members = members or {"message": message}
        self.told = told

    def said(self, out: Output) -> int:
        """Say it (stderr, and the `--json` error event); the exit code."""
        (tell if self.told else say)(str(self))
        out.event("error", **self.members)
        return self.code


def output_closed() -> ExecFailure:
    """Our stdout was closed under us: end as a process that SIGPIPE killed would."""
    return ExecFailure(ExecExit.SIGNAL_BASE + signal.SIGPIPE, "local output closed")


def second_interrupt() -> ExecFailure:
    """A second SIGINT here: the session is cancelled (contracts.md: exit 130)."""
    return ExecFailure(ExecExit.INTERRUPTED, "interrupted: the session was cancelled")


def terminated() -> ExecFailure:
    """A forwarded SIGTERM the session did not end by within TERM_GRACE, or a second one: it
    is cancelled (contracts.md: exit 143), so a script's `timeout` never wedges on a remote
    process that ignores SIGTERM."""
    return ExecFailure(ExecExit.SIGNAL_BASE + signal.SIGTERM,
                       "terminated: the session was cancelled")


def stopped_before_start(signum: int, out: Output) -> int:
    """A signal to stop came before the command started: say so; the exit code."""
    message = f"{signal.Signals(signum).name} before the command started: nothing was started"
    say(message)
    out.event("error", message=message)
    return ExecExit.INTERRUPTED if signum == signal.SIGINT else ExecExit.SIGNAL_BASE + signum


def connection_ended(exc: ConnectionLost | RemoteProtocolError, out: Output, opened: bool,
                     session_id: str | None = None) -> int:
    """The connection broke or was misused: say what that means for the command. Never a
    success: 255, and once the command may have run, the class `lost`."""
    if session_id is not None:
        say(f"{exc}; the session goes on: ttyserve attach {session_id}")
    elif not opened and isinstance(exc, RemoteProtocolError):
        say(f"{exc}; nothing ran")
        out.event("error", **{"class": TargetFailure.PROTOCOL_ERROR, "retriable": False,
                              "message": str(exc)})
        return ExecExit.FAILURE
    else:
        say(f"{exc}; the exit status is unknown (the command may have run: not retried)")
    out.event("error", **{"class": TargetFailure.LOST, "retriable": False,
                          "message": str(exc)})
    return ExecExit.FAILURE


_said_by = ["exec"]  # the command this process runs (`attach` says so as itself)


def said_by(command: str) -> None:
    """Lines of `say` name ``command`` from now on (`attach` runs `exec`'s code)."""
    _said_by[0] = command


def say(message: str) -> None:
    _line(f"ttyserve {_said_by[0]}: {message}\n")


def tell(message: str) -> None:
    """A line of the contract's (contracts.md, persistent sessions), for people."""
    _line(f"ttyserve: {message}\n")


def _line(text: str) -> None:
    """A line on stderr, if anyone can still read it: a terminal that went away (EIO) or a
    closed pipe loses the line, never the exit code."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except OSError:
        pass


class Output:
    """Where remote output and events go: raw bytes, or JSON lines with --json."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def event(self, name: str, **members: object) -> None:
        """With --json, one event line; one that nobody can read any more (our stdout was
        closed) is dropped, so that the failure being reported is not lost to it."""
        if self.as_json:
            try:
                _json_line({"event": name, **members})
            except BrokenPipeError:
                pass

    def data(self, stream: str, data: bytes, **members: object) -> None:
        """Raises BrokenPipeError when our stdout (or stderr) was closed."""
        if self.as_json:
            import base64

            _json_line({"event": stream, **members,
                        "data": base64.b64encode(data).decode("ascii")})
        else:
            write_all(2 if stream == "stderr" else 1, data)


def _json_line(obj: dict[str, object]) -> None:
    import json  # here: only --json pays for it

    write_all(1, json.dumps(obj, separators=(",", ":")).encode() + b"\n")


def error_members(error: Error) -> dict[str, object]:
    """An `error`'s members for a `--json` event (the channel it names is the wire's)."""
    fields = members(error)
    fields.pop("channel", None)
    return fields


def retry_delay(exc: BaseException, options: ExecOptions, attempt: int) -> float:
    """A try before `opened` failed: the wait before the next, said on stderr. Raises the
    ExecFailure to end with when no retry is left or none can help."""
    may_retry, hint = retriable(exc)
    if not may_retry or attempt == options.retries:
        raise _failure(exc, options, may_retry) from exc
    delay = backoff(attempt, hint)
    _report(exc, options, f"retrying in {delay:.2f}s ({attempt + 1}/{options.retries})")
    return delay


def _describe(exc: BaseException, options: ExecOptions) -> str:
    if isinstance(exc, RequestError):
        return f"the server refused: {exc.code}: {exc.message}"
    if isinstance(exc, OSError):
        hint = ""
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            hint = (" (no server answers there: start one with `ttyserve serve`, or name "
                    "another with --connect)")
        return f"cannot connect to {options.target}: {exc.strerror or exc}{hint}"
    return str(exc)


def _report(exc: BaseException, options: ExecOptions, then: str) -> None:
    """Say that a try failed and what happens next (a retry)."""
    if isinstance(exc, CarrierError):
        tell(f"{options.target}: {exc}; {then}")
    else:
        say(f"{_describe(exc, options)}; {then}")


def _failure(exc: BaseException, options: ExecOptions, retriable: bool) -> ExecFailure:
    if isinstance(exc, CarrierError):  # the contract's line: TARGET: CLASS: explanation
        return ExecFailure(ExecExit.FAILURE, f"{options.target}: {exc}",
                           carrier_members(exc), told=True)
    message = f"{_describe(exc, options)} ({'a retry may help' if retriable else 'not retriable'})"
    if isinstance(exc, RequestError):
        code: int = ExecExit.FAILURE
        if exc.code == ErrorCode.SPAWN_FAILED:
            code = exec_spawn_failure_code(exc.errno)
        return ExecFailure(code, message, error_members(error_message(exc)))
    return ExecFailure(ExecExit.FAILURE, message)


def carrier_members(exc: CarrierError) -> dict[str, object]:
    """The `--json` error event of a carrier that ended before `welcome`."""
    members: dict[str, object] = {"class": str(exc.failure), "retriable": exc.retriable,
                                  "message": exc.explanation}
    if exc.status is not None:
        members["status"] = exc.status
    return members
