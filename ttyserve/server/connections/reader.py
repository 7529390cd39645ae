"""How a connection reads its client: from the loop's readiness callback where the
transport allows it (the keystroke path: read, act on what needs no waiting, send, with
no switch to a task), else from the connection's task; and how reading stops for the
close, woken or cut short wherever it waits, or the close done from the callback itself.

A part of the connection that owns the reading's state; the connection (`handler`) is
handed to each call, so the part holds no reference to it.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar, cast

import anyio

from ...defaults import CLOSE_TIMEOUT, SERVER_RECEIVE
from ...errors import RemoteProtocolError
from ...transport.readiness import ReadableService
from ...transport.streams import (
    PipeTransport,
    ReadsNowait,
    SocketTransport,
    TaskNeeded,
    Transport,
)
from ..channels.route import Later

if TYPE_CHECKING:
    from .handler import ConnectionHandler

log = logging.getLogger("ttyserve")

T = TypeVar("T")
GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class ClientReader:
    """One connection's reading of its client."""

    __slots__ = ("_first_read", "_service", "_socket", "_task_read", "_wait_scope",
                 "deadline", "discarding", "later", "paused", "stopped", "transport")

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        # A socket, pipe or plain WebSocket is read from the loop's readiness callback
        # after the handshake.
        self._socket: ReadsNowait | None = None
        if getattr(transport, "reads_nowait", False):
            self._socket = cast(ReadsNowait, transport)
        self._service = ReadableService()  # the wait there, which `stop` ends
        self.stopped = False  # the reader is to stop: the connection closes
        self.discarding = False  # closed from the readiness callback: it drains the client
        self._wait_scope: anyio.CancelScope | None = None  # a wait `stop` cuts short
        self._first_read = True
        self._task_read = False  # the callback met what only the task's `receive` can do
        self.deadline = math.inf  # the handshake's, while it lasts
        self.paused = False  # it waits for something of ours, not for the client
        self.later: Later | None = None  # what the readiness callback left the task

    async def run(self, handler: ConnectionHandler) -> None:
        """Read, feed the core, act, until the connection is to close."""
        core = handler.core
        while not (core.closing or self.stopped or anyio.current_time() >= self.deadline):
            try:
                data = await self._receive(handler)
            except GONE:
                return
            except RemoteProtocolError as exc:  # the carriage was misused
                log.info("%s: %s: %s", handler.peer, exc.code, exc.message)
                core.close(exc)
                return
            if data is not None:
                if (heartbeat := handler.checks.heartbeat) is not None:
                    heartbeat.last_received = time.monotonic()
                core.receive_data(data)
            self.paused = True
            try:
                if (later := self.later) is not None:
                    self.later = None
                    await later()
                while (event := core.next_event()) is not None:
                    if (later := handler.act(event)) is not None:
                        await later()
            except RemoteProtocolError as exc:
                log.info("%s: %s: %s", handler.peer, exc.code, exc.message)
            if core.handshake_done:
                self.deadline = math.inf
            handler.flush()
            await handler.outbox.wait_for_room()
            self.paused = False

    async def _receive(self, handler: ConnectionHandler) -> bytes | None:
        """The client's next bytes; None when the readiness callback read them and left this
        task the part that has to wait (`later`, a full send queue, the close)."""
        socket = self._socket
        if socket is not None and not self._task_read:
            try:  # the client's hello (and open) are usually here already
                if self._first_read or socket.pending:
                    self._first_read = False
                    if (data := socket.receive_nowait(SERVER_RECEIVE)) is not None:
                        return data
            except TaskNeeded:
                self._task_read = True
            else:
                readable = functools.partial(self._readable, handler)
                if not await self._service.serve(socket.fileno(), readable, self.deadline):
                    self._socket = None  # no readiness callbacks on this loop: the ordinary way
                elif not self._task_read:
                    return None
        if self._task_read:
            self._task_read = False
        return await self.interruptibly(self.transport.receive(SERVER_RECEIVE), self.deadline)

    def _readable(self, handler: ConnectionHandler) -> bool:
        """The keystroke path, run by the event loop when the socket is readable: read, act
        on what needs no waiting, send what that framed; False to wake the reader task for
        the rest. What reading raises is raised in the task, as `receive` would."""
        core, socket = handler.core, self._socket
        assert socket is not None
        if self.discarding:  # closed: what the client still sends is dropped until its EOF
            try:
                socket.receive_nowait(SERVER_RECEIVE)
            except GONE:
                return False
            return True
        if core.closing or self.stopped:
            return False
        try:
            data = socket.receive_nowait(SERVER_RECEIVE)
        except TaskNeeded:
            self._task_read = True
            return False
        if data is None:
            return True
        if (heartbeat := handler.checks.heartbeat) is not None:
            heartbeat.last_received = time.monotonic()
        core.receive_data(data)
        try:
            while (event := core.next_event()) is not None:
                if (later := handler.act(event)) is not None:
                    self.later = later
                    break
        except RemoteProtocolError as exc:
            log.info("%s: %s: %s", handler.peer, exc.code, exc.message)
        except Exception as exc:  # a fault: raised in the task, as if it had acted
            self.later = functools.partial(_raise, exc)
        handler.flush()
        if self.discarding:  # closed by what it just read: this callback drains the client
            self.later = None
            return True
        return (self.later is None and not core.closing and not self.stopped
                and handler.outbox.has_room and not socket.pending)

    def stop(self, handler: ConnectionHandler) -> None:
        """The connection is to close: the reader stops, woken where it waits for the client
        (the common case, and no cancellation), or cut short where it waits for anything
        else. Where it waits in the readiness callback and nothing is left to send, the
        close is done there and then, and the same callback drains the client."""
        self.stopped = True
        if self._close_in_callback(handler):
            return
        if not self._service.wake() and self._wait_scope is not None:
            self._wait_scope.cancel()

    def _close_in_callback(self, handler: ConnectionHandler) -> bool:
        """The close (`run`'s, after the reader), from the socket's readiness callback: our
        EOF, then the client's bytes dropped until its EOF (or CLOSE_TIMEOUT), with no hop
        to the task and no second watch of the socket; False where it cannot be done so."""
        socket = self._socket
        if (not isinstance(socket, SocketTransport | PipeTransport) or not self._service.serving
                or handler.outbox.broken or not handler.outbox.idle):
            return False  # (a WebSocket's close is a message: the task sends it)
        handler.end_channels()
        if not handler.outbox.idle:
            return False  # what the core framed last waits to be sent: the task does the rest
        handler.outbox.close()
        try:
            socket.send_eof_nowait()
        except anyio.BrokenResourceError:
            return False
        self.discarding = True
        self._service.end_by(anyio.current_time() + CLOSE_TIMEOUT)
        return True

    async def interruptibly(self, wait: Awaitable[T], deadline: float = math.inf) -> T | None:
        """``wait``, unless `stop` or ``deadline`` cuts it short (then None)."""
        with anyio.CancelScope(deadline=deadline) as self._wait_scope:
            if self.stopped:
                self._wait_scope.cancel()
            try:
                return await wait
            finally:
                self._wait_scope = None
        return None


async def _raise(exc: BaseException) -> None:
    raise exc
