"""The client library on anyio: `connect` and `run` (api.py), a connection and its sessions
(connection.py, its links in wire.py, their resume in resume.py, session.py); carriers,
retries and fan-out over many targets.

Names load on first use, so that a module of this package (`retry`, say) can be imported by
`exec`'s loop-free path without the library behind it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .api import CompletedSession, client_tls_context, connect, run
    from .connection import Connection
    from .session import OutputChunk, Session

__all__ = [
    "CompletedSession", "Connection", "OutputChunk", "Session", "client_tls_context", "connect",
    "run",
]
_LAZY = {"CompletedSession": "api", "client_tls_context": "api", "connect": "api", "run": "api",
         "Connection": "connection", "OutputChunk": "session", "Session": "session"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
