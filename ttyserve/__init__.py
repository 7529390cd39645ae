"""ttyserve: run processes under a PTY or pipes and serve them over a framed byte stream."""

from __future__ import annotations

from .client import CompletedSession, Connection, OutputChunk, Session, connect, run
from .errors import (
    AddressError,
    ConfigError,
    ConnectionLost,
    ErrorCode,
    LeaseError,
    ListenError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
    SessionCancelled,
    SessionDetached,
    SpawnError,
    TtyserveError,
    UsageError,
)
from .protocol.messages import Exit
from .version import __version__

ExitStatus = Exit

__all__ = [
    "AddressError",
    "CompletedSession",
    "ConfigError",
    "Connection",
    "ConnectionLost",
    "ErrorCode",
    "Exit",
    "ExitStatus",
    "LeaseError",
    "ListenError",
    "LocalProtocolError",
    "OutputChunk",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestError",
    "Session",
    "SessionCancelled",
    "SessionDetached",
    "SpawnError",
    "TtyserveError",
    "UsageError",
    "__version__",
    "connect",
    "run",
]
