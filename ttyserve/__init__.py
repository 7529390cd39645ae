"""ttyserve: run processes under a PTY or pipes and serve them over a framed byte stream."""

from __future__ import annotations

__version__ = "0.1.0"

from .client import CompletedSession, Connection, OutputChunk, Session, connect, run
from .protocol.messages import Exit

ExitStatus = Exit

__all__ = [
    "CompletedSession",
    "Connection",
    "Exit",
    "ExitStatus",
    "OutputChunk",
    "Session",
    "__version__",
    "connect",
    "run",
]
