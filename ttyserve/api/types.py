"""The HTTP API's bodies (protocol section 13), derived from the protocol's own messages so
that a member means one thing at every door; the OpenAPI document is made from these."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from ..protocol.messages import Exit, Offsets, Open, Resize, SessionInfo, Signal, TargetInfo


def _member(f: msgspec.structs.FieldInfo) -> tuple[str, Any, Any]:
    """A struct field as msgspec.defstruct takes it, its default (or factory) kept."""
    if f.default_factory is not msgspec.NODEFAULT:
        return f.name, f.type, msgspec.field(default_factory=f.default_factory)
    return f.name, f.type, f.default


# `POST /api/v1/sessions`: the members of `open` (not `detachable`: every session made over
# HTTP is), and the text to write to its stdin before `eof`.
CreateSession = msgspec.defstruct(
    "CreateSession",
    [*(_member(f) for f in msgspec.structs.fields(Open)
       if f.name not in ("detachable", "idempotency_key")),  # (the key: a header)
     ("stdin", str | None, None)],
    kw_only=True, forbid_unknown_fields=True, omit_defaults=True)


# What generated clients read as typed fields (issue 41): a time as RFC 3339, and `exit`
# with the exit message's members (a dict in the protocol's `list`, which says the same).
DateTime = Annotated[str, msgspec.Meta(extra_json_schema={"format": "date-time"})]
ExitStatus = msgspec.defstruct(
    "ExitStatus", [_member(f) for f in msgspec.structs.fields(Exit)], kw_only=True,
    omit_defaults=True)


def _typed(f: msgspec.structs.FieldInfo) -> tuple[str, Any] | tuple[str, Any, Any]:
    if f.name == "started":
        return f.name, DateTime
    if f.name == "exit":
        return f.name, ExitStatus | None, None
    return _member(f)


# `GET /api/v1/sessions`'s entries: `list`'s (section 9), their time and exit typed.
SessionEntry = msgspec.defstruct("SessionEntry", [
    _typed(f) for f in msgspec.structs.fields(SessionInfo)], kw_only=True, omit_defaults=True)


def entry(info: SessionInfo) -> Any:
    """A `list` entry as the API answers it (`SessionEntry`)."""
    return msgspec.convert(msgspec.to_builtins(info), SessionEntry)


class Created(msgspec.Struct, kw_only=True):
    """The answer to `POST /api/v1/sessions` (201; 200 for a repeated Idempotency-Key)."""

    session: str
    pid: int
    pty: bool


class SessionList(msgspec.Struct, kw_only=True):
    """`GET /api/v1/sessions`: `list`'s entries (section 9)."""

    sessions: list[SessionEntry]  # type: ignore[valid-type]


class TargetList(msgspec.Struct, kw_only=True):
    """`GET /api/v1/targets`: the targets this principal may open, as `targets` says them
    (section 15)."""

    targets: list[TargetInfo]


class SessionStatus(msgspec.Struct, kw_only=True):
    """`GET /api/v1/sessions/ID`: a `list` entry's members, with `offsets` (the output so
    far) and `exit` (null while it runs) always present."""

    session: str
    argv: list[str]
    pid: int
    pty: bool
    started: DateTime
    attached: bool
    observers: int
    offsets: Offsets
    exit: ExitStatus | None  # type: ignore[valid-type]


def _body_of(message: type[msgspec.Struct], name: str) -> type[msgspec.Struct]:
    """A request body with ``message``'s members, and no `type` member."""
    return msgspec.defstruct(name, [_member(f) for f in msgspec.structs.fields(message)],
                             kw_only=True, forbid_unknown_fields=True)


SignalBody = _body_of(Signal, "SignalBody")  # `POST .../signal`: {"name": "INT"}
ResizeBody = _body_of(Resize, "ResizeBody")  # `POST .../resize`: {"rows": R, "cols": C}


class ErrorDetail(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: str  # section 6's codes (ErrorCode)
    message: str
    retriable: bool
    errno: int | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    """Every answer that is not a success."""

    error: ErrorDetail


# The output stream's objects, in order: attached, then output and skipped, then exit.
class AttachedEvent(msgspec.Struct, kw_only=True, tag_field="type", tag="attached"):
    offsets: Offsets


class OutputEvent(msgspec.Struct, kw_only=True, tag_field="type", tag="output"):
    stream: Literal["stdout", "stderr"]
    offset: int  # of the first byte of ``data`` in its stream
    data: bytes  # base64 in JSON


class SkippedEvent(msgspec.Struct, kw_only=True, tag_field="type", tag="skipped"):
    bytes: int
    offsets: Offsets


ExitEvent = msgspec.defstruct(
    "ExitEvent", [_member(f) for f in msgspec.structs.fields(Exit)],
    kw_only=True, tag_field="type", tag="exit", omit_defaults=True)

StreamEvent = AttachedEvent | OutputEvent | SkippedEvent | ExitEvent
