"""The client library on anyio: a connection, its sessions, `connect` and `run`; carriers,
retries and fan-out over many targets.

Names load on first use, so that a module of this package (`retry`, say) can be imported by
`exec`'s loop-free path without the library behind it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import (
        CompletedSession,
        Connection,
        OutputChunk,
        Session,
        client_tls_context,
        connect,
        run,
    )

__all__ = [
    "CompletedSession", "Connection", "OutputChunk", "Session", "client_tls_context", "connect",
    "run",
]
_LAZY = dict.fromkeys(__all__, "connection")


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)

