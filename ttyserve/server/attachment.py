"""A session attached to one channel of a connection: where the session's output goes.

The session writes through its attachment; the attachment asks the protocol
core to frame (which spends the channel's credit and refuses anything after
the channel's end) and has the connection send what was framed. An attachment
made by `attach` first replays the session's scrollback, and goes live only
then: the session's pumps wait meanwhile, so the replay and the live output
meet with no gap and no duplicate.
"""

from __future__ import annotations

from typing import Protocol

import anyio

from ..protocol.channels import ChannelState
from ..protocol.frames import FrameKind
from ..protocol.messages import Exit
from ..protocol.server import ServerConnection
from .session import READ_SIZE, ServerSession

LOST = Exit(code=-1, error="the server lost this session before it could learn its status")


class AttachmentHost(Protocol):
    """What an attachment needs from its connection."""

    core: ServerConnection

    def flush_nowait(self) -> None:
        """Hand what the core framed to the writer without waiting."""
        ...

    async def flush(self) -> None:
        """Hand it over, then wait while the connection's send queue is full."""
        ...

    @property
    def has_room(self) -> bool:
        """Whether the connection's send queue has room (`flush` would not wait)."""
        ...

    def detach(self, attachment: Attachment) -> None:
        """The attachment no longer carries its session: forget it."""
        ...


class Attachment:
    """The `OutputSink` of ``session`` on ``channel`` of a connection."""

    def __init__(self, host: AttachmentHost, channel: int, session: ServerSession,
                 replay: list[tuple[FrameKind, bytes]] | None = None) -> None:
        self.host = host
        self.core = host.core
        self.channel = channel
        self.session = session
        self._frame_limit = min(READ_SIZE, self.core.max_frame)
        self._replay = replay
        self.live = replay is None  # output goes out as it comes (after any replay)
        self.released = False
        self._wake: anyio.Event | None = None  # made only when someone has to wait
        self._waiting_rooms: list[anyio.CancelScope] = []  # pumps waiting for room to send

    # --- the session's sink ----------------------------------------------------

    def limit(self) -> int:
        if not self.live:
            return 0  # the scrollback goes first
        credit = self.core.output_credit(self.channel)
        return self._frame_limit if credit is None else min(credit, self._frame_limit)

    async def wait_credit(self) -> None:
        while not self.released and not self.limit():
            await self._wait()

    def send_output(self, kind: FrameKind, data: bytes) -> None:
        if self.core.send_output(self.channel, kind, data):
            self.host.flush_nowait()

    @property
    def has_room(self) -> bool:
        return self.host.has_room

    async def wait_room(self) -> None:
        if self.released:
            return
        with anyio.CancelScope() as scope:  # a slow client: wait, unless the session leaves us
            self._waiting_rooms.append(scope)
            try:
                await self.host.flush()
            finally:
                self._waiting_rooms.remove(scope)

    async def send_exit(self, status: Exit) -> bool:
        while not self.live and not self.released:
            await self._wait()
        if self.released:
            return False
        if self.core.send_exit(self.channel, status):
            self.host.flush_nowait()
            return True
        while not self.released:  # the connection is going: it detaches or cancels us
            await self._wait()
        return False

    def stdin_consumed(self, size: int) -> None:
        self.core.stdin_consumed(self.channel, size)
        if self.core.pending:
            self.host.flush_nowait()

    def release(self, reason: str | None = None) -> None:
        """The session goes on without this channel: its last frame is `detached`."""
        if self.released:
            return
        if self.core.send_detached(self.channel, reason):
            self.host.flush_nowait()
        self._let_go()

    def ended(self) -> None:
        # A session that ended without its exit (a server fault) still ends its channel.
        if not self.released and self.core.channels.state(self.channel) is ChannelState.OPEN:
            self.core.send_exit(self.channel, LOST)
            self.host.flush_nowait()
        self._let_go()

    def _let_go(self) -> None:
        """Nothing more goes out here: forget us, and wake (or cut short) what waits on us."""
        self.released = True
        for scope in self._waiting_rooms:
            scope.cancel()  # a pump must not stay behind a client that left
        self.host.detach(self)
        self._notify()

    # --- the connection's side ---------------------------------------------------

    def credit_granted(self) -> None:
        self._notify()

    async def replay(self) -> None:
        """Send the scrollback as it was at attach, within the channel's credit; then go
        live (and deliver the exit of a session that ended while detached)."""
        for kind, data in self._replay or ():
            view = memoryview(data)
            while view:
                credit = self.core.output_credit(self.channel)
                if credit == 0:
                    if self.released:
                        return
                    await self._wait()
                    continue
                size = min(len(view), self._frame_limit, credit or self._frame_limit)
                if not self.core.send_output(self.channel, kind, view[:size]):
                    return  # the channel ended meanwhile
                await self.host.flush()
                view = view[size:]
        self._replay = None
        self.live = True
        self._notify()
        status = self.session.pending_exit
        if status is not None and await self.send_exit(status):
            self.session.exit_delivered()
            self._let_go()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def _wait(self) -> None:
        wake = self._wake = self._wake or anyio.Event()
        await wake.wait()
