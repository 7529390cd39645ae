"""Control messages of protocol v1 as msgspec tagged structs.

Every optional member has a default, so a peer that omits it (or an older
peer) still decodes; members we do not know are ignored, as the contract asks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from ..defaults import HTTP_MAX_WAIT, MAX_HEARTBEAT
from ..errors import ErrorCode, ProtocolError, RemoteProtocolError, RequestError

PROTOCOL_VERSION = 1
# The defaults of `open` (section 4), written once: the backends and the client reuse them.
DEFAULT_ROWS = 24
DEFAULT_COLS = 80
DEFAULT_TERM = "xterm-256color"

Dimension = Annotated[int, msgspec.Meta(ge=1, le=10000)]
Role = Literal["writer", "observer"]  # section 11: how a channel is attached to a session
WRITER: Role = "writer"
OBSERVER: Role = "observer"
# The HTTP door's own two (section 13, this server's extension; only its requests may ask
# for them): its output stream, the session's writer for its output, and its writes,
# which send input beside a stream (watching as observers do) and never take its place.
AttachRole = Literal["writer", "observer", "stream", "input"]
STREAM: AttachRole = "stream"
INPUT: AttachRole = "input"
# A principal's, a target's or a label's name (the principals and targets files, `open`).
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
TargetName = Annotated[str, msgspec.Meta(pattern=f"^{NAME_PATTERN}$")]
ChannelCredit = Annotated[int, msgspec.Meta(ge=1, le=(1 << 31) - 1)]
HeartbeatSeconds = Annotated[int, msgspec.Meta(ge=1, le=MAX_HEARTBEAT)]  # section 10
Offset = Annotated[int, msgspec.Meta(ge=0)]
SignalName = Literal[
    "INT", "TERM", "KILL", "HUP", "QUIT", "USR1", "USR2",
    "WINCH", "CONT", "STOP", "TSTP", "ALRM", "PIPE",
]


class Message(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    """Base of every control message; `type` is the tag."""


# --- client -> server -------------------------------------------------------


class Hello(Message, tag="hello"):
    protocol: int
    token: str | None = None
    client: str | None = None
    multiplex: bool = False
    window: ChannelCredit | None = None
    heartbeat: HeartbeatSeconds | None = None  # section 10: each side speaks every S seconds
    grant: str | None = None  # section 11: instead of `token`, admitted for one session


class Open(Message, tag="open"):
    argv: list[str] = []
    pty: bool = True
    rows: Dimension = DEFAULT_ROWS
    cols: Dimension = DEFAULT_COLS
    term: str = DEFAULT_TERM
    env: dict[str, str] = {}
    cwd: str | None = None
    detachable: bool = False  # section 9: it outlives its connection
    detached_timeout: Annotated[int, msgspec.Meta(ge=1)] | None = None  # section 10, seconds
    # Section 13's Idempotency-Key (this server's extension, for its HTTP door): a second
    # detachable `open` of the principal with the same key, while the first is known, gets
    # session_in_use naming it.
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None
    target: TargetName | None = None  # section 15: run it on this target of the server
    modes: bool = False  # section 14: send `modes` on this channel (PTY sessions)


class Offsets(msgspec.Struct, kw_only=True):
    """Per stream, bytes since the session started (section 10): what a client holds, or
    where an attach's output begins. Both members always go out (a stream at 0 too); one
    left out of what a client sends is 0."""

    stdout: Offset = 0
    stderr: Offset = 0


class Attach(Message, tag="attach"):
    """Instead of `open`, on a fresh channel: take over a detachable session (section 9)."""

    session: str
    rows: Dimension | None = None
    cols: Dimension | None = None
    steal: bool = False
    offsets: Offsets | None = None  # section 10: the bytes the client already holds
    role: AttachRole = WRITER  # section 11
    # This server's extension, for its HTTP door (section 13): a writer's attach that meets
    # another writer waits up to this many seconds for it to let go, then attaches (or
    # session_in_use), instead of session_in_use at once.
    wait: Annotated[float, msgspec.Meta(ge=0, le=HTTP_MAX_WAIT)] | None = None
    modes: bool = False  # section 14: send `modes` on this channel (PTY sessions)


class Release(Message, tag="release"):
    """On channel 0: forget an ended session now, its exit read (section 10)."""

    session: str


class Share(Message, tag="share"):
    """On channel 0: make a grant for one of the caller's sessions (section 11)."""

    session: str
    role: Role = OBSERVER
    # Seconds, at most the server's --max-share-ttl; none: DEFAULT_SHARE_TTL within that.
    ttl: Annotated[int, msgspec.Meta(ge=1)] | None = None


