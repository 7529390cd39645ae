"""One client connection, as I/O only: feed the core, act on its events, send what it framed.

The protocol core decides every rule; the gate decides who may go on; the
registry admits and runs sessions. What is left here is the reader loop, the
handshake deadline, the channel-to-session table and the close. The handler is
the one object that drives the connection's core: it frames what sessions send
through their attachments, and it ends channels itself (cancel, detach, the
connection's end), so a keystroke, a grant of credit and a detach each go one
way through the layers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import select
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import anyio
import anyio.abc

from ..defaults import CLOSE_TIMEOUT, OUTPUT_CHUNK, SERVER_RECEIVE, SOON_BYTES
from ..errors import ErrorCode, RemoteProtocolError, RequestError
from ..protocol.frames import FrameKind
from ..protocol.heartbeat import Beat, Heartbeat
from ..protocol.messages import (
    OBSERVER,
    Attached,
    Eof,
    Exit,
    Offsets,
    Opened,
    Sessions,
    Shared,
    Unshared,
)
from ..protocol.server import (
    AttachRequested,
    CancelRequested,
    ControlReceived,
    CreditGranted,
    DetachRequested,
    HelloReceived,
    ListRequested,
    OpenRequested,
    ReleaseRequested,
    ServerConnection,
    ServerEvent,
    ShareRequested,
    StdinReceived,
    UnshareRequested,
)
from ..transport.outbox import Outbox, TaskStarter
from ..transport.readiness import ReadableService
from ..transport.splice import discard
from ..transport.streams import (
    Buffer,
    PipeTransport,
    ReadsNowait,
    SocketTransport,
    TaskNeeded,
    Transport,
    close_gracefully,
)
from ..version import __version__
from .attachment import Attachment
from .auth import Gate, Peer
from .grants import Grant
from .journal import SessionAttach, SessionDetach
from .observer import Observer
from .registry import SessionRegistry, restarting, shutting_down
from .session import ServerSession

log = logging.getLogger("ttyserve")

SERVER_NAME = f"ttyserve/{__version__}"
Later = Callable[[], Awaitable[object]]  # the part of an event that has to wait
T = TypeVar("T")
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class ConnectionHandler:
    """Serves one connection from `hello` to close."""

    _task_read = False  # the callback met what only the task's `receive` can do (set on
    # the instance only then: a connection's attributes are memory per session)
    _restarting = False  # an upgrade: closes with `server_restarting` (section 12)

    def __init__(self, transport: Transport, peer: Peer, registry: SessionRegistry, gate: Gate,
                 tasks: TaskStarter,
                 on_closed: Callable[[ConnectionHandler], None] | None = None) -> None:
        settings = registry.settings
        self.transport = transport
        # A socket, pipe or plain WebSocket is read from the loop's readiness callback
        # after the handshake.
        self._socket: ReadsNowait | None = None
        if getattr(transport, "reads_nowait", False):
            self._socket = cast(ReadsNowait, transport)
        self._service = ReadableService()  # the reader's wait there, which `_stop_reading` ends
        self._stopped = False  # the reader is to stop: the connection closes
        self._discarding = False  # closed from the readiness callback: it drains the client
        self.peer = peer
        self.registry = registry
        self.gate = gate
        self.core = ServerConnection(settings.max_frame, settings.stdin_window,
                                     output_frame=OUTPUT_CHUNK)
        self.attachments: dict[int, Attachment | Observer] = {}
        self._handshake_timeout = settings.handshake_timeout
        self._deadline = math.inf  # the handshake's, while it lasts
        self._on_closed = on_closed
        self._wait_scope: anyio.CancelScope | None = None  # a wait `_stop_reading` cuts short
        self._first_read = True
        # The writer task, when one is needed, runs beside the connection's own.
        self.outbox = Outbox(transport, on_broken=self._stop_reading, on_room=self._room)
        self.outbox.attach(tasks)
        self._tasks = tasks
        self._heartbeat: Heartbeat | None = None  # section 10, when `hello` asked for it
        self._beat_scope: anyio.CancelScope | None = None
        self._over = False
        self._paused = False  # the reader waits for something of ours, not for the client
        self.principal = ""  # whom it acts as, once `hello` is accepted (section 9)
        self.grant: Grant | None = None  # what admitted it instead of the token (section 11)
        self._draining = False
        self._later: Later | None = None  # what the readiness callback left the reader task
        self._unflushed = 0  # output framed by `send_output_soon` and not handed on yet
        self._flush_soon = False  # a flush at the end of this turn of the loop is due

    # --- lifecycle ---------------------------------------------------------

    async def run(self) -> None:
        """Serve until the client leaves, breaks the protocol, or its one session ends."""
        try:
            self._deadline = anyio.current_time() + self._handshake_timeout
            await self._read_loop()
            if not self.core.handshake_done and not self.core.closing and (
                    anyio.current_time() >= self._deadline):
                log.info("%s: no hello and open in time: dropped", self.peer)
                self.core.close(RemoteProtocolError(
                    f"no {'open' if self.core.hello else 'hello'} within "
                    f"{self._handshake_timeout:g} s"))
            self._end_channels()
            self.outbox.close()
            # The session's last frames go out however slowly the client reads;
            # a client that never reads holds only its own connection.
            await self.outbox.wait_done()
            if not self.outbox.broken and not self._discarding:  # (else done already)
                # A WebSocket says 1002 after a protocol error.
                await close_gracefully(self.transport, CLOSE_TIMEOUT, functools.partial(
                    self.transport.send_eof, protocol_error=self.core.error is not None))
        finally:
            self._over = True
            if self._beat_scope is not None:
                self._beat_scope.cancel()
            for attachment in list(self.attachments.values()):
                self._leave(attachment)  # cancelled (a forced shutdown): as the client left
            self.outbox.close()
            await self.transport.aclose()
            self.outbox.release()
            if self._on_closed is not None:
                self._on_closed(self)  # after the close: "no handlers" means all closed

    def begin_shutdown(self) -> None:
        """Graceful shutdown (the registry hung the sessions up): close once none is left."""
        self._draining = True
        if not self.attachments:
            self.core.close(shutting_down() if self.core.hello is not None else None)
            self._stop_reading()

    def begin_restart(self) -> None:
        """An upgrade in place: `server_restarting` on channel 0, then the close, once the
        sessions the upgrade ends (those not detachable) sent their `exit`; detachable
        sessions go on detached."""
        self._restarting = True
        if self.core.hello is None:
            self.core.close()
        elif self._ending_sessions():
            self.core.close_when_over(restarting())  # (after the last channel's last frame)
            return
        else:
            self.core.close(restarting())
        self._stop_reading()

    def _ending_sessions(self) -> bool:
        """Whether a session the upgrade ends (not detachable) is still attached here."""
        return not all(a.session.detachable for a in self.attachments.values())

    def _stop_reading(self) -> None:
        """The connection is to close: the reader stops, woken where it waits for the client
        (the common case, and no cancellation), or cut short where it waits for anything
        else. Where it waits in the readiness callback and nothing is left to send, the
        close is done there and then, and the same callback drains the client."""
        self._stopped = True
        if self._close_in_callback():
            return
        if not self._service.wake() and self._wait_scope is not None:
            self._wait_scope.cancel()

    def _close_in_callback(self) -> bool:
        """The close (`run`'s, after the reader), from the socket's readiness callback: our
        EOF, then the client's bytes dropped until its EOF (or CLOSE_TIMEOUT), with no hop
        to the task and no second watch of the socket; False where it cannot be done so."""
        socket = self._socket
        if (not isinstance(socket, SocketTransport | PipeTransport) or not self._service.serving
                or self.outbox.broken or not self.outbox.idle):
            return False  # (a WebSocket's close is a message: the task sends it)
        self._end_channels()
        if not self.outbox.idle:
            return False  # what the core framed last waits to be sent: the task does the rest
        self.outbox.close()
        try:
            socket.send_eof_nowait()
        except anyio.BrokenResourceError:
            return False
        self._discarding = True
        self._service.end_by(anyio.current_time() + CLOSE_TIMEOUT)
        return True

    def _end_channels(self) -> None:
        """The close: nothing more is framed (what is framed still goes out), and every
        session is let go, as `cancel` does, or `detach` (section 9)."""
        self.core.close()
        for attachment in list(self.attachments.values()):
            self._leave(attachment)
        self.flush()

    async def _interruptibly(self, wait: Awaitable[T], deadline: float = math.inf) -> T | None:
        """``wait``, unless `_stop_reading` or ``deadline`` cuts it short (then None)."""
        with anyio.CancelScope(deadline=deadline) as self._wait_scope:
            if self._stopped:
                self._wait_scope.cancel()
            try:
                return await wait
            finally:
                self._wait_scope = None
        return None

    # --- the attachments' host: the one place this connection's frames are made ---------

    def flush(self) -> None:
        """Hand what the core framed to the writer, without waiting."""
        self._unflushed = 0
        if self.core.pending and not self.outbox.broken:
            if (heartbeat := self._heartbeat) is not None:
                heartbeat.last_sent = time.monotonic()
            try:
                self.outbox.push(self.core.data_to_send())
            except anyio.BrokenResourceError:
                pass  # the outbox has stopped the reader: the connection is going

    def output_limit(self, channel: int) -> int:
        return self.core.output_limit(channel) if self.outbox.has_room else 0

    def send_output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        if self.core.send_output(channel, kind, data):
            self.flush()

    @property
    def splices(self) -> bool:
        """Whether output may be spliced from a pipe into this connection (a Unix socket)."""
        return self.outbox.splices

    def splice_output(self, channel: int, kind: FrameKind, pipe: int, size: int) -> None:
        """Frame the next ``size`` bytes of ``pipe`` as output, moved by the kernel (what the
        socket does not take now, once it does: see the outbox); dropped if nothing can go."""
        core = self.core
        if not core.send_output_header(channel, kind, size):
            discard(pipe, size)
            return
        if (heartbeat := self._heartbeat) is not None:
            heartbeat.last_sent = time.monotonic()
        self._unflushed = 0
        try:
            self.outbox.push_from_pipe(core.data_to_send(), pipe, size)
        except anyio.BrokenResourceError:
            pass  # the outbox has stopped the reader: the connection is going

    def send_output_soon(self, channel: int, kind: FrameKind,
                         data: Buffer) -> None:
        """Frame output that may go at the end of this turn of the loop: an observer's, so
        the frames of a chunk to every observer on this connection go in one send (never
        more than SOON_BYTES wait so, unseen by the send queue's bound)."""
        if not self.core.send_output(channel, kind, data):
            return
        self._unflushed += len(data)
        if self._unflushed >= SOON_BYTES:
            self.flush()
        elif not self._flush_soon:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # (not asyncio's loop: no callbacks to wait for)
                self.flush()
                return
            self._flush_soon = True
            loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_soon = False
        self.flush()

    def frame_attached(self, attachment: Attachment | Observer, answer: Attached) -> None:
        self.attachments[attachment.channel] = attachment
        self.core.attached(attachment.channel, answer)

    def send_skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self.core.send_skipped(channel, size, offsets)

    def send_audience(self, channel: int, observers: int) -> None:
        if self.core.send_audience(channel, observers):
            self.flush()

    def stdin_consumed(self, channel: int, size: int) -> None:
        self.core.stdin_consumed(channel, size)
        self.flush()

    def end_channel(self, attachment: Attachment | Observer, last: Exit | str | None) -> bool:
        """A channel's last frame, `exit` or `detached`; the connection forgets it."""
        channel = attachment.channel
        if self.attachments.get(channel) is attachment:
            del self.attachments[channel]
        if isinstance(last, Exit):
            framed = self.core.send_exit(channel, last)
        else:
            framed = self.core.send_detached(channel, last)
        self.flush()
        if self._restarting and not self._ending_sessions():
            self.core.close(restarting())  # (a no-op when the core closed with it already)
        if self.core.closing or (self._draining and not self.attachments):
            self._stop_reading()  # the reader closes the connection
        return framed

    def _room(self) -> None:
        """The send queue has room again: replays and pumps that waited for it go on."""
        for attachment in list(self.attachments.values()):
            attachment.resume()

    # --- reader ------------------------------------------------------------

    async def _read_loop(self) -> None:
        core = self.core
        while not (core.closing or self._stopped or anyio.current_time() >= self._deadline):
            try:
                data = await self._receive()
            except _GONE:
                return
            except RemoteProtocolError as exc:  # the carriage was misused
                log.info("%s: %s: %s", self.peer, exc.code, exc.message)
                core.close(exc)
                return
            if data is not None:
                if self._heartbeat is not None:
                    self._heartbeat.last_received = time.monotonic()
                core.receive_data(data)
            self._paused = True
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
                self._deadline = math.inf
            self.flush()
            await self.outbox.wait_for_room()
            self._paused = False

    async def _receive(self) -> bytes | None:
        """The client's next bytes; None when the readiness callback read them and left this
        task the part that has to wait (`_later`, a full send queue, the close)."""
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
                if not await self._service.serve(socket.fileno(), self._readable,
                                                 self._deadline):
                    self._socket = None  # no readiness callbacks on this loop: the ordinary way
                elif not self._task_read:
                    return None
        if self._task_read:
            self._task_read = False
        return await self._interruptibly(self.transport.receive(SERVER_RECEIVE), self._deadline)

    def _readable(self) -> bool:
        """The keystroke path, run by the event loop when the socket is readable: read, act
        on what needs no waiting, send what that framed; False to wake the reader task for
        the rest. What reading raises is raised in the task, as `receive` would."""
        core, socket = self.core, self._socket
        assert socket is not None
        if self._discarding:  # closed: what the client still sends is dropped until its EOF
            try:
                socket.receive_nowait(SERVER_RECEIVE)
            except _GONE:
                return False
            return True
        if core.closing or self._stopped:
            return False
        try:
            data = socket.receive_nowait(SERVER_RECEIVE)
        except TaskNeeded:
            self._task_read = True
            return False
        if data is None:
            return True
        if self._heartbeat is not None:
            self._heartbeat.last_received = time.monotonic()
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
        self.flush()
        if self._discarding:  # closed by what it just read: this callback drains the client
            self._later = None
            return True
        return (self._later is None and not core.closing and not self._stopped
                and self.outbox.has_room and not socket.pending)

    def _act(self, event: ServerEvent) -> Later | None:
        """Act on ``event`` as far as needs no waiting; what is left to await, if anything."""
        if isinstance(event, StdinReceived):
            attachment = self.attachments.get(event.channel)
            if attachment is not None:
                session = attachment.session
                self.core.stdin_consumed(event.channel, session.feed_stdin(event.data))
                window = self.core.stdin_window
                if session.stdin.over(window):
                    return lambda: self._interruptibly(session.stdin.wait_room(window))
        elif isinstance(event, CreditGranted):
            attachment = self.attachments.get(event.channel)
            if attachment is not None:
                attachment.resume()
        elif isinstance(event, ControlReceived):
            attachment = self.attachments.get(event.channel)
            if attachment is not None:
                if isinstance(event.message, Eof):
                    attachment.session.stdin.feed_eof()
                else:
                    attachment.session.control(event.message)
        elif isinstance(event, OpenRequested):
            if not self._open_now(event):
                return functools.partial(self._open, event)
        elif isinstance(event, AttachRequested):
            self._attach(event)
        elif isinstance(event, CancelRequested):  # the core has ended the channel
            attachment = self.attachments.pop(event.channel, None)
            if attachment is not None:
                attachment.leave()
                attachment.session.cancel()
        elif isinstance(event, DetachRequested):
            self._detach(event.channel)
        elif isinstance(event, ReleaseRequested):
            if self.grant is None or self.registry.grants.live(self.grant):
                self.registry.release(event.session, self.principal)
        elif isinstance(event, ListRequested):
            self.core.answer(Sessions(sessions=self.registry.listing(self.principal)))
        elif isinstance(event, ShareRequested):
            self._share(event)
        elif isinstance(event, UnshareRequested):
            self._unshare(event)
        elif isinstance(event, HelloReceived):
            if delay := self.gate.delay(self.peer):
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

    # --- the heartbeat (section 10) ------------------------------------------------

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

    def _open_now(self, event: OpenRequested) -> bool:
        """Answer an `open` that needs no waiting (no journal to write first); False when it
        has to be awaited (`_open`)."""
        try:
            session = self.registry.open_nowait(event.request, self.principal, str(self.peer),
                                                len(self.attachments))
        except RequestError as exc:
            self.core.refuse(event.channel, exc)
            return True
        if session is None:
            return False
        self._opened(event.channel, session)
        return True

    async def _open(self, event: OpenRequested) -> None:
        try:
            session = await self.registry.open(event.request, self.principal, str(self.peer),
                                               len(self.attachments))
        except RequestError as exc:
            self.core.refuse(event.channel, exc)
            return
        self._opened(event.channel, session)

    def _opened(self, channel: int, session: ServerSession) -> None:
        """`opened`, and the session runs, attached to ``channel``."""
        attachment = Attachment(self, channel, session)
        self.attachments[channel] = attachment
        session.attach(attachment)
        self.registry.start(session)
        if not self.core.opened(channel, Opened(
                pid=session.pid, argv=session.spec.argv, pty=session.spec.pty,
                session=session.id if session.detachable else None)):
            self.attachments.pop(channel, None)  # the connection closed meanwhile
            attachment.released = True
            session.cancel()

    def _attach(self, event: AttachRequested) -> None:
        """Take over a detachable session, or watch it (section 11): `attached`, its
        scrollback, then live output."""
        request, channel = event.request, event.channel
        try:
            session = self.registry.attach(request, self.principal, len(self.attachments),
                                           self.grant)
        except RequestError as exc:
            self.core.refuse(channel, exc)
            return
        grant = self.grant.id if self.grant is not None else None
        if request.role == OBSERVER:  # its size is not the terminal's
            Observer.attach(self, channel, session, request.offsets, grant)
        else:
            if session.final is None and (request.rows or request.cols):
                rows, cols = session.size
                session.resize(request.rows or rows, request.cols or cols)
            Attachment.attach(self, channel, session, request.offsets, grant)
        self.registry.note_soon(session, SessionAttach, str(self.peer), role=request.role,
                                grant=grant)

    def _share(self, event: ShareRequested) -> None:
        try:
            secret, grant = self.registry.share(event.request, self.principal, str(self.peer))
        except RequestError as exc:
            self.core.refuse_request(exc)
            return
        self.core.answer(Shared(session=grant.session, grant=secret, role=grant.role,
                                expires=grant.expires_at, id=grant.id))

    def _unshare(self, event: UnshareRequested) -> None:
        try:
            grant, channels = self.registry.unshare(event.request.grant, self.principal,
                                                    str(self.peer))
        except RequestError as exc:
            self.core.refuse_request(exc)
            return
        self.core.answer(Unshared(id=grant.id, channels=channels))

    def _detach(self, channel: int) -> None:
        attachment = self.attachments.get(channel)
        if attachment is None:
            return
        if not attachment.session.detachable:
            self.core.refuse(channel, RequestError(
                ErrorCode.BAD_REQUEST, "this session is not detachable (it was not opened "
                "with detachable: true); cancel it instead"))
            return
        attachment.release()  # `detached`: the channel's last frame
        self._let_go(attachment)

    def _leave(self, attachment: Attachment | Observer) -> None:
        """This connection lets go of a session: a detachable one goes on, detached; any other
        is cancelled (the client has gone, as `cancel` does)."""
        self.attachments.pop(attachment.channel, None)
        attachment.leave()
        if attachment.session.detachable:
            self._let_go(attachment)
        else:
            attachment.session.cancel()

    def _let_go(self, attachment: Attachment | Observer) -> None:
        # Noted at once, not left to this task: a client that hangs up right after `detach`
        # breaks the send of `detached`, and that ends the reader before it could note it.
        session = attachment.session
        if isinstance(attachment, Attachment) and session.sink is attachment:
            session.detach()
        self.registry.note_soon(session, SessionDetach, str(self.peer), role=attachment.role,
                                grant=attachment.grant)


async def _raise(exc: BaseException) -> None:
    raise exc
