"""What a client session asks of its connection (connection.py): frames on the session's
channel, which a resume (section 10) moves to a new link."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..protocol.messages import Message
    from .session import Session


class Link(Protocol):
    """What a session asks of its connection: frames on the session's channel (which a
    resume changes)."""

    def stdin_limit(self, session: Session) -> int:
        """The most the next STDIN frame may carry; 0 to wait for credit, for a resume, or
        because the channel has ended."""
        ...

    def live(self, session: Session) -> bool:
        """Whether the channel has not ended on either side (a resuming session is live)."""
        ...

    async def send_stdin(self, session: Session, data: bytes) -> bool:
        """Send one STDIN frame (within `stdin_limit`); False when it was not sent because the
        link changed meanwhile. Raises ConnectionLost (or what ended the connection)."""
        ...

    async def send_control(self, session: Session, message: Message) -> None:
        """Send `resize`, `signal`, `eof` or `detach` on the channel."""
        ...

    async def cancel(self, session: Session) -> None:
        """End the channel here (`cancel`): nothing more is delivered for it."""
        ...

    async def consumed(self, session: Session, size: int) -> None:
        """The application took ``size`` bytes of output: grant them back when due."""
        ...
