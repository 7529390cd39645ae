"""What a server is told (its defaults are in defaults.py).

`config.py` reads these from flags, environment and TOML; tests and embedding
programs build `ServerSettings` directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..defaults import (
    DEFAULT_DETACHED_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_LINGER,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SESSIONS_PER_CONNECTION,
    DEFAULT_SCROLLBACK,
    DEFAULT_SHUTDOWN_TIMEOUT,
)
from ..protocol.frames import DEFAULT_MAX_FRAME
from ..protocol.server import DEFAULT_STDIN_WINDOW
from .auth import Access
from .policy import Policy

__all__ = ["DEFAULT_MAX_FRAME", "DEFAULT_STDIN_WINDOW", "ServerSettings"]


@dataclass
class ServerSettings:
    """Everything one server and its connections share, read-only while serving."""

    default_argv: list[str]
    default_cwd: str | None = None
    linger: float = DEFAULT_LINGER
    max_frame: int = DEFAULT_MAX_FRAME
    stdin_window: int = DEFAULT_STDIN_WINDOW
    access: Access = field(default_factory=Access)
    policy: Policy = field(default_factory=Policy)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_sessions_per_connection: int = DEFAULT_MAX_SESSIONS_PER_CONNECTION
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    allowed_origins: frozenset[str] = frozenset()  # besides a web listener's own (section 8)
    scrollback: int = DEFAULT_SCROLLBACK
    detached_timeout: float = DEFAULT_DETACHED_TIMEOUT
    record_dir: str | None = None  # asciicast v3 files of PTY sessions, when set
    record_input: bool = False
    keeps_detached: bool = True  # False for `serve --stdio`: nothing outlives its connection
