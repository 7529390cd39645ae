"""A connection's checks of its client: its `hello` (the token or grant, the brake on a
peer that keeps guessing) and its heartbeat (section 10: ping a quiet client, give up a
silent one). A link from another worker comes with its client admitted there already
(`linked`: the principal, or None where its grant is checked here) and is never braked.
"""

from __future__ import annotations

import functools
import logging
import select
import time
from typing import TYPE_CHECKING

import anyio

from ...errors import RequestError
from ...protocol.heartbeat import Beat, Heartbeat
from ...protocol.server import HelloReceived
from ...version import __version__
from ..channels.route import Later
from ..registry.registry import shutting_down

if TYPE_CHECKING:
    from .handler import ConnectionHandler

log = logging.getLogger("ttyserve")

SERVER_NAME = f"ttyserve/{__version__}"


class PeerChecks:
    """One connection's admission of its client, and the heartbeat that watches it (the
    connection is handed to each call: the part holds no reference to it)."""

    __slots__ = ("_beat_scope", "_linked", "heartbeat", "link")

    def __init__(self, linked: str | bool | None = False) -> None:
        self.link = linked is not False
        self._linked = linked if isinstance(linked, str) else None
        self.heartbeat: Heartbeat | None = None  # section 10, when `hello` asked for it
        self._beat_scope: anyio.CancelScope | None = None

    def hello_received(self, handler: ConnectionHandler, event: HelloReceived) -> Later | None:
        grant = event.hello.grant
        if grant is not None and (later := handler.requests.hello_elsewhere(handler, grant)):
            return later  # the worker that made it admits it
        if not self.link and (delay := handler.gate.delay(handler.peer)):
            return functools.partial(self._hello, handler, event, delay)
        self._answer_hello(handler, event)
        return None

    async def _hello(self, handler: ConnectionHandler, event: HelloReceived,
                     delay: float) -> None:
        """A peer that keeps guessing waits longer each time (and has as long more)."""
        await handler.reader.interruptibly(anyio.sleep(delay))
        handler.reader.deadline += delay
        self._answer_hello(handler, event)

    def _answer_hello(self, handler: ConnectionHandler, event: HelloReceived) -> None:
        try:
            if event.hello.grant is not None:  # a grant stands for the token (section 11)
                handler.grant = handler.gate.admit_grant(handler.peer, event.hello.grant,
                                                         handler.registry.sharing.grants)
                handler.principal = handler.grant.owner
            elif self._linked is not None:
                handler.principal = self._linked
            else:
                handler.principal = handler.gate.admit(handler.peer, event.hello.token)
        except RequestError as exc:
            handler.core.close(exc)
            return
        if handler.registry.closing:  # (it closes before any connection drains)
            handler.core.close(shutting_down())
            return
        handler.core.accept_hello(SERVER_NAME,
                                  handler.grant.scope() if handler.grant else None)
        if (interval := event.hello.heartbeat) is not None:
            self.heartbeat = Heartbeat(interval, time.monotonic())
            handler.tasks.start_soon(self._beat, handler, self.heartbeat)

    def stop(self) -> None:
        """The connection is over: the heartbeat stops."""
        if self._beat_scope is not None:
            self._beat_scope.cancel()

    def _input_waiting(self, handler: ConnectionHandler) -> bool:
        """Whether the client's bytes wait unread because we stopped reading them (a full
        send queue, or a process that does not take its input, holds the reader back): a
        client we do not read is not a dead one."""
        if not (handler.reader.paused or not handler.outbox.has_room):
            return False
        try:
            fd = handler.transport.fileno()
            if fd < 0:
                return False
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return False

    async def _beat(self, handler: ConnectionHandler, heartbeat: Heartbeat) -> None:
        """Ping when nothing was sent for an interval; give the client up when nothing came
        for three: its sessions are let go as for any closed connection."""
        with anyio.CancelScope() as self._beat_scope:
            while not handler.over:
                now = time.monotonic()
                beat = heartbeat.check(now)
                if beat is Beat.DEAD and self._input_waiting(handler):
                    heartbeat.last_received = now  # alive: it is we who do not read it
                    continue
                if beat is Beat.DEAD:
                    log.info("%s: nothing came for %g s: the connection is dead",
                             handler.peer, heartbeat.silence_limit)
                    handler.core.close()
                    handler.outbox.abort()  # nothing more waits to be sent to a silent peer
                    return
                if beat is Beat.PING:
                    handler.core.ping()
                    handler.flush()
                    heartbeat.last_sent = now
                await anyio.sleep(heartbeat.next_check() - now)