class Unshare(Message, tag="unshare"):
    """On channel 0: revoke a grant (the grant itself, or its public id: `shared.id`)."""

    grant: str


class Ping(Message, tag="ping"):
    """On channel 0, either way: answered by `pong` at once (section 10)."""


class Pong(Message, tag="pong"):
    pass


class Detach(Message, tag="detach"):
    pass


class List(Message, tag="list"):
    """On channel 0: the caller's detachable sessions."""


class ListTargets(Message, tag="targets"):
    """On channel 0: the targets the caller may open (section 15); answered by `targets`."""


class Resize(Message, tag="resize"):
    rows: Dimension
    cols: Dimension


class Signal(Message, tag="signal"):
    name: SignalName


class Eof(Message, tag="eof"):
    pass


class Cancel(Message, tag="cancel"):
    pass


class Window(Message, tag="window"):
    """Credit: output credit from a client (CTRL_IN), STDIN credit from a server (CTRL_OUT)."""

    bytes: ChannelCredit


# --- server -> client -------------------------------------------------------


class GrantScope(msgspec.Struct, omit_defaults=True, kw_only=True):
    """What a connection admitted by a grant may do: attach one session, in at most one
    role, until a time (sent in `welcome`, so a page knows the role to attach with)."""

    session: str
    role: Role
    expires: str  # RFC 3339


class Welcome(Message, tag="welcome"):
    protocol: int
    server: str
    max_frame: int
    window: int | None = None
    heartbeat: int | None = None  # the client's `hello.heartbeat`, agreed
    grant: GrantScope | None = None  # section 11: the connection came with `hello.grant`


class Opened(Message, tag="opened"):
    pid: int
    argv: list[str] | None = None  # what runs (the server's default when `open` had none)
    session: str | None = None  # a detachable session's id (section 9)
    pty: bool | None = None  # whether it runs under a PTY (what the server did, not asked)
    target: str | None = None  # section 15: the target it runs on (`pid` is the far side's)


class Attached(Message, tag="attached"):
    session: str
    pid: int
    pty: bool
    dropped: int  # output bytes lost from the ring since the session started
    offsets: Offsets | None = None  # where this attach's output begins, per stream
    prologue: str | None = None  # escape sequences that restore a PTY's terminal modes
    role: AttachRole | None = None  # section 11: always sent by this server


HTTP = "http"  # the peer kind of the HTTP API's requests (journal: http:ADDR), and list's
# `attached_by` when the session's writer is one of them (section 13)
STOLEN = "stolen"  # the reason of `detached` when another channel attached with steal
REVOKED = "revoked"  # ...when the grant the channel was attached through was unshared
EXPIRED = "expired"  # ...when that grant's time ran out


class Detached(Message, tag="detached"):
    """A channel's last frame when its session goes on without it."""

    reason: str | None = None  # STOLEN, REVOKED, EXPIRED, or none for a `detach`


class Skipped(Message, tag="skipped"):
    """To an observer that fell a scrollback behind: N bytes it will never get (section 11)."""

    bytes: int
    offsets: Offsets | None = None  # where its streams go on (always sent by this server)


class Audience(Message, tag="audience"):
    """To the writer: how many observers watch now (section 11)."""

    observers: int


InputVerdict = Literal["echoed", "application", "hidden"]
ECHOED: InputVerdict = "echoed"  # ECHO on: the terminal shows what is typed
APPLICATION: InputVerdict = "application"  # ECHO and ICANON off: the program draws keys
HIDDEN: InputVerdict = "hidden"  # ECHO off, ICANON on: a line read unseen (a password)


class Modes(Message, tag="modes"):
    """Section 14: the terminal's state, on a channel that asked for it; it holds from
    STDOUT ``offset`` on."""

    echo: bool
    canonical: bool
    alt_screen: bool
    input: InputVerdict
    offset: Offset


class Shared(Message, tag="shared"):
    """The answer to `share`: the grant (a bearer secret), and its public id for records."""

    session: str
    grant: str
    role: Role
    expires: str  # RFC 3339
    id: str | None = None  # the grant's public id: what journals and listings name


class Unshared(Message, tag="unshared"):
    """The answer to `unshare`: the grant is gone, and ``channels`` were detached."""

    id: str
    channels: int


class GrantInfo(msgspec.Struct, omit_defaults=True, kw_only=True):
    """An open grant in `sessions`: never the grant itself."""

    id: str
    role: Role
    expires: str  # RFC 3339


