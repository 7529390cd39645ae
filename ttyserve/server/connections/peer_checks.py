"""A connection's checks of its client: its `hello` (the token or grant, the brake on a
peer that keeps guessing) and its heartbeat (section 10: ping a quiet client, give up a
silent one).

A part of `ConnectionHandler` (handler.py), apart for size: a mixin with no state of its
own.
"""

from __future__ import annotations

import functools
import logging
import select
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

import anyio

from ...errors import RequestError
from ...protocol.heartbeat import Beat, Heartbeat
from ...protocol.server import HelloReceived, ServerConnection
from ...transport.outbox import Outbox, TaskStarter
from ...transport.streams import Transport
from ...version import __version__
from ..auth import Gate, Peer
from ..grants import Grant
from ..registry.registry import SessionRegistry, shutting_down
from .waits import Later

log = logging.getLogger("ttyserve")

SERVER_NAME = f"ttyserve/{__version__}"
T = TypeVar("T")


class PeerChecks:
    """The handler's admission and heartbeat of its client."""

    core: ServerConnection
    outbox: Outbox
    transport: Transport
    peer: Peer
    gate: Gate
    registry: SessionRegistry
    principal: str
    grant: Grant | None
    _deadline: float
    _heartbeat: Heartbeat | None
    _tasks: TaskStarter
    _beat_scope: anyio.CancelScope | None
    _over: bool
    _paused: bool
    _linked: str | None = None  # a link from another worker: whom it admitted the client as
    link = False  # a link from another worker (mesh.py): it throttled the client already

    if TYPE_CHECKING:  # the handler's own
        def flush(self) -> None: ...
        def remote_hello(self, grant: str, slot: int) -> Later: ...
        async def _interruptibly(self, wait: Awaitable[T]) -> T | None: ...

    def hello_received(self, event: HelloReceived) -> Later | None:
        grant, mesh = event.hello.grant, self.registry.mesh
        if grant is not None and mesh is not None and not self.link and (
                slot := mesh.elsewhere(grant)) is not None:
            return self.remote_hello(grant, slot)  # the worker that made it admits it
        if not self.link and (delay := self.gate.delay(self.peer)):
            return functools.partial(self._hello, event, delay)
        self._answer_hello(event)
        return None

    async def _hello(self, event: HelloReceived, delay: float) -> None:
        """A peer that keeps guessing waits longer each time (and has as long more)."""
        await self._interruptibly(anyio.sleep(delay))
        self._deadline += delay
        self._answer_hello(event)

    def _answer_hello(self, event: HelloReceived) -> None:
        try:
            if event.hello.grant is not None:  # a grant stands for the token (section 11)
                self.grant = self.gate.admit_grant(self.peer, event.hello.grant,
                                                   self.registry.grants)
                self.principal = self.grant.owner
            elif self._linked is not None:
                self.principal = self._linked
            else:
                self.principal = self.gate.admit(self.peer, event.hello.token)
        except RequestError as exc:
            self.core.close(exc)
            return
        if self.registry.closing:  # (it closes before any connection drains)
            self.core.close(shutting_down())
            return
        self.core.accept_hello(SERVER_NAME, self.grant.scope() if self.grant else None)
        if (interval := event.hello.heartbeat) is not None:
            self._heartbeat = Heartbeat(interval, time.monotonic())
            self._tasks.start_soon(self._beat, self._heartbeat)

    def _input_waiting(self) -> bool:
        """Whether the client's bytes wait unread because we stopped reading them (a full
        send queue, or a process that does not take its input, holds the reader back): a
        client we do not read is not a dead one."""
        if not (self._paused or not self.outbox.has_room):
            return False
        try:
            fd = self.transport.fileno()
            if fd < 0:
                return False
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return False

    async def _beat(self, heartbeat: Heartbeat) -> None:
        """Ping when nothing was sent for an interval; give the client up when nothing came
        for three: its sessions are let go as for any closed connection."""
        with anyio.CancelScope() as self._beat_scope:
            while not self._over:
                now = time.monotonic()
                beat = heartbeat.check(now)
                if beat is Beat.DEAD and self._input_waiting():
                    heartbeat.last_received = now  # alive: it is we who do not read it
                    continue
                if beat is Beat.DEAD:
                    log.info("%s: nothing came for %g s: the connection is dead", self.peer,
                             heartbeat.silence_limit)
                    self.core.close()
                    self.outbox.abort()  # nothing more waits to be sent to a silent peer
                    return
                if beat is Beat.PING:
                    self.core.ping()
                    self.flush()
                    heartbeat.last_sent = now
                await anyio.sleep(heartbeat.next_check() - now)
