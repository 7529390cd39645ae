"""Every error: the wire's error codes (protocol section 6), and every exception
ttyserve raises on purpose, in one tree.

    TtyserveError                   catch this to catch anything ttyserve means to raise
    ├── ProtocolError               protocol v1 was broken
    │   ├── LocalProtocolError      by this side: the core refused to frame it (a bug, or
    │   │                           misuse of the API); nothing was sent
    │   └── RemoteProtocolError     by the peer: the connection is over
    ├── RequestError                one request refused with an `error` message: raised by
    │                               the server to refuse it, by the client when refused
    ├── ConnectionLost              the connection ended before the session did
    ├── CarrierError                a carrier (ssh, via:) ended before `welcome`; ``failure``
    │                               classifies it by remedy (contracts.md, carriers)
    ├── SessionCancelled            this side cancelled the session: no `exit` will come
    ├── SessionDetached             the channel ended, the session goes on (detach, steal)
    ├── SpawnError (an OSError)     the process could not be started; `errno` says why
    ├── OutOfResources (an OSError) a carrier could not be started: no descriptors,
    │                               processes or memory here (retriable)
    ├── AddressError (a ValueError) an address that does not parse
    ├── RecordingError (a ValueError) a file that is not an asciicast v3 recording
    │                               (`recording convert` exits 2)
    ├── ConfigError                 a setting that cannot be used (`serve` exits 3)
    │   ├── UsageError              a bad command-line flag (`serve` exits 2)
    │   └── ListenError             an address that cannot be bound (`serve` exits 3)
    └── LeaseError                  another live server holds the socket or journal (exit 4)

Foreign exceptions are translated once, where they enter (`from exc`).
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """The `code` member of an `error` message (protocol section 6)."""

    UNAUTHORIZED = "unauthorized"
    UNSUPPORTED_PROTOCOL = "unsupported_protocol"
    PROTOCOL_ERROR = "protocol_error"
    BUSY = "busy"
    SHUTTING_DOWN = "shutting_down"
    BAD_REQUEST = "bad_request"
    FORBIDDEN = "forbidden"
    SPAWN_FAILED = "spawn_failed"
    UNKNOWN_MESSAGE = "unknown_message"
    CHANNEL_IN_USE = "channel_in_use"
    SESSION_IN_USE = "session_in_use"  # section 9: attached elsewhere (steal to take it)
    NO_SUCH_SESSION = "no_such_session"  # unknown, expired, or another principal's
    SERVER_RESTARTING = "server_restarting"  # section 12: upgrading in place; resume soon
    READ_ONLY = "read_only"  # section 11: an observer sent what only the writer may send
    NO_SUCH_TARGET = "no_such_target"  # section 15: unknown, or one the principal may not open
    TARGET_UNREACHABLE = "target_unreachable"  # section 15: its carrier failed before `opened`


RETRIABLE = frozenset({ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN, ErrorCode.SERVER_RESTARTING})


class CarrierFailure(enum.StrEnum):
    """How a carrier that ended before `welcome` failed, by remedy (contracts.md)."""

    NOT_INSTALLED = "not_installed"
    UNREACHABLE = "unreachable"
    USAGE = "usage"
    CONFIG = "config"
    LEASE = "lease"
    UNSUPPORTED = "unsupported"
    CRASHED = "crashed"


class TargetFailure(enum.StrEnum):
    """How a target of `exec` failed besides the carrier table and the server's error codes
    (docs/carriers.md): the class in its summary line and its `--json` error event."""

    UNREACHABLE = "unreachable"  # the address could not be connected to
    LOST = "lost"  # the connection ended before the exit arrived: the command may have run
    PROTOCOL_ERROR = "protocol_error"  # the far side broke the protocol
    WAIT_FAILED = "wait_failed"  # the far side could not learn the status
    NO_RESOURCES = "no_resources"  # this machine ran out of descriptors or memory
    CANCELLED = "cancelled"  # the fan-out was cancelled before the target ended


# Whether a retry may help, and what the one-line report says: the contract's table.
CARRIER_FAILURES: dict[CarrierFailure, tuple[bool, str]] = {
    CarrierFailure.NOT_INSTALLED: (
        False, "ttyserve is not on the far side's PATH; use --remote-command"),
    CarrierFailure.UNREACHABLE: (
        True, "ssh could not connect or authenticate (its stderr is shown)"),
    CarrierFailure.USAGE: (
        False, "the far side's ttyserve refused the invocation (too old for --stdio?)"),
    CarrierFailure.CONFIG: (False, "the far side's configuration is unusable"),
    CarrierFailure.LEASE: (
        True, "the far side's journal or socket is held by another server"),
    CarrierFailure.UNSUPPORTED: (False, "the far side cannot serve (platform)"),
    CarrierFailure.CRASHED: (True, "the far side or carrier crashed"),
}


class TtyserveError(Exception):
    """The base of every exception ttyserve raises on purpose."""


class ProtocolError(TtyserveError):
    """Protocol v1 was broken. ``code`` is what a server reports on channel 0."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LocalProtocolError(ProtocolError):
    """This side asked the core for something the protocol forbids; nothing was sent."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol: the connection must close."""


