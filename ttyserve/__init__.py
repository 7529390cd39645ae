"""ttyserve: run processes under a PTY or pipes and serve them over a framed byte stream.

The client library's names load on first use, so that `ttyserve serve` (and the `serve
--stdio` a carrier starts on every target) does not pay for them.
"""

from __future__ import annotations

from .version import __version__

TYPE_CHECKING = False  # (typing's costs its import; mypy reads any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from .client import CompletedSession, Connection, OutputChunk, Session, connect, run
    from .client.fanout import TargetResult, fan_out, run_many
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

    ExitStatus = Exit

_ERRORS = ("AddressError", "CarrierError", "CarrierFailure", "ConfigError", "ConnectionLost",
           "ErrorCode", "LeaseError", "ListenError", "LocalProtocolError", "OutOfResources",
           "ProtocolError", "RemoteProtocolError", "RequestError", "SessionCancelled",
           "SessionDetached", "SpawnError", "TtyserveError", "UsageError")
_LAZY = {
    **dict.fromkeys(_ERRORS, ("errors", None)),
    "Exit": ("protocol.messages", None), "ExitStatus": ("protocol.messages", "Exit"),
    **{name: ("client", None) for name in ("CompletedSession", "Connection", "OutputChunk",
                                          "Session", "connect", "run")},
    **{name: ("client.fanout", None) for name in ("TargetResult", "fan_out", "run_many")},
}


def __getattr__(name: str) -> object:
    """Every name but the version loads on first use: a carrier's far side (`serve --stdio`)
    and `exec` start without the modules they do not need."""
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module 'ttyserve' has no attribute {name!r}")
    module, attribute = found
    import importlib  # (here: its import is a tenth of a stub's start)

    return getattr(importlib.import_module(f".{module}", __name__), attribute or name)


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
