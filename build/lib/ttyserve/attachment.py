"""A session attached to one channel of a connection: where the session's output goes.

The session writes through its attachment; the attachment asks the protocol
core to frame (which spends the channel's credit and refuses anything after
the channel's end) and has the connection send what was framed.
"""

from __future__ import annotations

from typing import Protocol

import anyio

from .protocol.channels import ChannelState
from .protocol.frames import FrameKind
from .protocol.messages import Exit
from .protocol.server import ServerConnection
from .session import Session

READ_SIZE = 1 << 20  # the most one frame carries (never above max_frame): one wake-up's output
LOST = Exit(code=-1, error="the server lost this session before it could learn its status")


class Carrier(Protocol):
    """What an attachment needs from its connection."""

    core: ServerConnection

    def flush_nowait(self) -> None:
        """Hand what the core framed to the writer without waiting."""
        ...

    async def flush(self) -> None:
        """Hand it over, then wait while the connection's send queue is full."""
        ...

    def detach(self, attachment: Attachment) -> None:
        """The session is over: forget the attachment."""
        ...


class Attachment:
    """The `OutputSink` of ``session`` on ``channel`` of a connection."""

    __slots__ = ("_credit", "_frame_limit", "carrier", "channel", "core", "session")

    def __init__(self, carrier: Carrier, channel: int, session: Session) -> None:
        self.carrier = carrier
        self.core = carrier.core
        self.channel = channel
        self.session = session
        self._frame_limit = min(READ_SIZE, self.core.max_frame)
        self._credit: anyio.Event | None = None  # made only when a pump has to wait

    def limit(self) -> int:
        credit = self.core.output_credit(self.channel)
        return self._frame_limit if credit is None else min(credit, self._frame_limit)

    async def wait_credit(self) -> None:
        while not self.core.output_credit(self.channel):
            credit = self._credit = self._credit or anyio.Event()
            await credit.wait()

    def credit_granted(self) -> None:
        if self._credit is not None:
            self._credit.set()
            self._credit = None

    async def send_output(self, kind: FrameKind, data: bytes) -> None:
        if self.core.send_output(self.channel, kind, data):
            await self.carrier.flush()

    async def send_exit(self, status: Exit) -> None:
        if self.core.send_exit(self.channel, status):
            self.carrier.flush_nowait()

    def stdin_consumed(self, size: int) -> None:
        self.core.stdin_consumed(self.channel, size)
        if self.core.pending:
            self.carrier.flush_nowait()

    def ended(self) -> None:
        # A session that ended without its exit (a server fault) still ends its channel.
        if self.core.channels.state(self.channel) is ChannelState.OPEN:
            self.core.send_exit(self.channel, LOST)
            self.carrier.flush_nowait()
        self.carrier.detach(self)