class RequestError(TtyserveError):
    """One request refused with ``code``; the connection goes on.

    ``retriable`` says whether the same request may succeed if sent again
    unchanged (from the code, unless the peer said otherwise).
    """

    def __init__(self, code: ErrorCode | str, message: str, *, errno: int | None = None,
                 retry_after_ms: int | None = None, retriable: bool | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.errno = errno
        self.retry_after_ms = retry_after_ms
        self.retriable = code in RETRIABLE if retriable is None else retriable


class ConnectionLost(TtyserveError):
    """The connection ended before the session's `exit` (or its refusal) arrived."""


class CarrierError(TtyserveError):
    """The carrier ended before the far side said `welcome`; ``failure`` says why by
    remedy, ``retriable`` whether trying again may help, ``status`` how it ended
    (its exit code, or -S for signal S; None if it never started)."""

    def __init__(self, failure: CarrierFailure, status: int | None,
                 explanation: str | None = None) -> None:
        retriable, usual = CARRIER_FAILURES[failure]
        self.failure = failure
        self.retriable = retriable
        self.status = status
        self.explanation = explanation or usual
        super().__init__(f"{failure}: {self.explanation}")


class SessionCancelled(TtyserveError):
    """This side cancelled the session: the server sends nothing more for it."""


class SessionDetached(TtyserveError):
    """The channel ended with `detached`: the session goes on, to be attached again.

    ``reason`` is the server's (``"stolen"`` when another client took it over).
    """

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(f"the session was detached{f' ({reason})' if reason else ''}")
        self.reason = reason


class SpawnError(TtyserveError, OSError):
    """The process could not be started; ``errno`` says why, ``strerror`` for people."""


class OutOfResources(TtyserveError, OSError):
    """A carrier could not be started here: this machine is out of descriptors, processes
    or memory (errno says which). Not the far side's fault; a retry may succeed."""


class AddressError(TtyserveError, ValueError):
    """An address that does not parse; the message names it."""


class RecordingError(TtyserveError, ValueError):
    """A file that is not an asciicast v3 recording; ``line`` is the number of the line at
    fault (None: the file as a whole), the message says what is wrong with it."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class ConfigError(TtyserveError):
    """A setting that cannot be used; the message names where it came from."""


class UsageError(ConfigError):
    """A bad command-line flag (exit 2 rather than 3)."""


class ListenError(ConfigError):
    """An address cannot be bound (a configuration error: exit 3)."""


class LeaseError(TtyserveError):
    """Another live process holds the lease (exit 4); the message names its pid."""

    def __init__(self, what: str, pid: int | None) -> None:
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(f"{what} is held by {holder}")
        self.pid = pid
