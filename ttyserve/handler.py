"""One client connection: handshake, the channel table, one reader, one writer.

The reader feeds the sans-I/O core and dispatches its events; the writer is
the only task that writes to the stream, so frames go out whole and in order.
A session's frames reach the writer through one bounded queue, which is what
makes a slow client slow the process down instead of growing our memory.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

import anyio
import anyio.abc

from . import __version__
from .auth import AuthThrottle, Peer, token_matches
from .backends.base import Backend, ProcessSpec
from .errors import RemoteProtocolError as ProtocolError
from .errors import RequestError
from .journal import Journal, Reason, new_session_id
from .outbox import Outbox
from .policy import Policy
from .protocol.codes import ErrorCode
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
from .protocol.frames import DEFAULT_MAX_FRAME
from .protocol.messages import Eof, Exit, Hello, Open
from .session import DEFAULT_LINGER, Session
from .transport import Transport

log = logging.getLogger("ttyserve")

READ_SIZE = 256 * 1024
CLOSE_TIMEOUT = 2.0  # seconds to flush, send EOF and drain the client's bytes at the end
BUSY_RETRY_MS = 1000  # the hint sent with `busy`
_ALWAYS = 0  # outbox key for frames that are never dropped (channel 0, errors)
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


@dataclass
class ServerSettings:
    """What every connection of one server shares."""

    default_argv: list[str]
    linger: float = DEFAULT_LINGER
    max_frame: int = DEFAULT_MAX_FRAME
    default_cwd: str | None = None
    token: str | None = None  # required from TCP and TLS peers when set
    allowed_uids: frozenset[int] = frozenset()  # Unix peers besides our own uid
    policy: Policy = field(default_factory=Policy)
    max_sessions: int = 1024
    max_sessions_per_connection: int = 64
    handshake_timeout: float = 10.0


@dataclass
class ServerState:
    """Live state the server and its connections share."""

    settings: ServerSettings
    backend: Backend
    journal: Journal | None = None
    shutting_down: bool = False
    sessions: int = 0
    handlers: set[ConnectionHandler] = field(default_factory=set)
    handlers_changed: anyio.Event = field(default_factory=anyio.Event)
    throttle: AuthThrottle = field(default_factory=AuthThrottle)

    def remove_handler(self, handler: ConnectionHandler) -> None:
        self.handlers.discard(handler)
        self.handlers_changed.set()
        self.handlers_changed = anyio.Event()


def busy(message: str) -> RequestError:
    return RequestError(ErrorCode.BUSY, message, retry_after_ms=BUSY_RETRY_MS)


def shutting_down() -> RequestError:
    return RequestError(ErrorCode.SHUTTING_DOWN, "the server is shutting down",
                        retry_after_ms=BUSY_RETRY_MS)


class ConnectionHandler:
    """Serves one connection from `hello` to close."""

    def __init__(self, transport: Transport, state: ServerState, peer: Peer) -> None:
        self.transport = transport
        self._read_scope = anyio.CancelScope()
        self.outbox = Outbox(transport, on_broken=self._peer_gone)
        self.state = state
        self.peer = peer
        self.core = ServerConnection(state.settings.max_frame)
        self.sessions: dict[int, Session] = {}
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._multiplex = False
        self._sessions_started = 0
        self._draining = False
        self._session_group: anyio.abc.TaskGroup | None = None

    # --- lifecycle ---------------------------------------------------------

    async def run(self) -> None:
        """Serve until the client leaves, breaks the protocol, or the session ends."""
        self.state.handlers.add(self)
        try:
            async with anyio.create_task_group() as tg:
                self.outbox.attach(tg)
                async with anyio.create_task_group() as self._session_group:
                    self._read_scope.deadline = (
                        anyio.current_time() + self.state.settings.handshake_timeout)
                    with self._read_scope:
                        await self._read_loop()
                    if (self._read_scope.cancelled_caught and self._handshake_pending()
                            and anyio.current_time() >= self._read_scope.deadline):
                        log.info("%s: no hello and open in time: dropped", self.peer)
                        self.core.reject(0, ProtocolError(
                            f"no {'open' if self.core.hello else 'hello'} within "
                            f"{self.state.settings.handshake_timeout:g} s"))
                    self._session_group.cancel_scope.cancel()
                if self.core.pending and not self.outbox.broken:
                    with anyio.move_on_after(CLOSE_TIMEOUT):
                        await self._flush_core()
                self.outbox.close()
                # The session's last frames go out however slowly the client reads;
                # a client that never reads holds only its own connection.
                await self.outbox.done.wait()
                tg.cancel_scope.cancel()
            if not self.outbox.broken:
                await self._close_gracefully()
        finally:
            with anyio.CancelScope(shield=True):
                await self.transport.aclose()
            self.state.remove_handler(self)  # after the close: "no handlers" means all closed

    def _handshake_pending(self) -> bool:
        return self.core.hello is None or (not self._multiplex and not self._sessions_started
                                           and not self.core.channels)

    def _end_handshake(self) -> None:
        self._read_scope.deadline = float("inf")

    def begin_shutdown(self) -> None:
        """Graceful shutdown: hang up every session; close once none is left."""
        self._draining = True
        for session in self.sessions.values():
            session.process.hang_up()
        if not self.sessions:
            if self.core.hello is not None:
                self.core.reject(0, shutting_down())
            self._read_scope.cancel()

    async def _close_gracefully(self) -> None:
        """Our EOF first, then drain theirs: closing on unread bytes would reset the
        connection and could destroy the last frames the client has not read yet.
        (TLS cannot half-close: there we only drain until the client closes.)"""
        with anyio.move_on_after(CLOSE_TIMEOUT):
            try:
                try:
                    await self.transport.send_eof()
                except NotImplementedError:
                    pass
                while True:
                    await self.transport.receive(READ_SIZE)
            except _GONE:
                pass

    # --- writer ------------------------------------------------------------

    async def _send_frame(self, channel: int, *parts: bytes) -> None:
        try:
            await self.outbox.send(channel, *parts)
        except anyio.BrokenResourceError:
            await anyio.sleep_forever()  # the connection is being torn down around us

    async def _flush_core(self) -> None:
        data = self.core.data_to_send()
        if data:
            await self._send_frame(_ALWAYS, data)

    def _peer_gone(self) -> None:
        self._read_scope.cancel()  # a send failed: tear the connection down

    # --- reader ------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self.transport.receive(READ_SIZE)
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
        elif isinstance(event, Reply):
            if event.channel not in self.core.exited:  # the session ended meanwhile
                await self._send_frame(event.channel, event.data)
        elif isinstance(event, HelloReceived):
            return await self._hello(event.hello)
        elif isinstance(event, OpenRequested):
            return await self._open(event.channel, event.request)
        elif isinstance(event, CancelRequested):
            self.outbox.dropped.add(event.channel)
            scope = self._scopes.get(event.channel)
            if scope is not None:
                scope.cancel()
        elif isinstance(event, OpenRejected):
            return self._multiplex or self._sessions_started > 0
        return True

    def _authorized(self, hello: Hello) -> str | None:
        """Why this peer may not go on, or None."""
        settings = self.state.settings
        if self.peer.transport == "unix":
            if self.peer.uid == os.getuid() or self.peer.uid in settings.allowed_uids:
                return None
            return f"uid {self.peer.uid} is not allowed on this socket"
        if settings.token is None or token_matches(settings.token, hello.token):
            return None
        return "missing token" if hello.token is None else "wrong token"

    async def _hello(self, hello: Hello) -> bool:
        delay = self.state.throttle.delay(self.peer)
        if delay:
            self._end_handshake()  # the handshake deadline must not cut the brake short
            await anyio.sleep(delay)  # a peer that keeps guessing waits longer each time
        refusal = self._authorized(hello)
        if refusal is not None:
            self.state.throttle.failed(self.peer)
            log.warning("%s: unauthorized: %s", self.peer, refusal)
            self.core.reject(0, RequestError(ErrorCode.UNAUTHORIZED,
                                             "unauthorized: missing or wrong token, or a peer "
                                             "that is not allowed"))
            return False
        if self.state.shutting_down:
            self.core.reject(0, shutting_down())
            return False
        self._multiplex = hello.multiplex
        if self._multiplex:
            self._end_handshake()
        await self._send_frame(_ALWAYS, self.core.welcome(f"ttyserve/{__version__}"))
        return True

    def _refuse_open(self, channel: int, error: RequestError) -> bool:
        self.core.reject(channel, error)
        return self._multiplex or self._sessions_started > 0

    async def _open(self, channel: int, request: Open) -> bool:
        settings = self.state.settings
        if not self._multiplex and self._sessions_started:
            return self._refuse_open(channel, RequestError(
                ErrorCode.BAD_REQUEST,
                "this connection carries one session (hello.multiplex is false)"))
        if self.state.shutting_down or self._draining:
            return self._refuse_open(channel, shutting_down())
        if self.state.sessions >= settings.max_sessions:
            return self._refuse_open(channel, busy(
                f"the server runs its maximum of {settings.max_sessions} sessions"))
        if len(self.sessions) >= settings.max_sessions_per_connection:
            return self._refuse_open(channel, busy(
                f"this connection runs its maximum of {settings.max_sessions_per_connection}"
                " sessions"))
        try:
            settings.policy.check(request)
        except RequestError as exc:
            log.warning("%s: channel %d: %s: %s", self.peer, channel, exc.code, exc.message)
            return self._refuse_open(channel, exc)
        self._end_handshake()
        spec = ProcessSpec(
            argv=list(request.argv) or list(settings.default_argv),
            pty=request.pty, rows=request.rows, cols=request.cols, term=request.term,
            env=dict(request.env), cwd=request.cwd or settings.default_cwd,
        )
        session_id = new_session_id() if self.state.journal is not None else ""
        try:
            process = await self.state.backend.spawn(spec)
        except OSError as exc:
            log.info("%s: channel %d: spawn failed: %s", self.peer, channel, exc)
            if self.state.journal is not None:
                await self.state.journal.start(session_id, str(self.peer), spec.argv, spec.pty,
                                               None)
                await self.state.journal.end(session_id, Reason.SPAWN_FAILED, errno=exc.errno)
            return self._refuse_open(channel, RequestError(
                ErrorCode.SPAWN_FAILED, str(exc.strerror or exc), errno=exc.errno or errno.EIO))
        self._sessions_started += 1
        self.state.sessions += 1
        hello = self.core.hello
        session = Session(channel, process, self._send_frame, self.core.exit, settings.linger,
                          hello.window if hello is not None else None, settings.max_frame)
        self.sessions[channel] = session
        # The scope exists before the task runs, so a `cancel` read right after the
        # `open` (in the same batch) cancels it; `opened` and the journal's start
        # record are written by the task, which always closes the process.
        scope = self._scopes[channel] = anyio.CancelScope()
        assert self._session_group is not None
        self._session_group.start_soon(self._run_session, session, scope, session_id, spec)
        return True

    async def _run_session(self, session: Session, scope: anyio.CancelScope, session_id: str,
                           spec: ProcessSpec) -> None:
        channel = session.channel
        status: Exit | None = None
        with scope:
            try:
                if self.state.journal is not None:
                    await self.state.journal.start(session_id, str(self.peer), spec.argv,
                                                   spec.pty, session.process.pid)
                await self._send_frame(channel, self.core.opened(channel, session.process.pid))
                status = await session.run()
            finally:
                await session.process.aclose()  # idempotent; shielded inside
                session.close_input()
                del self.sessions[channel]
                del self._scopes[channel]
                self.outbox.forget(channel)
                self.state.sessions -= 1
                if self.state.journal is not None:
                    with anyio.CancelScope(shield=True):
                        await self._journal_end(session, session_id, status)
        if not self._multiplex or (self._draining and not self.sessions):
            self._read_scope.cancel()

    async def _journal_end(self, session: Session, session_id: str, status: Exit | None) -> None:
        assert self.state.journal is not None
        if self.state.shutting_down:
            reason = Reason.SHUTDOWN
        else:
            reason = Reason.EXIT if status is not None else Reason.CANCELLED
        final = session.process.status
        await self.state.journal.end(
            session_id, reason,
            code=final.code if final else None, signal=final.signal if final else None,
            error=final.error if final else None,
            bytes_in=session.bytes_in, bytes_out=session.bytes_out)
