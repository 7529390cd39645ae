"""One client connection: handshake, the channel table, one reader, one writer.

The reader feeds the sans-I/O core and dispatches its events; the writer is
the only task that writes to the stream, so frames go out whole and in order.
A session's frames reach the writer through one bounded queue, which is what
makes a slow client slow the process down instead of growing our memory.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from . import __version__
from .backends.base import Backend, ProcessSpec
from .protocol.connection import (
    CancelRequested,
    ControlReceived,
    HelloReceived,
    OpenRejected,
    OpenRequested,
    Reply,
    ServerConnection,
    ServerEvent,
    StdinReceived,
)
from .protocol.errors import ErrorCode, ProtocolError, RequestError
from .protocol.frames import DEFAULT_MAX_FRAME
from .protocol.messages import Eof, Open
from .session import DEFAULT_LINGER, Session

log = logging.getLogger("ttyserve")

READ_SIZE = 256 * 1024
WRITE_QUEUE = 16  # frames queued per connection; each is at most one read (256 KiB)
WRITE_BATCH = 256 * 1024  # queued frames joined into one send, up to this many bytes
CLOSE_TIMEOUT = 2.0  # seconds to flush, send EOF and drain the client's bytes at the end
_ALWAYS = 0  # writer-queue key for frames that are never dropped (channel 0, errors)
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


@dataclass
class ServerSettings:
    """What every connection of one server shares."""

    default_argv: list[str]
    linger: float = DEFAULT_LINGER
    max_frame: int = DEFAULT_MAX_FRAME
    default_cwd: str | None = None


@dataclass
class ServerState:
    """Live state the server and its connections share."""

    settings: ServerSettings
    backend: Backend
    shutting_down: bool = False
    handlers: set[ConnectionHandler] = field(default_factory=set)
    handlers_changed: anyio.Event = field(default_factory=anyio.Event)

    def remove_handler(self, handler: ConnectionHandler) -> None:
        self.handlers.discard(handler)
        self.handlers_changed.set()
        self.handlers_changed = anyio.Event()


class ConnectionHandler:
    """Serves one connection from `hello` to close."""

    def __init__(self, stream: anyio.abc.ByteStream, state: ServerState, peer: str) -> None:
        self.stream = stream
        self.state = state
        self.peer = peer
        self.core = ServerConnection(state.settings.max_frame)
        self.sessions: dict[int, Session] = {}
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._dropped: set[int] = set()
        self._multiplex = False
        self._sessions_started = 0
        self._out_send: MemoryObjectSendStream[tuple[int, bytes]]
        self._out_receive: MemoryObjectReceiveStream[tuple[int, bytes]]
        self._out_send, self._out_receive = anyio.create_memory_object_stream[tuple[int, bytes]](
            WRITE_QUEUE
        )
        self._read_scope = anyio.CancelScope()
        self._writer_done = anyio.Event()
        self._broken = False
        self._draining = False
        self._session_group: anyio.abc.TaskGroup | None = None

    # --- lifecycle ---------------------------------------------------------

    async def run(self) -> None:
        """Serve until the client leaves, breaks the protocol, or the session ends."""
        self.state.handlers.add(self)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._write_loop)
                async with anyio.create_task_group() as self._session_group:
                    with self._read_scope:
                        await self._read_loop()
                    self._session_group.cancel_scope.cancel()
                with anyio.move_on_after(CLOSE_TIMEOUT):
                    await self._flush_core()
                self._out_send.close()
                with anyio.move_on_after(CLOSE_TIMEOUT):
                    await self._writer_done.wait()
                tg.cancel_scope.cancel()
            if not self._broken:
                await self._close_gracefully()
        finally:
            self.state.remove_handler(self)
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()

    def begin_shutdown(self) -> None:
        """Graceful shutdown: hang up every session; close once none is left."""
        self._draining = True
        for session in self.sessions.values():
            session.process.hang_up()
        if not self.sessions:
            if self.core.hello is not None:
                self.core.reject(0, RequestError(
                    ErrorCode.SHUTTING_DOWN, "the server is shutting down"))
            self._read_scope.cancel()

    async def _close_gracefully(self) -> None:
        """Our EOF first, then drain theirs: closing on unread bytes would reset the
        connection and could destroy the last frames the client has not read yet."""
        with anyio.move_on_after(CLOSE_TIMEOUT):
            try:
                await self.stream.send_eof()
                while True:
                    await self.stream.receive(READ_SIZE)
            except _GONE:
                pass

    # --- writer ------------------------------------------------------------

    async def _send_frame(self, channel: int, frame: bytes) -> None:
        try:
            await self._out_send.send((channel, frame))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            await anyio.sleep_forever()  # the connection is being torn down around us

    async def _flush_core(self) -> None:
        data = self.core.data_to_send()
        if data:
            await self._send_frame(_ALWAYS, data)

    async def _write_loop(self) -> None:
        receive = self._out_receive
        try:
            async with receive:
                async for channel, frame in receive:
                    if channel in self._dropped:
                        continue
                    batch = [frame]
                    size = len(frame)
                    while size < WRITE_BATCH:
                        try:
                            channel, frame = receive.receive_nowait()
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                        if channel not in self._dropped:
                            batch.append(frame)
                            size += len(frame)
                    await self.stream.send(batch[0] if len(batch) == 1 else b"".join(batch))
        except _GONE:
            self._broken = True
            self._read_scope.cancel()
        finally:
            self._writer_done.set()

    # --- reader ------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self.stream.receive(READ_SIZE)
            except _GONE:
                return
            try:
                events = self.core.receive_data(data)
            except ProtocolError as exc:
                log.info("%s: %s: %s", self.peer, exc.code, exc.message)
                self.core.reject(0, exc)
                await self._flush_core()
                return
            for event in events:
                if not await self._handle(event):
                    await self._flush_core()
                    return
            await self._flush_core()

    async def _handle(self, event: ServerEvent) -> bool:
        """Act on one event; False ends the connection."""
        if isinstance(event, StdinReceived):
            session = self.sessions.get(event.channel)
            if session is not None:
                try:
                    await session.feed_stdin(event.data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
        elif isinstance(event, ControlReceived):
            session = self.sessions.get(event.channel)
            if session is not None:
                try:
                    if isinstance(event.message, Eof):
                        await session.feed_eof()
                    else:
                        session.control(event.message)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
        elif isinstance(event, HelloReceived):
            if self.state.shutting_down:
                self.core.reject(0, RequestError(
                    ErrorCode.SHUTTING_DOWN, "the server is shutting down"))
                return False
            self._multiplex = event.hello.multiplex
            await self._send_frame(_ALWAYS, self.core.welcome(f"ttyserve/{__version__}"))
        elif isinstance(event, OpenRequested):
            return await self._open(event.channel, event.request)
        elif isinstance(event, CancelRequested):
            self._dropped.add(event.channel)
            scope = self._scopes.get(event.channel)
            if scope is not None:
                scope.cancel()
        elif isinstance(event, Reply):
            await self._send_frame(_ALWAYS, event.data)
        elif isinstance(event, OpenRejected):
            return self._multiplex or self._sessions_started > 0
        return True

    async def _open(self, channel: int, request: Open) -> bool:
        if not self._multiplex and self._sessions_started:
            self.core.reject(channel, RequestError(
                ErrorCode.BAD_REQUEST,
                "this connection carries one session (hello.multiplex is false)"))
            return True
        if self.state.shutting_down or self._draining:
            self.core.reject(channel, RequestError(
                ErrorCode.SHUTTING_DOWN, "the server is shutting down"))
            return self._multiplex
        settings = self.state.settings
        spec = ProcessSpec(
            argv=list(request.argv) or list(settings.default_argv),
            pty=request.pty, rows=request.rows, cols=request.cols, term=request.term,
            env=dict(request.env), cwd=request.cwd or settings.default_cwd,
        )
        try:
            process = await self.state.backend.spawn(spec)
        except OSError as exc:
            code = exc.errno or errno.EIO
            log.info("%s: channel %d: spawn failed: %s", self.peer, channel, exc)
            self.core.reject(channel, RequestError(
                ErrorCode.SPAWN_FAILED, str(exc.strerror or exc), errno=code))
            return self._multiplex
        self._sessions_started += 1
        session = Session(channel, process, self._send_frame, self.core.exit, settings.linger)
        self.sessions[channel] = session
        await self._send_frame(_ALWAYS, self.core.opened(channel, process.pid))
        assert self._session_group is not None
        self._session_group.start_soon(self._run_session, session)
        return True

    async def _run_session(self, session: Session) -> None:
        channel = session.channel
        with anyio.CancelScope() as scope:
            self._scopes[channel] = scope
            try:
                await session.run()
            finally:
                del self.sessions[channel]
                del self._scopes[channel]
        if not self._multiplex or (self._draining and not self.sessions):
            self._read_scope.cancel()
