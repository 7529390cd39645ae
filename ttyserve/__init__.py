"""ttyserve: run processes under a PTY or pipes and serve them over a framed byte stream.

The client library's names load on first use, so that `ttyserve serve` (and the `serve
--stdio` a carrier starts on every target) does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    AddressError,
    CarrierError,
    CarrierFailure,
    ConfigError,
    ConnectionLost,
    ErrorCode,
    LeaseError,
    ListenError,
    LocalProtocolError,
    OutOfResources,
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

if TYPE_CHECKING:
    from .client import CompletedSession, Connection, OutputChunk, Session, connect, run
    from .client.fanout import TargetResult, fan_out, run_many

ExitStatus = Exit
_LAZY = {
    "CompletedSession": "client", "Connection": "client", "OutputChunk": "client",
    "Session": "client", "connect": "client", "run": "client",
    "TargetResult": "client.fanout", "fan_out": "client.fanout", "run_many": "client.fanout",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ttyserve' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)

__all__ = [
    "AddressError",
    "CarrierError",
    "CarrierFailure",
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
    "OutOfResources",
    "OutputChunk",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestError",
    "Session",
    "SessionCancelled",
    "SessionDetached",
    "SpawnError",
    "TargetResult",
    "TtyserveError",
    "UsageError",
    "__version__",
    "connect",
    "fan_out",
    "run",
    "run_many",
]
