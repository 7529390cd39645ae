"""A connection to a ttyserve server: the reader, the one writer, the sessions by channel,
and the resume of section 10.

Every rule of the protocol is checked by the sans-I/O core (`protocol/client.py`): a
server that breaks one raises RemoteProtocolError in the sessions waiting on it. The
connection is each session's `Link`, and hands each session its channel's events.

A connection rides on one transport at a time, a link. When a link is lost (reset, EOF,
heartbeat silence, a retriable error such as `server_restarting`) and some of its sessions
were spawned or attached with ``resume``, the connection dials again with backoff, for as
long as those sessions allow, and attaches each at the offsets it holds: their output and
their exit go on as if nothing happened. The others end with ConnectionLost, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from ..defaults import CLIENT_RECEIVE, DEFAULT_HEARTBEAT
from ..errors import ConnectionLost, RemoteProtocolError, RequestError
from ..protocol.client import (
    AnswerReceived,
    AttachedReceived,
    ClientConnection,
    ClientEvent,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    NoticeReceived,
    OpenRefused,
    OutputReceived,
    PingReceived,
    SessionsReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ..protocol.heartbeat import Beat, Heartbeat
from ..protocol.messages import (
    DEFAULT_COLS,
    DEFAULT_ROWS,
    DEFAULT_TERM,
    OBSERVER,
    WRITER,
    Attach,
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
    Unshare,
    Unshared,
    Welcome,
    request_error,
)
from ..transport.outbox import Outbox
from ..transport.streams import Transport
from .retry import RETRIED, backoff, retriable
from .session import ConnectionEnded, Lost, Resumed, ResumeEvent, Session

if TYPE_CHECKING:
    from .carrier import Carrier

FIRST_BYTES_SHOWN = 60
_CHANNEL_ENDS = (ExitReceived, DetachedReceived, OpenRefused)  # a channel's last event
_Answer = Sessions | Shared | Unshared | Error  # what a request on channel 0 gets
# Dial a new link, its resources (a carrier) entered into the stack, within a time (where it
# can be bounded: a carrier's ssh has its own): what `connect` did.
Dial = Callable[[contextlib.AsyncExitStack, float],
                Awaitable[tuple[Transport, "Carrier | None"]]]
WELCOME_WAIT = 60.0  # seconds a link may take to its `welcome` (an ssh asking a password)


@dataclass(eq=False)
class _Link:
    """One transport under the connection: the first, or one a resume dialled."""

    transport: Transport
    core: ClientConnection
    carrier: Carrier | None
    outbox: Outbox = field(init=False)
    heartbeat: Heartbeat | None = None
    failure: Exception | None = None  # why it ended, where that was decided here
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # the reader's
    delivering: bool = False  # the reader waits for a session to take output, not for bytes
    ended: anyio.Event = field(default_factory=anyio.Event)  # its reader is done with it
    started: float = field(default_factory=time.monotonic)
    first_bytes: bytes = b""  # what the server sent first: shown if it is not the protocol


class Connection:
    """A connection to a ttyserve server; made by `connect`."""

    def __init__(self, transport: Transport, hello: Hello, carrier: Carrier | None = None, *,
                 redial: Dial | None = None,
                 on_resume: Callable[[ResumeEvent], None] | None = None) -> None:
        self._hello = hello
        self.multiplex = hello.multiplex
        self.window = hello.window
        self._redial = redial
        self._on_resume = on_resume
        self._interval: float | None = hello.heartbeat  # our heartbeat, when there is one
        self._tasks: anyio.abc.TaskGroup | None = None
        self._beating = False
        self._link = self._new_link(transport, carrier)
        self._sessions: dict[int, Session] = {}  # by channel, on the current link
        self._detach_when_attached: set[int] = set()  # attaches whose waiter gave up
        # Requests on channel 0 waiting for their answers, which come in the order asked.
        self._asked: list[tuple[list[_Answer | Exception], anyio.Event]] = []
        self._channels = itertools.count(1)
        self._resuming: list[Session] | None = None  # while a lost link is replaced
        self._attempt = 0  # links dialled since a session last came back (the backoff)
        self._relinked = anyio.Event()  # set when the resume is over, either way
        self._failure: Exception | None = None
        self._failed = anyio.Event()  # set with _failure

    def _new_link(self, transport: Transport, carrier: Carrier | None) -> _Link:
        link = _Link(transport, ClientConnection(), carrier)
        link.outbox = Outbox(transport, on_broken=lambda: self._send_failed(link))
        if self._interval is not None:
            link.heartbeat = Heartbeat(self._interval, time.monotonic())
        return link

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
    ) -> Session:
        """Open a session and wait for `opened`. Raises RequestError if refused.

        A ``detachable`` session outlives this connection: `session.id` names it for
        `attach`, and it keeps a scrollback of its output meanwhile (section 9).

        With ``resume`` (seconds) the session is detachable, the server hangs it up once
        it has been without a client that long, and this connection, when it loses the
        server, dials again for up to that long and attaches it where its output stopped:
        iterating it and `wait()` go on across the reconnect, every byte once. Without a
        ``heartbeat`` given to `connect`, the connection pings every DEFAULT_HEARTBEAT
        seconds itself, so a silent link is noticed.
        """
        if resume is not None:
            detachable = True
        request = Open(argv=list(argv or []), pty=pty, rows=rows, cols=cols, term=term,
                       env=dict(env or {}), cwd=cwd, detachable=detachable,
                       detached_timeout=_whole_seconds(resume))
        return await self._begin(request, pty, resume)

    async def attach(self, session_id: str, *, steal: bool = False, rows: int | None = None,
                     cols: int | None = None, offsets: Offsets | None = None,
                     resume: float | None = None, role: Role = WRITER) -> Session:
        """Take over a detachable session: its scrollback comes first, then live output, then
        its exit (even if it ended while detached). With ``rows`` and ``cols`` its terminal
        is resized first; with ``offsets`` (the bytes already held, per stream) the output
        begins there, and `session.offsets` says where it really began. ``resume``: as in
        `spawn`. Raises RequestError: no_such_session, bad_request (an offset beyond the
        output), or session_in_use (attached elsewhere; ``steal`` takes it over, and the
        other client's channel ends).

        ``role="observer"`` watches instead (section 11): the same output, but nothing it
        sends reaches the process, it never conflicts with the writer, and when it falls
        a scrollback behind the server skips it forward (`session.skipped` counts it).
        Raises RequestError busy when the session has its maximum of observers."""
        return await self._begin(Attach(session=session_id, rows=rows, cols=cols,
                                        steal=steal, offsets=offsets, role=role), None, resume)

    async def list_sessions(self) -> list[SessionInfo]:
        """This principal's detachable sessions, running, detached or ended (section 9),
        each with its observers and open grants."""
        link = await self._current()
        answer = await self._ask(link, link.core.list_sessions())
        assert isinstance(answer, Sessions)
        return answer.sessions

    async def share(self, session_id: str, *, role: Role = OBSERVER,
                    ttl: int | None = None) -> Shared:
        """Make a grant for one of this principal's sessions (section 11): whoever holds
        `shared.grant` may attach it in ``role`` for ``ttl`` seconds (the server's default,
        an hour, when None), without the token. Raises RequestError no_such_session, or
        bad_request for a ttl over the server's --max-share-ttl."""
        link = await self._current()
        answer = await self._ask(link, link.core.share(Share(session=session_id, role=role,
                                                             ttl=ttl)))
        assert isinstance(answer, Shared)
        return answer

    async def unshare(self, grant: str) -> Unshared:
        """Revoke a grant (the grant itself, or its public id): every channel attached
        through it ends with `detached` "revoked" at once. Raises RequestError
        no_such_session for a grant unknown, over, or another's."""
        link = await self._current()
        answer = await self._ask(link, link.core.unshare(Unshare(grant=grant)))
        assert isinstance(answer, Unshared)
        return answer

    async def _ask(self, link: _Link, frame: bytes) -> _Answer:
        """Send a request on channel 0 and wait for its answer; raise its refusal."""
        waiter: list[_Answer | Exception] = []
        done = anyio.Event()
        self._asked.append((waiter, done))
        await self._write(link, frame)
        await done.wait()
        answer = waiter[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, Error):
            raise request_error(answer)
        return answer

    async def _begin(self, request: Open | Attach, pty: bool | None,
                     resume: float | None) -> Session:
        link = await self._current()
        channel = next(self._channels)
        frame = link.core.open(channel, request)
        session = Session(self, channel, windowed=self.window is not None, resume=resume)
        session.pty = pty  # until the server says (a server that does not: what was asked)
        if isinstance(request, Attach):
            session.role = request.role  # what was asked, until `attached` confirms it
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

    def _give_up(self, link: _Link, channel: int, request: Open | Attach) -> None:
        """The `open` or `attach` was cancelled (or failed) before its answer was taken: an
        opened process is cancelled, not left running unseen; an attached session is
        detached, not killed, once its `attached` comes (at once if it has)."""
        self._sessions.pop(channel, None)
        core = link.core
        if self._failure is not None or link is not self._link or not core.live(channel):
            return  # refused, or the link ended: nothing runs for this channel here
        if isinstance(request, Open):
            self._push(link, core.cancel(channel))
        elif core.opening(channel):
            self._detach_when_attached.add(channel)
        else:
            self._push(link, core.control(channel, Detach()))

    # --- each session's Link ---------------------------------------------------------

    def stdin_limit(self, session: Session) -> int:
        if self._resuming is not None:
            return 0  # until the session is attached again
        return self._link.core.stdin_limit(session.channel)

    def live(self, session: Session) -> bool:
        if self._resuming is not None and session in self._resuming:
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
        if self._resuming is None and (frame := link.core.output_consumed(session.channel,
                                                                          size)):
            await self._write(link, frame)

    # --- the one writer --------------------------------------------------------------

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _current(self, session: Session | None = None) -> _Link:
        """The link to send on: while a lost one is replaced, requests wait for the new one
        (a session that does not resume has ended meanwhile)."""
        while self._resuming is not None:
            if session is not None and session not in self._resuming:
                raise ConnectionLost("the connection was lost")
            await self._relinked.wait()
        self._raise_failure()
        return self._link

    async def _write(self, link: _Link, data: bytes, session: Session | None = None) -> bool:
        """Send ``data`` on ``link``; False when the link had broken and ``session`` resumes
        (it sends again on the next link), else ConnectionLost."""
        self._raise_failure()
        try:
            self._push_or_raise(link, data)
        except anyio.BrokenResourceError:
            if self._early_carrier_end(link):
                await self._failed.wait()
                self._raise_failure()
            if session is not None and session.resume is not None:
                return False
            raise ConnectionLost("the connection is closed") from None
        await link.outbox.wait_for_room()
        return True

    def _push_or_raise(self, link: _Link, data: bytes) -> None:
        if (heartbeat := link.heartbeat) is not None:
            heartbeat.last_sent = time.monotonic()
        link.outbox.push([data])

    def _push(self, link: _Link, frame: bytes) -> None:
        """Send ``frame`` with no waiting (from where nothing can wait: a cancel, the reader)."""
        with contextlib.suppress(anyio.BrokenResourceError):
            self._push_or_raise(link, frame)

    def _early_carrier_end(self, link: _Link) -> bool:
        """Whether a break now is a carrier's before `welcome`: the read loop sees its stdout
        close and fails the link with its class (a send that broke first must not say
        less)."""
        return link.carrier is not None and link.core.welcome is None

    def _send_failed(self, link: _Link) -> None:
        """The reader goes on: what the server sent before the break is still delivered."""
        if not self._early_carrier_end(link) and link.failure is None:
            link.failure = ConnectionLost("send failed: the connection broke")

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
            failure = await self._read(first)
            while self._resumable(failure):
                failure = await self._resume(failure, first)
        finally:
            self._fail(failure or ConnectionLost("the connection was closed here"))
            failure = self._failure
            assert failure is not None
            for session in [*list(self._sessions.values()), *(self._resuming or [])]:
                await session.feed(ConnectionEnded(failure))
            self._sessions.clear()
            self._resuming = None
            self._relinked.set()

    def _resumable(self, failure: Exception) -> bool:
        """Whether the link was lost in a way a new one may mend, with a session to mend."""
        if (self._redial is None or self._failure is not None
                or isinstance(failure, RemoteProtocolError)
                or (isinstance(failure, RequestError) and not failure.retriable)):
            return False
        if isinstance(failure, RequestError | ConnectionLost) or retriable(failure)[0]:
            return any(s.resume is not None and s.id is not None and s.answered
                       for s in self._sessions.values())
        return False

    async def _resume(self, failure: Exception, first: _Link) -> Exception:
        """Dial until a link is up, attach every resuming session on it at its offsets, and
        read it until it too is lost: what ended it, or why resuming gave up."""
        assert self._redial is not None
        lost = self._link
        resuming = [s for s in self._sessions.values()
                    if s.resume is not None and s.id is not None and s.answered]
        others = [s for s in self._sessions.values() if s not in resuming]
        self._resuming = resuming  # from here on requests wait for the next link
        self._relinked = anyio.Event()
        self._sessions.clear()
        self._detach_when_attached.clear()
        self._fail_requests(failure)
        for session in others:
            await session.feed(ConnectionEnded(failure))
        if lost is first and lost.carrier is None:
            await lost.transport.aclose()  # (a writer stuck on a silent peer is let go; the
            # links a resume dials are closed with their stack)
        now = time.monotonic()
        for session in resuming:
            if session.lost_at is None:
                session.lost_at = now
                self._tell(Lost(session, str(failure)))
        while True:
            if self._attempt:  # the last link failed too: back off (the server's hint first)
                await anyio.sleep(min(backoff(self._attempt - 1, retriable(failure)[1]),
                                      self._time_left(resuming)))
            self._attempt += 1
            now = time.monotonic()
            for session in list(resuming):
                assert session.lost_at is not None and session.resume is not None
                if now - session.lost_at >= session.resume:
                    resuming.remove(session)
                    await session.feed(ConnectionEnded(ConnectionLost(
                        f"could not resume within {session.resume:g} s: {failure}")))
            if not resuming:
                return failure
            async with contextlib.AsyncExitStack() as stack:
                try:
                    transport, carrier = await self._redial(stack, self._time_left(resuming))
                except RETRIED as exc:
                    failure = exc
                else:
                    link = self._new_link(transport, carrier)
                    self._adopt(link, resuming)
                    return await self._read(link)  # (then `_run` decides again)

    @staticmethod
    def _time_left(resuming: list[Session]) -> float:
        """Seconds until the last of ``resuming`` gives up (at least a moment)."""
        now = time.monotonic()
        return max(0.01, max(s.resume - (now - s.lost_at)  # type: ignore[operator]
                             for s in resuming))

    def _adopt(self, link: _Link, resuming: list[Session]) -> None:
        """The new link: `hello`, then an `attach` with offsets (and steal: the server may
        not know yet that the old link is dead; an observer's is its role again) for each
        resuming session."""
        assert self._tasks is not None
        link.outbox.attach(self._tasks)
        frames = [link.core.hello(self._hello)]
        for session in resuming:
            assert session.id is not None
            channel = next(self._channels)
            frames.append(link.core.open(channel, Attach(
                session=session.id, steal=session.role == WRITER, offsets=session.offsets,
                role=session.role)))
            session.channel = channel
            self._sessions[channel] = session
        self._link = link
        self._resuming = None
        self._relinked.set()
        with contextlib.suppress(anyio.BrokenResourceError):
            if (heartbeat := link.heartbeat) is not None:
                heartbeat.last_sent = time.monotonic()
            link.outbox.push(frames)

    def _tell(self, event: ResumeEvent) -> None:
        if self._on_resume is not None:
            self._on_resume(event)

    async def _read(self, link: _Link) -> Exception:
        """Read ``link`` until it ends: why it ended (the heartbeat may cut it short)."""
        try:
            with link.scope:
                return await self._read_until_lost(link)
            return link.failure or ConnectionLost("the connection was given up")
        finally:
            link.ended.set()

    async def _read_until_lost(self, link: _Link) -> Exception:
        core = link.core
        try:
            while True:
                try:
                    data = await link.transport.receive(CLIENT_RECEIVE)
                except anyio.EndOfStream:
                    break
                if (heartbeat := link.heartbeat) is not None:
                    heartbeat.last_received = time.monotonic()
                if not link.first_bytes:
                    link.first_bytes = data[:FIRST_BYTES_SHOWN]
                core.receive_data(data)
                link.delivering = True
                while (event := core.next_event()) is not None:
                    await self._dispatch(link, event)
                link.delivering = False
            return (link.failure or await self._carrier_failure(link)
                    or ConnectionLost("the server closed the connection"))
        except (anyio.BrokenResourceError, OSError) as exc:
            return (link.failure or await self._carrier_failure(link)
                    or ConnectionLost(f"connection lost: {exc}"))
        except anyio.ClosedResourceError as exc:
            return link.failure or ConnectionLost(f"connection lost: {exc}")
        except RemoteProtocolError as exc:
            if self._early_carrier_end(link):
                return RemoteProtocolError(
                    f"{exc.message}; the far side began with {link.first_bytes!r}, which is "
                    "not the protocol (does a shell startup file print something?)", exc.code)
            return exc

    async def _carrier_failure(self, link: _Link) -> Exception | None:
        """A carrier that ended before `welcome`: its class."""
        if self._early_carrier_end(link):
            assert link.carrier is not None
            return await link.carrier.failure()
        return None

    async def _dispatch(self, link: _Link, event: ClientEvent) -> None:
        if type(event) is OutputReceived:  # the common case, first
            if (session := self._sessions.get(event.channel)) is not None:
                await session.feed(event)
        elif isinstance(event, PingReceived):
            self._push(link, link.core.pong())
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
        elif isinstance(event, ErrorReceived) and event.channel == 0:
            link.failure = request_error(event.error)  # the server closes the link next
            if not link.failure.retriable:
                self._fail(link.failure)
        elif isinstance(event, NoticeReceived):
            if (session := self._sessions.get(event.channel)) is not None:
                await session.feed(event)
        elif isinstance(event, AttachedReceived) and event.channel in self._detach_when_attached:
            self._detach_when_attached.discard(event.channel)
            self._push(link, link.core.control(event.channel, Detach()))
        else:  # the channel's own: its session takes it, and the last one ends it
            ends = isinstance(event, _CHANNEL_ENDS)
            if ends:
                self._detach_when_attached.discard(event.channel)  # refused: nothing to detach
            session = (self._sessions.pop(event.channel, None) if ends
                       else self._sessions.get(event.channel))
            if session is None:
                return
            if isinstance(event, ExitReceived) and session.id is not None and (
                    session.role == WRITER):  # read: it may be forgotten (an observer's
                self._push(link, link.core.release(session.id))  # exit is not the owner's)
            if isinstance(event, AttachedReceived) and session.lost_at is not None:
                self._resumed(link, session, event)
            await session.feed(event)

    def _resumed(self, link: _Link, session: Session, event: AttachedReceived) -> None:
        """A resuming session is attached again: what the ring no longer held is lost."""
        assert session.lost_at is not None
        begins = event.attached.offsets or Offsets()
        lost = (max(0, begins.stdout - session.offsets.stdout)
                + max(0, begins.stderr - session.offsets.stderr))
        after = time.monotonic() - session.lost_at
        session.lost_at = None
        self._attempt = 0
        session.lost_bytes += lost
        self._tell(Resumed(session, after, lost))
        session.wake_sender()  # what it sends goes on the new link
        if session.eof_sent and session.pty is False:
            # The `eof` may have been lost with the link (input is not exact across a resume),
            # and a process that waits for it would wait for ever; closing a pipe twice is
            # nothing. (Not a PTY's: a second end-of-file character could end its shell.)
            self._push(link, link.core.control(event.channel, Eof()))

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
            if self._resuming is not None:
                await self._relinked.wait()
                continue
            link = self._link
            heartbeat = link.heartbeat = link.heartbeat or Heartbeat(self._interval,
                                                                     time.monotonic())
            now = time.monotonic()
            beat = heartbeat.check(now)
            if beat is Beat.DEAD and (link.delivering or (
                    link.core.welcome is None and now - link.started < WELCOME_WAIT)):
                # We hold the reader back, not the server; or the far side is still being
                # reached (an ssh may ask for a password): bounded by WELCOME_WAIT instead.
                heartbeat.last_received = now
            elif beat is Beat.DEAD:
                link.failure = link.failure or ConnectionLost(
                    f"nothing came for {heartbeat.silence_limit:g} s (heartbeat)")
                link.scope.cancel()
                await link.ended.wait()  # the reader moved on (to the next link, or the end)
                continue
            elif beat is Beat.PING:
                self._push(link, link.core.ping())
                heartbeat.last_sent = now
            await anyio.sleep(max(0.0, heartbeat.next_check() - time.monotonic()))

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
