"""One link of a client connection: a transport with its protocol core, its one writer and
its heartbeat, read until it is lost. The first link is the one `connect` dialled; a
resume dials the others.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from ..defaults import CLIENT_RECEIVE
from ..errors import ConnectionLost, RemoteProtocolError
from ..protocol.client import ClientConnection, ClientEvent
from ..protocol.heartbeat import Beat, Heartbeat
from ..transport.outbox import Outbox
from ..transport.streams import Transport

if TYPE_CHECKING:
    from ..backends.carrier import Carrier

FIRST_BYTES_SHOWN = 60
WELCOME_WAIT = 60.0  # seconds a link may take to its `welcome` (an ssh asking a password)


@dataclass(eq=False)
class Wire:
    """One transport under the connection: the first, or one a resume dialled."""

    transport: Transport
    carrier: Carrier | None
    heartbeat: Heartbeat | None = None
    core: ClientConnection = field(default_factory=ClientConnection)
    outbox: Outbox = field(init=False)
    failure: Exception | None = None  # why it ended, where that was decided here
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # the reader's
    delivering: bool = False  # the reader waits for a session to take output, not for bytes
    ended: anyio.Event = field(default_factory=anyio.Event)  # its reader is done with it
    started: float = field(default_factory=time.monotonic)
    first_bytes: bytes = b""  # what the server sent first: shown if it is not the protocol

    def __post_init__(self) -> None:
        self.outbox = Outbox(self.transport, on_broken=self._send_failed)

    # --- the writer ------------------------------------------------------------------

    def push_or_raise(self, *frames: bytes) -> None:
        """Send ``frames`` with no waiting; raises anyio.BrokenResourceError once broken."""
        if (heartbeat := self.heartbeat) is not None:
            heartbeat.last_sent = time.monotonic()
        self.outbox.push(frames)

    def push(self, *frames: bytes) -> None:
        """Send ``frames`` with no waiting (from where nothing can wait: a cancel, the
        reader); a broken link drops them."""
        with contextlib.suppress(anyio.BrokenResourceError):
            self.push_or_raise(*frames)

    def early_carrier_end(self) -> bool:
        """Whether a break now is a carrier's before `welcome`: the read loop sees its stdout
        close and fails the link with its class (a send that broke first must not say
        less)."""
        return self.carrier is not None and self.core.welcome is None

    def _send_failed(self) -> None:
        """The reader goes on: what the server sent before the break is still delivered."""
        if not self.early_carrier_end() and self.failure is None:
            self.failure = ConnectionLost("send failed: the connection broke")

    # --- the reader ------------------------------------------------------------------

    async def read(self, dispatch: Callable[[Wire, ClientEvent], Awaitable[None]]
                   ) -> Exception:
        """Read until the link ends, handing each event to ``dispatch`` as it comes: why it
        ended (the heartbeat may cut it short)."""
        try:
            with self.scope:
                return await self._read_until_lost(dispatch)
            return self.failure or ConnectionLost("the connection was given up")
        finally:
            self.ended.set()

    async def _read_until_lost(self, dispatch: Callable[[Wire, ClientEvent], Awaitable[None]]
                               ) -> Exception:
        core = self.core
        try:
            while True:
                try:
                    data = await self.transport.receive(CLIENT_RECEIVE)
                except anyio.EndOfStream:
                    break
                if (heartbeat := self.heartbeat) is not None:
                    heartbeat.last_received = time.monotonic()
                if not self.first_bytes:
                    self.first_bytes = data[:FIRST_BYTES_SHOWN]
                core.receive_data(data)
                self.delivering = True
                while (event := core.next_event()) is not None:
                    await dispatch(self, event)
                self.delivering = False
            return (self.failure or await self._carrier_failure()
                    or ConnectionLost("the server closed the connection"))
        except (anyio.BrokenResourceError, OSError) as exc:
            return (self.failure or await self._carrier_failure()
                    or ConnectionLost(f"connection lost: {exc}"))
        except anyio.ClosedResourceError as exc:
            return self.failure or ConnectionLost(f"connection lost: {exc}")
        except RemoteProtocolError as exc:
            if self.early_carrier_end():
                return RemoteProtocolError(
                    f"{exc.message}; the far side began with {self.first_bytes!r}, which is "
                    "not the protocol (does a shell startup file print something?)", exc.code)
            return exc

    async def _carrier_failure(self) -> Exception | None:
        """A carrier that ended before `welcome`: its class."""
        if self.early_carrier_end():
            assert self.carrier is not None
            return await self.carrier.failure()
        return None

    # --- the heartbeat ---------------------------------------------------------------

    async def beat(self, interval: float) -> None:
        """One look at the heartbeat (``interval`` seconds): a `ping` when nothing was sent
        for one, the link given up when nothing came for three (then until its reader is
        done with it); else until the next look is due."""
        heartbeat = self.heartbeat = self.heartbeat or Heartbeat(interval, time.monotonic())
        now = time.monotonic()
        beat = heartbeat.check(now)
        if beat is Beat.DEAD and (self.delivering or (
                self.core.welcome is None and now - self.started < WELCOME_WAIT)):
            # We hold the reader back, not the server; or the far side is still being
            # reached (an ssh may ask for a password): bounded by WELCOME_WAIT instead.
            heartbeat.last_received = now
        elif beat is Beat.DEAD:
            self.failure = self.failure or ConnectionLost(
                f"nothing came for {heartbeat.silence_limit:g} s (heartbeat)")
            self.scope.cancel()
            await self.ended.wait()  # the reader moved on (to the next link, or the end)
            return
        elif beat is Beat.PING:
            self.push(self.core.ping())
            heartbeat.last_sent = now
        await anyio.sleep(max(0.0, heartbeat.next_check() - time.monotonic()))
