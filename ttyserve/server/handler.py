"""One client connection, as I/O only: feed the core, act on its events, send what it framed.

The protocol core decides every rule; the gate decides who may go on; the
registry admits and runs sessions. What is left here is the reader loop, the
handshake deadline, the channel-to-session table and the close.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from ..errors import ErrorCode, RemoteProtocolError, RequestError
from ..protocol.messages import Attached, Eof, Sessions
from ..protocol.server import (
    AttachRequested,
    CancelRequested,
    ControlReceived,
    CreditGranted,
    DetachRequested,
    HelloReceived,
    ListRequested,
    OpenRequested,
    ServerConnection,
    ServerEvent,
    StdinReceived,
)
from ..transport.outbox import Outbox
from ..transport.streams import PipeTransport, SocketTransport, Transport
from ..version import __version__
from .attachment import Attachment
from .auth import Gate, Peer
from .journal import SessionAttach, SessionDetach
from .registry import SessionRegistry, shutting_down

log = logging.getLogger("ttyserve")

# Under glibc's 128 KiB mmap threshold: a larger buffer, cut to the keystroke it got, was
# mapped, remapped and unmapped each time (3 system calls, a third of the server's CPU per
# keystroke). The client's messages are small: keystrokes and controls.
READ_SIZE = 64 * 1024
CLOSE_TIMEOUT = 2.0  # seconds to send our EOF and drain the client's bytes at the end
SERVER_NAME = f"ttyserve/{__version__}"
Later = Callable[[], Awaitable[object]]  # the part of an event that has to wait
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class ConnectionHandler:
    """Serves one connection from `hello` to close."""

    def __init__(self, transport: Transport, peer: Peer, registry: SessionRegistry, gate: Gate,
                 on_closed: Callable[[ConnectionHandler], None] | None = None) -> None:
        settings = registry.settings
        self.transport = transport
        # A socket or pipe is read from the loop's readiness callback after the handshake.
        self._socket = (transport if isinstance(transport, SocketTransport | PipeTransport)
                        else None)
        self.peer = peer
        self.registry = registry
        self.gate = gate
        self.core = ServerConnection(settings.max_frame, settings.stdin_window)
        self.attachments: dict[int, Attachment] = {}
        self._handshake_timeout = settings.handshake_timeout
        self._on_closed = on_closed
        self._read_scope = anyio.CancelScope()
        self.outbox = Outbox(transport, on_broken=self._read_scope.cancel)
        self.principal = ""  # whom it acts as, once `hello` is accepted (section 9)
        self._draining = False
        self._tasks: anyio.abc.TaskGroup | None = None  # replays of attached sessions run here
        self._later: Later | None = None  # what the readiness callback left the reader task

    # --- lifecycle ---------------------------------------------------------

    async def run(self) -> None:
        """Serve until the client leaves, breaks the protocol, or its one session ends."""
        try:
            async with anyio.create_task_group() as tg:
                self.outbox.attach(tg)
                self._tasks = tg
                self._read_scope.deadline = anyio.current_time() + self._handshake_timeout
                try:
                    with self._read_scope:
                        await self._read_loop()
                    if not self.core.handshake_done and not self.core.closing and (
                            anyio.current_time() >= self._read_scope.deadline):
                        log.info("%s: no hello and open in time: dropped", self.peer)
                        self.core.close(RemoteProtocolError(
                            f"no {'open' if self.core.hello else 'hello'} within "
                            f"{self._handshake_timeout:g} s"))
                finally:
                    self.core.close()  # nothing more is framed: what is framed still goes out
                    for attachment in list(self.attachments.values()):
                        self._leave(attachment)  # as `cancel` does, or `detach` (section 9)
                self.flush_nowait()
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
            if self._on_closed is not None:
                self._on_closed(self)  # after the close: "no handlers" means all closed

    def begin_shutdown(self) -> None:
        """Graceful shutdown (the registry hung the sessions up): close once none is left."""
        self._draining = True
        if not self.attachments:
            self._close(shutting_down() if self.core.hello is not None else None)

    def _close(self, error: RequestError | None = None) -> None:
        self.core.close(error)
        self._read_scope.cancel()

    async def _close_gracefully(self) -> None:
        """Our EOF first, then drain theirs: closing on unread bytes would reset the
        connection and could destroy the last frames the client has not read yet.
        (TLS cannot half-close: there we only drain until the client closes.)"""
        with anyio.move_on_after(CLOSE_TIMEOUT):
            try:
                try:
                    await self.transport.send_eof(protocol_error=self.core.error is not None)
                except NotImplementedError:
                    pass
                while True:
                    await self.transport.receive(READ_SIZE)
            except (*_GONE, RemoteProtocolError):
                pass

    # --- sending (the Carrier of attachments) ------------------------------

    def flush_nowait(self) -> None:
        if self.core.pending and not self.outbox.broken:
            try:
                self.outbox.push(self.core.data_to_send())
            except anyio.BrokenResourceError:
                pass  # the outbox has cancelled the reader: the connection is going

    async def flush(self) -> None:
        self.flush_nowait()
        await self.outbox.wait_for_room()

    @property
    def has_room(self) -> bool:
        return self.outbox.has_room

    def detach(self, attachment: Attachment) -> None:
        if self.attachments.get(attachment.channel) is attachment:
            del self.attachments[attachment.channel]
        if self.core.closing or (self._draining and not self.attachments):
            self._read_scope.cancel()

    # --- reader ------------------------------------------------------------

    async def _read_loop(self) -> None:
        core = self.core
        while not core.closing:
            try:
                data = await self._receive()
            except _GONE:
                return
            except RemoteProtocolError as exc:  # the carriage was misused
                log.info("%s: %s: %s", self.peer, exc.code, exc.message)
                core.close(exc)
                return
            if data is not None:
                core.receive_data(data)
            try:
                if (later := self._later) is not None:
                    self._later = None
                    await later()
                while (event := core.next_event()) is not None:
                    if (later := self._act(event)) is not None:
                        await later()
            except RemoteProtocolError as exc:
                log.info("%s: %s: %s", self.peer, exc.code, exc.message)
            if core.handshake_done:
                self._read_scope.deadline = float("inf")
            await self.flush()

    async def _receive(self) -> bytes | None:
        """The client's next bytes; None when the readiness callback read them and left this
        task the part that has to wait (`_later`, a full send queue, the close)."""
        socket = self._socket
        if socket is not None and self.core.handshake_done and await socket.serve_readable(
                self._readable):
            return None
        return await self.transport.receive(READ_SIZE)

    def _readable(self) -> bool:
        """The keystroke path, run by the event loop when the socket is readable: read, act
        on what needs no waiting, send what that framed; False to wake the reader task for
        the rest. What reading raises is raised in the task, as `receive` would."""
        core, socket = self.core, self._socket
        assert socket is not None
        if core.closing:
            return False
        data = socket.receive_nowait(READ_SIZE)
        if data is None:
            return True
        core.receive_data(data)
        try:
            while (event := core.next_event()) is not None:
                if (later := self._act(event)) is not None:
                    self._later = later
                    break
        except RemoteProtocolError as exc:
            log.info("%s: %s: %s", self.peer, exc.code, exc.message)
        except Exception as exc:  # a fault: raised in the task, as if it had acted
            self._later = functools.partial(_raise, exc)
        self.flush_nowait()
        return self._later is None and not core.closing and self.outbox.has_room

    def _act(self, event: ServerEvent) -> Later | None:
        """Act on ``event`` as far as needs no waiting; what is left to await, if anything."""
        if isinstance(event, StdinReceived):
            attachment = self.attachments.get(event.channel)
            if attachment is not None:
                session = attachment.session
                session.feed_stdin(event.data)
                if session.stdin_full and not self.core.windowed:
                    return session.wait_stdin_room
        elif isinstance(event, CreditGranted):
            attachment = self.attachments.get(event.channel)
            if attachment is not None:
                attachment.credit_granted()
        elif isinstance(event, ControlReceived):
            attachment = self.attachments.get(event.channel)
            if attachment is not None:
                if isinstance(event.message, Eof):
                    attachment.session.feed_eof()
                else:
                    attachment.session.control(event.message)
        elif isinstance(event, OpenRequested):
            return functools.partial(self._open, event)
        elif isinstance(event, AttachRequested):
            return functools.partial(self._attach, event)
        elif isinstance(event, CancelRequested):
            attachment = self.attachments.pop(event.channel, None)
            if attachment is not None:
                attachment.session.cancel()
        elif isinstance(event, DetachRequested):
            attachment = self.attachments.get(event.channel)
            if attachment is not None and attachment.session.detachable:
                attachment.session.detach()
                # Not left to this task: a client that hangs up right after `detach` breaks
                # the send of `detached`, and that ends the reader before it could note it.
                self.registry.note_soon(attachment.session, SessionDetach, str(self.peer))
            elif attachment is not None:
                self.core.refuse(event.channel, RequestError(
                    ErrorCode.BAD_REQUEST, "this session is not detachable (it was not opened "
                    "with detachable: true); cancel it instead"))
        elif isinstance(event, ListRequested):
            self.core.send_sessions(Sessions(sessions=self.registry.listing(self.principal)))
        elif isinstance(event, HelloReceived):
            return functools.partial(self._hello, event)
        return None

    async def _hello(self, event: HelloReceived) -> None:
        delay = self.gate.delay(self.peer)
        if delay:
            deadline = self._read_scope.deadline
            self._read_scope.deadline = float("inf")  # the deadline must not cut the brake short
            await anyio.sleep(delay)  # a peer that keeps guessing waits longer each time
            self._read_scope.deadline = deadline + delay
        try:
            self.principal = self.gate.admit(self.peer, event.hello.token)
        except RequestError as exc:
            self.core.close(exc)
            return
        if self.registry.closing or self._draining:
            self.core.close(shutting_down())
            return
        self.core.accept_hello(SERVER_NAME)

    async def _open(self, event: OpenRequested) -> None:
        channel = event.channel
        try:
            session = await self.registry.open(event.request, self.principal, str(self.peer),
                                               len(self.attachments))
        except RequestError as exc:
            self.core.refuse(channel, exc)
            return
        attachment = Attachment(self, channel, session)
        self.attachments[channel] = attachment
        session.attach(attachment)
        self.registry.start(session)
        if not self.core.opened(channel, session.pid, session.spec.argv,
                                session.id if session.detachable else None):
            self.attachments.pop(channel, None)  # the connection closed meanwhile
            session.cancel()

    async def _attach(self, event: AttachRequested) -> None:
        """Take over a detachable session: `attached`, its scrollback, then live output."""
        request, channel = event.request, event.channel
        try:
            if self.registry.closing or self._draining:
                raise shutting_down()
            session = self.registry.find(request.session, self.principal)
            if session.sink is not None and not request.steal:
                raise RequestError(ErrorCode.SESSION_IN_USE, "the session is attached "
                                   "elsewhere (attach with steal to take it over)")
            self.registry.check_room(len(self.attachments))
        except RequestError as exc:
            self.core.refuse(channel, exc)
            return
        if session.pending_exit is None and (request.rows or request.cols):
            rows, cols = session.size
            session.resize(request.rows or rows, request.cols or cols)
        assert session.ring is not None
        replay = session.ring.snapshot()  # and the pumps wait until it went out: no gap
        self.core.attached(channel, Attached(session=session.id, pid=session.pid,
                                             pty=session.spec.pty, dropped=session.ring.dropped))
        attachment = Attachment(self, channel, session, replay)
        self.attachments[channel] = attachment
        session.attach(attachment)
        assert self._tasks is not None
        self._tasks.start_soon(attachment.replay)
        await self.registry.note(session, SessionAttach, str(self.peer))

    def _leave(self, attachment: Attachment) -> None:
        """This connection lets go of a session: a detachable one goes on, detached; any other
        is cancelled (the client has gone, as `cancel` does)."""
        session = attachment.session
        if session.detachable:
            session.detach()
            self.registry.note_soon(session, SessionDetach, str(self.peer))
        else:
            session.cancel()


async def _raise(exc: BaseException) -> None:
    raise exc
