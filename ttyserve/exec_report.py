"""What `exec` says and returns, with or without an event loop: its options, its output
(raw bytes, or JSON lines with --json), and each failure's words and exit code.

Nothing here imports anyio: the loop-free path (exec_direct.py) shares it with the
anyio one (exec_cmd.py), so both say and return the same things.
"""

from __future__ import annotations

import signal
import sys

import msgspec

from .addresses import Address
from .defaults import DEFAULT_REMOTE_COMMAND
from .errors import CarrierError, ErrorCode, RequestError
from .exitcodes import ExecExit, exec_spawn_failure_code
from .lines import write_all
from .protocol.messages import Error, Exit, SignalName, error_message

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
    remote_command: str = DEFAULT_REMOTE_COMMAND  # what a carrier runs on the far side
    target: str = ""  # the address as given, for messages (default: as it parsed)

    def __post_init__(self) -> None:
        if not self.target:
            msgspec.structs.force_setattr(self, "target", str(self.address))


class ExecFailure(Exception):
    """`exec` cannot go on; ``code`` is its exit code, the message says why, ``members``
    make the `--json` error event; ``told`` marks a line of the contract's own wording."""

    def __init__(self, code: int, message: str, members: dict[str, object] | None = None,
                 told: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.members = members or {"message": message}
        self.told = told


def say(message: str) -> None:
    sys.stderr.write(f"ttyserve exec: {message}\n")
    sys.stderr.flush()


def tell(message: str) -> None:
    """A line of the contract's (contracts.md, persistent sessions), for people."""
    sys.stderr.write(f"ttyserve: {message}\n")
    sys.stderr.flush()


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
    return {k: v for k, v in (
        ("code", error.code), ("message", error.message), ("errno", error.errno),
        ("retriable", error.retriable), ("retry_after_ms", error.retry_after_ms),
    ) if v is not None}


def exit_members(status: Exit) -> dict[str, object]:
    return {k: v for k, v in (
        ("code", status.code), ("signal", status.signal),
        ("core_dumped", status.core_dumped), ("error", status.error),
    ) if v is not None}


def describe(exc: BaseException, options: ExecOptions) -> str:
    if isinstance(exc, RequestError):
        return f"the server refused: {exc.code}: {exc.message}"
    if isinstance(exc, OSError):
        return f"cannot connect to {options.target}: {exc.strerror or exc}"
    return str(exc)


def report(exc: BaseException, options: ExecOptions, then: str) -> None:
    """Say that a try failed and what happens next (a retry)."""
    if isinstance(exc, CarrierError):
        tell(f"{options.target}: {exc}; {then}")
    else:
        say(f"{describe(exc, options)}; {then}")


def failure(exc: BaseException, options: ExecOptions, retriable: bool) -> ExecFailure:
    if isinstance(exc, CarrierError):  # the contract's line: TARGET: CLASS: explanation
        return ExecFailure(ExecExit.FAILURE, f"{options.target}: {exc}",
                           carrier_members(exc), told=True)
    message = f"{describe(exc, options)} ({'a retry may help' if retriable else 'not retriable'})"
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
