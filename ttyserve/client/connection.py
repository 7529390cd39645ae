"""A connection to a ttyserve server: the reader, the one writer, the sessions by channel,
the heartbeat, and the links the resume of section 10 dials (resume.py).

Every rule of the protocol is checked by the sans-I/O core (`protocol/client.py`): a
server that breaks one raises RemoteProtocolError in the sessions waiting on it. The
connection is each session's `Link`, and hands each session its channel's events.

A connection rides on one transport at a time, a link. When a link is lost (reset, EOF,
heartbeat silence, a retriable error such as `server_restarting`) and some of its sessions
were spawned or attached with ``resume``, the connection dials again with backoff, for as
long as those sessions allow, and attaches each at the offsets it holds: their output and
their exit go on as if nothing happened. The others end with ConnectionLost, as before.
Each session keeps its own count (offsets, window, what was lost); the connection tells it
what happened.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

import anyio
import anyio.abc

from ..defaults import DEFAULT_HEARTBEAT
from ..errors import ConnectionLost
from ..protocol.client import (
    AnswerReceived,
    AttachedReceived,
    ClientConnection,
    ClientEvent,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    NoticeReceived,
    OpenedReceived,
    OpenRefused,
    OutputReceived,
    PingReceived,
    SessionsReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ..protocol.heartbeat import Heartbeat
from ..protocol.messages import (
    DEFAULT_COLS,
    DEFAULT_ROWS,
    DEFAULT_TERM,
    OBSERVER,
    WRITER,
    Attach,
    AttachRole,
    Detach,
    Eof,
    Error,
    Hello,
    Message,
    Offsets,
    Open,
    Role,
    SessionInfo,
    Sessions,
    Share,
    Shared,
    TargetInfo,
    Targets,
    Unshare,
    Unshared,
    Welcome,
    request_error,
)
from ..transport.streams import Transport
from .resume import Dial, Resume
from .session import ConnectionEnded, ResumeEvent, Session
from .wire import Wire

if TYPE_CHECKING:
    from ..backends.carrier import Carrier

_CHANNEL_ENDS = (ExitReceived, DetachedReceived, OpenRefused)  # a channel's last event
_CHANNEL_0 = (PingReceived, SessionsReceived, AnswerReceived, WelcomeReceived)  # (and errors)
_Answer = Sessions | Shared | Unshared | Targets | Error  # what a request on channel 0 gets
_A = TypeVar("_A", Sessions, Shared, Unshared, Targets)
# A channel's own events, which its session takes.
_ChannelEvent = (OpenedReceived | AttachedReceived | OpenRefused | OutputReceived | ExitReceived
                 | DetachedReceived | ErrorReceived | StdinCreditGranted | NoticeReceived)


class Connection:
    """A connection to a ttyserve server; made by `connect`."""

    def __init__(self, transport: Transport, hello: Hello, carrier: Carrier | None = None, *,
                 redial: Dial | None = None,
                 on_resume: Callable[[ResumeEvent], None] | None = None,
                 release: bool = True) -> None:
        """``release``: a detachable session's exit, once read by its writer, is released
        (forgotten by the server at once); without, it is kept --keep-ended for others."""
        self._hello = hello
        self._release = release
        self.multiplex = hello.multiplex
        self.window = hello.window
        self._resume = Resume(redial, on_resume)
        self._interval: float | None = hello.heartbeat  # our heartbeat, when there is one
        self._tasks: anyio.abc.TaskGroup | None = None
        self._beating = False
        self._link = self._new_link(transport, carrier)
        self._sessions: dict[int, Session] = {}  # by channel, on the current link
        self._detach_when_attached: set[int] = set()  # attaches whose waiter gave up
        # Requests on channel 0 waiting for their answers, which come in the order asked.
        self._asked: list[tuple[list[_Answer | Exception], anyio.Event]] = []
        self._channels = itertools.count(1)
        self._failure: Exception | None = None
        self._failed = anyio.Event()  # set with _failure

    def _new_link(self, transport: Transport, carrier: Carrier | None) -> Wire:
        return Wire(transport, carrier, None if self._interval is None
                    else Heartbeat(self._interval, time.monotonic()))

    @property
    def welcome(self) -> Welcome | None:
        return self._link.core.welcome

    @property
    def max_frame(self) -> int:
        """The largest payload the server takes (what `welcome` said; 1 MiB until then)."""
        return self._link.core.max_frame

    async def spawn(
        self,
        argv: Sequence[str] | None = None,
        *,
        pty: bool = True,
        rows: int = DEFAULT_ROWS,
        cols: int = DEFAULT_COLS,
        term: str = DEFAULT_TERM,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        detachable: bool = False,
        resume: float | None = None,
        detached_timeout: int | None = None,
        idempotency_key: str | None = None,
        target: str | None = None,
        modes: bool = False,
    ) -> Session:
        """Open a session and wait for `opened`. Raises RequestError if refused.
        ``target``: run it on that target of the server (section 15). ``modes``: the
        terminal's state comes as `modes` events (section 14; `next_event`). A
        ``detachable`` session outlives this connection: `session.id` names it for
        `attach`, and it keeps a scrollback of its output meanwhile (section 9).

        With ``resume`` (seconds) the session is detachable, the server hangs it up once
        it has been without a client that long, and this connection, when it loses the
        server, dials again for up to that long and attaches it where its output stopped:
        iterating it and `wait()` go on across the reconnect, every byte once. Without a
        ``heartbeat`` given to `connect`, the connection pings every DEFAULT_HEARTBEAT
        seconds itself, so a silent link is noticed. ``detached_timeout`` (seconds) sets
        the hang-up of a detachable session without ``resume``. ``idempotency_key``: a
        detachable session is started once per key while it is known (RequestError
        session_in_use names the first).
        """
        if resume is not None:
            detachable = True
            detached_timeout = _whole_seconds(resume)
        request = Open(argv=list(argv or []), pty=pty, rows=rows, cols=cols, term=term,
                       env=dict(env or {}), cwd=cwd, detachable=detachable,
                       detached_timeout=detached_timeout, idempotency_key=idempotency_key,
                       target=target, modes=modes)
        return await self._begin(request, pty, resume)

    async def attach(self, session_id: str, *, steal: bool = False, rows: int | None = None,
                     cols: int | None = None, offsets: Offsets | None = None,
                     resume: float | None = None, role: AttachRole = WRITER,
                     wait: float | None = None, modes: bool = False) -> Session:
        """Take over a detachable session: its scrollback comes first, then live output, then
        its exit (even if it ended while detached). With ``rows`` and ``cols`` its terminal
        is resized first; with ``offsets`` (the bytes already held, per stream) the output
        begins there (`session.offsets` says where). ``resume``, ``modes``: as in `spawn`.
        Raises RequestError: no_such_session, bad_request (an offset beyond the output),
        or session_in_use (attached elsewhere; ``steal`` takes it over, and the other
        client's channel ends; ``wait``: after waiting up to that many seconds for it to
        let go). ``role="observer"`` watches instead
        (section 11): the same output, but nothing it sends reaches the process, it never
        conflicts with the writer, and when it falls a scrollback behind the server skips
        it forward (`session.skipped` counts it). Raises RequestError busy when the session
        has its maximum of observers."""
        return await self._begin(Attach(session=session_id, rows=rows, cols=cols,
                                        steal=steal, offsets=offsets, role=role,
                                        wait=wait, modes=modes), None, resume)

    async def release(self, session_id: str) -> None:
        """Forget an ended session of this principal now, its exit read (`release`)."""
        link = await self._current()
        await self._write(link, link.core.release(session_id))

    async def list_sessions(self) -> list[SessionInfo]:
        """This principal's detachable sessions, running, detached or ended (section 9)."""
        return (await self._ask(lambda core: core.list_sessions(), Sessions)).sessions

    async def list_targets(self) -> list[TargetInfo]:
        """The targets this principal may open (section 15), sorted by name."""
        return (await self._ask(lambda core: core.list_targets(), Targets)).targets

    async def share(self, session_id: str, *, role: Role = OBSERVER,
                    ttl: int | None = None) -> Shared:
        """Make a grant for one of this principal's sessions (section 11): whoever holds
        `shared.grant` may attach it in ``role`` for ``ttl`` seconds (the server's default,
        an hour, when None), without the token. Raises RequestError no_such_session, or
        bad_request for a ttl over the server's --max-share-ttl."""
        return await self._ask(
            lambda core: core.share(Share(session=session_id, role=role, ttl=ttl)), Shared)

    async def unshare(self, grant: str) -> Unshared:
        """Revoke a grant (the grant itself, or its public id): every channel attached
        through it ends with `detached` "revoked" at once. Raises RequestError
        no_such_session for a grant unknown, over, or another's."""
        return await self._ask(lambda core: core.unshare(Unshare(grant=grant)), Unshared)

    async def _ask(self, frame: Callable[[ClientConnection], bytes], kind: type[_A]) -> _A:
        """Send a request on channel 0 and wait for its answer, a ``kind``; raise its
        refusal."""
        link = await self._current()
        waiter: list[_Answer | Exception] = []
        done = anyio.Event()
        self._asked.append((waiter, done))
        await self._write(link, frame(link.core))
        await done.wait()
        answer = waiter[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, Error):
            raise request_error(answer)
        assert isinstance(answer, kind)
        return answer

    async def _begin(self, request: Open | Attach, pty: bool | None,
                     resume: float | None) -> Session:
        link = await self._current()
        channel = next(self._channels)
        frame = link.core.open(channel, request)
        session = Session(self, channel, windowed=self.window is not None, resume=resume,
                          pty=pty, role=request.role if isinstance(request, Attach) else WRITER,
                          modes=request.modes)
        self._sessions[channel] = session
        try:
            await self._write(link, frame)
            await session.wait_answered()
        except BaseException:
            self._give_up(link, channel, request)
            raise
        if resume is not None:
            self._keep_beating()
        return session

    def _give_up(self, link: Wire, channel: int, request: Open | Attach) -> None:
        """The `open` or `attach` was cancelled (or failed) before its answer was taken: an
        opened process is cancelled, not left running unseen; an attached session is
        detached, not killed, once its `attached` comes (at once if it has)."""
        self._sessions.pop(channel, None)
        core = link.core
        if self._failure is not None or link is not self._link or not core.live(channel):
            return  # refused, or the link ended: nothing runs for this channel here
        if isinstance(request, Open):
            link.push(core.cancel(channel))
        elif core.opening(channel):
            self._detach_when_attached.add(channel)
        else:
            link.push(core.control(channel, Detach()))

    # --- each session's Link ---------------------------------------------------------

    def stdin_limit(self, session: Session) -> int:
        if self._resume.waiting is not None:
            return 0  # until the session is attached again
        return self._link.core.stdin_limit(session.channel)

    def live(self, session: Session) -> bool:
        if (waiting := self._resume.waiting) is not None and session in waiting:
            return True
        return self._link.core.live(session.channel)

    async def send_stdin(self, session: Session, data: bytes) -> bool:
        link = await self._current(session)
        if link.core.stdin_limit(session.channel) < len(data):
            return False  # the link changed meanwhile: the session asks again
        if await self._write(link, link.core.stdin(session.channel, data), session):
            return True
        await link.ended.wait()  # lost with its link: asked again once the session is back
        return False

    async def send_control(self, session: Session, message: Message) -> None:
        while True:  # (a signal, say, lost with a link is sent again on the next)
            link = await self._current(session)
            if not link.core.live(session.channel):
                return
            if await self._write(link, link.core.control(session.channel, message), session):
                return
            await link.ended.wait()

    async def cancel(self, session: Session) -> None:
        link = await self._current(session)
        self._sessions.pop(session.channel, None)
        if frame := link.core.cancel(session.channel):
            await self._write(link, frame)

    async def consumed(self, session: Session, size: int) -> None:
        link = self._link
        if self._resume.waiting is None and (
                frame := link.core.output_consumed(session.channel, size)):
            await self._write(link, frame)

    # --- the one writer --------------------------------------------------------------

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _current(self, session: Session | None = None) -> Wire:
        """The link to send on: while a lost one is replaced, requests wait for the new one
        (a session that does not resume has ended meanwhile)."""
        while (waiting := self._resume.waiting) is not None:
            if session is not None and session not in waiting:
                raise ConnectionLost("the connection was lost")
            await self._resume.relinked.wait()
        self._raise_failure()
        return self._link

    async def _write(self, link: Wire, data: bytes, session: Session | None = None) -> bool:
        """Send ``data`` on ``link``; False when the link had broken and ``session`` resumes
        (it sends again on the next link), else ConnectionLost."""
        self._raise_failure()
        try:
            link.push_or_raise(data)
        except anyio.BrokenResourceError:
            if link.early_carrier_end():
                await self._failed.wait()
                self._raise_failure()
            if session is not None and session.resume is not None:
                return False
            raise ConnectionLost("the connection is closed") from None
        await link.outbox.wait_for_room()
        return True

    # --- the reader ------------------------------------------------------------------

    def greeting(self) -> bytes:
        """The connection's first frame, `hello`, to send before `start`."""
        return self._link.core.hello(self._hello)

    def start(self, tasks: anyio.abc.TaskGroup) -> None:
        """Run the reader, and the writer and heartbeat when needed, in ``tasks``."""
        self._tasks = tasks
        self._link.outbox.attach(tasks)
        tasks.start_soon(self._run)
        if self._interval is not None:
            self._keep_beating()

    async def _run(self) -> None:
        """Read link after link until the connection is over, handing each session its
        events; then every session still waiting hears why."""
        failure: Exception | None = None
        try:
            first = self._link
            failure = await first.read(self._dispatch)
            while self._failure is None and self._resume.resumable(
                    failure, list(self._sessions.values())):
                failure = await self._relink(failure, first)
        finally:
            self._fail(failure or ConnectionLost("the connection was closed here"))
            failure = self._failure
            assert failure is not None
            for session in [*list(self._sessions.values()), *self._resume.stop_waiting()]:
                await session.feed(ConnectionEnded(failure))
            self._sessions.clear()

    async def _relink(self, failure: Exception, first: Wire) -> Exception:
        """The link is lost: the sessions that resume wait for a new one, the others end;
        then dial until one is up and read it until it too is lost: what ended it, or why
        resuming gave up."""
        lost = self._link
        others = self._resume.begin(list(self._sessions.values()))  # requests wait from here
        self._sessions.clear()
        self._detach_when_attached.clear()
        self._fail_requests(failure)
        for session in others:
            await session.feed(ConnectionEnded(failure))
        if lost is first and lost.carrier is None:
            await lost.transport.aclose()  # (a writer stuck on a silent peer is let go; the
            # links a resume dials are closed with their stack)
        return await self._resume.redial(failure, self._adopt)

    async def _adopt(self, transport: Transport, carrier: Carrier | None) -> Exception:
        """A new link: `hello`, then an `attach` at its offsets for each waiting session;
        read until it is lost."""
        assert self._tasks is not None
        link = self._link = self._new_link(transport, carrier)
        link.outbox.attach(self._tasks)
        frames = [link.core.hello(self._hello)]
        for session in self._resume.stop_waiting():
            channel = next(self._channels)
            frames.append(link.core.open(channel, session.rejoin(channel)))
            self._sessions[channel] = session
        link.push(*frames)
        return await link.read(self._dispatch)

    async def _dispatch(self, link: Wire, event: ClientEvent) -> None:
        """Hand ``event`` to whom it concerns: the connection (channel 0), or a session."""
        if type(event) is OutputReceived:  # the common case, first
            if (session := self._sessions.get(event.channel)) is not None:
                await session.feed(event)
        elif isinstance(event, _CHANNEL_0) or (
                isinstance(event, ErrorReceived) and event.channel == 0):
            await self._connection_event(link, event)
        else:
            await self._channel_event(link, event)

    async def _connection_event(self, link: Wire, event: ClientEvent) -> None:
        """Channel 0's: a ping, an answer, the `welcome`, an error that ends the link."""
        if isinstance(event, PingReceived):
            link.push(link.core.pong())
        elif isinstance(event, SessionsReceived | AnswerReceived):
            if self._asked:
                waiter, done = self._asked.pop(0)
                waiter.append(event.sessions if isinstance(event, SessionsReceived)
                              else event.answer)
                done.set()
        elif isinstance(event, WelcomeReceived):
            if link.carrier is not None:
                link.carrier.welcomed = True
            for channel, waiting in list(self._sessions.items()):
                await waiting.feed(StdinCreditGranted(channel))  # the window is known now
        elif isinstance(event, ErrorReceived):
            link.failure = request_error(event.error)  # the server closes the link next
            if not link.failure.retriable:
                self._fail(link.failure)

    async def _channel_event(self, link: Wire, event: _ChannelEvent) -> None:
        """A channel's own: its session takes it, and the last one ends it."""
        if isinstance(event, AttachedReceived) and event.channel in self._detach_when_attached:
            self._detach_when_attached.discard(event.channel)
            link.push(link.core.control(event.channel, Detach()))
            return
        ends = isinstance(event, _CHANNEL_ENDS)
        if ends:
            self._detach_when_attached.discard(event.channel)  # refused: nothing to detach
        session = (self._sessions.pop(event.channel, None) if ends
                   else self._sessions.get(event.channel))
        if session is None:
            return
        if isinstance(event, ExitReceived) and session.id is not None and self._release and (
                session.role == WRITER):  # read: it may be forgotten (an observer's
            link.push(link.core.release(session.id))  # exit is not the owner's)
        if isinstance(event, AttachedReceived) and session.resuming:
            self._resume.resumed(session, event.attached)
            if session.eof_again:
                link.push(link.core.control(event.channel, Eof()))
        await session.feed(event)

    # --- the heartbeat ---------------------------------------------------------------

    def _keep_beating(self) -> None:
        """Ping the server when nothing was sent for an interval, and give a link up when
        nothing came for three (a session that resumes needs it, heartbeat or not)."""
        if self._beating or self._tasks is None:
            return
        self._beating = True
        if self._interval is None:
            self._interval = DEFAULT_HEARTBEAT
        self._tasks.start_soon(self._beat)

    async def _beat(self) -> None:
        assert self._interval is not None
        while self._failure is None:
            if self._resume.waiting is not None:
                await self._resume.relinked.wait()
            else:
                await self._link.beat(self._interval)

    # --- the end ---------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        """The connection is over, for ``exc``: every waiter hears it (the sessions once the
        reader has handed them what was received before)."""
        if self._failure is None:
            self._failure = exc
            self._failed.set()
        self._fail_requests(self._failure)

    def _fail_requests(self, failure: Exception) -> None:
        for waiter, done in self._asked:
            waiter.append(failure)
            done.set()
        self._asked.clear()


def _whole_seconds(seconds: float | None) -> int | None:
    """A resume window as `detached_timeout`'s whole seconds (at least 1)."""
    return None if seconds is None else max(1, math.ceil(seconds))
