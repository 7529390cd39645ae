"""ttyserve: run processes under a PTY or pipes and serve them over a framed byte stream."""

from __future__ import annotations

__version__ = "0.1.0"

from .client import CompletedSession, Connection, OutputChunk, Session, connect, run
from .errors import (
    AddressError,
    ConfigError,
    ConnectionLost,
    LeaseError,
    ListenError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
    SessionCancelled,
    SpawnError,
    TtyserveError,
    UsageError,
)
from .protocol.codes import ErrorCode
from .protocol.messages import Exit

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
    "SpawnError",
    "TtyserveError",
    "UsageError",
    "__version__",
    "connect",
    "run",
]
