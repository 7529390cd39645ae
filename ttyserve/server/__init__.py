"""The server: listeners and connections, the session registry, sessions and what they keep
(scrollback, recordings, the journal), and who may do what (auth, policy, settings)."""

from .listener import Server
from .settings import ServerSettings

__all__ = ["Server", "ServerSettings"]