class SessionInfo(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One entry of `sessions`."""

    session: str
    argv: list[str]
    pid: int
    pty: bool
    started: str  # RFC 3339
    attached: bool
    exit: dict[str, Any] | None = None  # the members of its `exit` message, once ended
    observers: int = 0  # section 11: channels watching it
    grants: list[GrantInfo] = []  # section 11: its open grants
    offsets: Offsets | None = None  # the output so far, per stream (section 13's status)
    idempotency_key: str | None = None  # as its `open` gave it
    attached_by: str | None = None  # HTTP: its writer came through the HTTP API (section 13)
    target: str | None = None  # section 15: the target it runs on


TargetState = Literal["connected", "idle", "unreachable"]
CONNECTED: TargetState = "connected"  # a carrier connection to it is up
IDLE: TargetState = "idle"  # never tried, or closed by --target-idle
UNREACHABLE: TargetState = "unreachable"  # the last attempt to start one failed


class TargetInfo(msgspec.Struct, kw_only=True):
    """One entry of `targets`."""

    name: str
    labels: dict[str, str]
    state: TargetState


class Targets(Message, tag="targets"):
    """The answer to `targets`: what the caller may open, sorted by name (section 15)."""

    targets: list[TargetInfo]


class Sessions(Message, tag="sessions"):
    sessions: list[SessionInfo]


class Exit(Message, tag="exit"):
    code: int
    signal: str | None = None
    core_dumped: bool | None = None
    error: str | None = None


class Error(Message, tag="error"):
    code: str
    message: str
    errno: int | None = None
    retriable: bool | None = None  # always sent by this server; None only from peers that omit it
    retry_after_ms: int | None = None
    channel: int | None = None  # channel_in_use on channel 0 names the ended channel


ClientMessage = (Hello | Open | Attach | Detach | List | Resize | Signal | Eof | Cancel | Window
                 | Release | Ping | Pong | Share | Unshare | ListTargets)
ServerMessage = (Welcome | Opened | Attached | Detached | Sessions | Exit | Error | Window
                 | Ping | Pong | Skipped | Audience | Shared | Unshared | Targets | Modes)


def _vocabulary(*classes: type[Message]) -> dict[str, type[Message]]:
    return {cls.__struct_config__.tag: cls for cls in classes}  # type: ignore[misc]


CLIENT_MESSAGES: dict[str, type[Message]] = _vocabulary(
    Hello, Open, Attach, Detach, List, Resize, Signal, Eof, Cancel, Window, Release, Ping, Pong,
    Share, Unshare, ListTargets)
SERVER_MESSAGES: dict[str, type[Message]] = _vocabulary(
    Welcome, Opened, Attached, Detached, Sessions, Exit, Error, Window, Ping, Pong, Skipped,
    Audience, Shared, Unshared, Targets, Modes)

_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def encode_message(message: Message) -> bytes:
    """The JSON payload of a control frame."""
    return _encoder.encode(message)


def members(message: Message) -> dict[str, object]:
    """A message's members as the wire carries them, absent ones left out and its `type`
    aside: `list` gives an ended session's `exit` so, and `exec --json` its events."""
    fields: dict[str, object] = msgspec.to_builtins(message)
    del fields["type"]
    return fields


def parse_object(payload: bytes) -> tuple[str, dict[str, Any]]:
    """Decode a control payload to (type, object); anything else is a protocol error."""
    try:
        obj = _json_decoder.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RemoteProtocolError(f"control payload is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise RemoteProtocolError("control payload is not a JSON object")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise RemoteProtocolError("control message has no string member 'type'")
    return kind, obj


def convert_message(
    kind: str, obj: dict[str, Any], vocabulary: dict[str, type[Message]]
) -> Message:
    """Validate a decoded object as the message its `type` names.

    Raises :class:`RequestError` with ``unknown_message`` for a type outside
    ``vocabulary`` and ``bad_request`` for members of the wrong type or range.
    """
    cls = vocabulary.get(kind)
    if cls is None:
        raise RequestError(ErrorCode.UNKNOWN_MESSAGE, f"unknown message type {kind!r}")
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        raise RequestError(ErrorCode.BAD_REQUEST, f"invalid {kind!r} message: {exc}") from exc


def error_message(error: RequestError | ProtocolError, channel: int | None = None) -> Error:
    """The wire form of a refusal (``channel`` names the id for channel_in_use on channel 0)."""
    if isinstance(error, RequestError):
        return Error(code=str(error.code), message=error.message, errno=error.errno,
                     retriable=error.retriable, retry_after_ms=error.retry_after_ms,
                     channel=channel)
    return Error(code=str(error.code), message=error.message, retriable=False)


def request_error(error: Error) -> RequestError:
    """A received `error` as the exception a client raises."""
    return RequestError(error.code, error.message, errno=error.errno,
                        retry_after_ms=error.retry_after_ms, retriable=error.retriable)
