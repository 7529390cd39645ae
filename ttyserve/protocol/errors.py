"""Error codes of protocol v1 and the exceptions the core raises.

Error tree:

    ProtocolError        the peer broke the wire protocol; fatal for the connection
    RequestError         one request is refused; the connection goes on
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


RETRIABLE = frozenset({ErrorCode.BUSY, ErrorCode.SHUTTING_DOWN})


class ProtocolError(Exception):
    """The peer sent something protocol v1 forbids: the connection must close.

    ``code`` is what the server reports on channel 0 before closing.
    """

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RequestError(Exception):
    """A single request is refused with ``code``; the connection stays up."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        errno: int | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.errno = errno
        self.retry_after_ms = retry_after_ms
