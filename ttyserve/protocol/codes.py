"""The error codes of protocol v1 (section 6): the `code` member of an `error` message."""

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


RETRIABLE = frozenset({ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN})
