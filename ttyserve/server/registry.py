"""Sessions belong to the server: admission, spawn, the journal, ids, attach and steal, the
hang-up at shutdown, the detached timeout.

A connection asks the registry to open a session, or to attach to one, and
attaches a channel to it; the session runs on the loop's callbacks or in the
registry's task group, never the connection's, so a session can outlive the
connection that opened it.
"""

from __future__ import annotations

import errno
import itertools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from ..backends.base import Backend, ProcessHandle, ProcessSpec, SpawnsAtOnce
from ..backends.local import ChildBackend
from ..defaults import BUSY_RETRY_MS, DEFAULT_SHARE_TTL, UPGRADE_RETRY_MS
from ..errors import ErrorCode, RequestError
from ..protocol.messages import (
    EXPIRED,
    OBSERVER,
    REVOKED,
    STOLEN,
    WRITER,
    Attach,
    Exit,
    Open,
    SessionInfo,
    Share,
    members,
)
from ..version import __version__
from .attachment import LOST
from .grants import Grant, Grants
from .handover import ExitedProcess, GrantState, SessionState
from .journal import (
    Journal,
    Reason,
    Record,
    ServerUpgrade,
    SessionAttach,
    SessionDetach,
    SessionEnd,
    SessionShare,
    SessionUnshare,
)
from .life import Event
from .observer import Observer
from .recording import Recording, finish_recording, start_recording
from .scrollback import OffsetBeyondOutput
from .session import ServerSession, Sink
from .settings import ServerSettings
from .tasks import Tasks, open_tasks
from .typing_first import Typing

log = logging.getLogger("ttyserve")

QUIET_POLL = 0.01  # seconds between looks for a state that can be handed over


def busy(message: str) -> RequestError:
    return RequestError(ErrorCode.BUSY, message, retry_after_ms=BUSY_RETRY_MS)


def shutting_down() -> RequestError:
    return RequestError(ErrorCode.SHUTTING_DOWN, "the server is shutting down",
                        retry_after_ms=BUSY_RETRY_MS)


def restarting() -> RequestError:
    return RequestError(ErrorCode.SERVER_RESTARTING, "the server is upgrading itself in place",
                        retry_after_ms=UPGRADE_RETRY_MS)


def _spawn_failed(exc: OSError, peer: str) -> RequestError:
    log.info("%s: spawn failed: %s", peer, exc)
    return RequestError(ErrorCode.SPAWN_FAILED, str(exc.strerror or exc),
                        errno=exc.errno or errno.EIO)


def new_session_id() -> str:
    """128 random bits, URL-safe: unguessable, so it can name a session to reattach. An `s`
    first: an id is typed as an argument (`ttyserve attach ID`), and one that began with
    `-` (one in 64 of them) would read as an option."""
    return "s" + secrets.token_urlsafe(16)


class JournalIds:
    """Ids for sessions no client can name (not detachable): unique, not secret, so cheap:
    this server's random prefix and a count (the journal outlives the server)."""

    def __init__(self) -> None:
        self._prefix = secrets.token_urlsafe(9) + "."
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count)}"


class SessionRegistry:
    """Every live session of one server, by id."""

    def __init__(self, settings: ServerSettings, backend: Backend,
                 journal: Journal | None = None) -> None:
        self.settings = settings
        self.backend = backend
        self._spawn_nowait: Callable[[ProcessSpec], ProcessHandle] | None = (
            backend.spawn_nowait if isinstance(backend, SpawnsAtOnce) else None)
        self.journal = journal
        # Running sessions, and detachable ones whose exit waits for a client (until it is
        # delivered, or --detached-timeout passes).
        self.sessions: dict[str, ServerSession] = {}
        self.grants = Grants()  # section 11: who may attach without the token
        self.typing = Typing()  # interactive first: while anyone types, others read small
        self.closing = False  # a graceful shutdown began: no new sessions
        self.restarting = False  # an upgrade in place began: no new sessions or attaches
        self._opening = 0  # admitted opens that await their spawn or start record
        self._noting = 0  # detach and attach records not written yet
        self._running = 0
        self._task_group: anyio.abc.TaskGroup | None = None
        self._tasks: Tasks | None = None  # sessions and their input pumps run here
        self._emptied: anyio.Event | None = None
        self._replan: anyio.Event | None = None  # the sweeper waits: a deadline moved
        self._journal_id = JournalIds()
        self._kill_leftovers = settings.leftovers == "kill"
        self._default_argv = settings.default_argv  # each read of these makes them anew
        self._policy = settings.policy

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionRegistry]:
        """The task group sessions run in; on the way out, every session still running is
        cancelled (killed and reaped)."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            tg.start_soon(self._sweep)
            try:
                async with open_tasks(tg) as self._tasks:
                    yield self
            finally:
                tg.cancel_scope.cancel()
                self._task_group = self._tasks = None

    # --- admission ----------------------------------------------------------------------

    def spec_for(self, request: Open, session_id: str | None = None) -> ProcessSpec:
        """What to run for an `open`: its members, the server's defaults where it has none
        (and the session's id, which names its cgroup)."""
        return ProcessSpec(
            argv=list(request.argv) or list(self._default_argv), pty=request.pty,
            rows=request.rows, cols=request.cols, term=request.term, env=dict(request.env),
            cwd=request.cwd or self.settings.default_cwd, name=session_id)

    def admit(self, sessions_here: int) -> None:
        """RequestError when no session may start now: shutting_down, or busy (the server's
        or this connection's limit)."""
        if self.closing:
            raise shutting_down()
        if self.restarting:
            raise restarting()
        if len(self.sessions) + self._opening >= self.settings.max_sessions:
            raise busy(f"the server runs its maximum of {self.settings.max_sessions} sessions")
        self.check_room(sessions_here)

    def check_room(self, sessions_here: int) -> None:
        """RequestError(busy) when a connection carries its maximum of sessions."""
        limit = self.settings.max_sessions_per_connection
        if sessions_here >= limit:
            raise busy(f"this connection runs its maximum of {limit} sessions")

    async def open(self, request: Open, owner: str, peer: str,
                   sessions_here: int) -> ServerSession:
        """Admit and spawn a session, its start record on disk before it is returned (so
        before `opened` is sent); RequestError says why not (shutting_down, busy,
        bad_request or forbidden from the policy, spawn_failed)."""
        session_id = self._new_id(request.detachable)
        spec = self._admit_open(request, peer, sessions_here, session_id)
        self._opening += 1  # counted against --max-sessions while it awaits
        try:
            try:
                process = await self.backend.spawn(spec)
            except OSError as exc:
                failure = exc.errno
                await self._record(lambda journal: journal.append(
                    journal.start_record(session_id, peer, spec.argv, spec.pty, None),
                    SessionEnd(id=session_id, at=journal.now(), reason=Reason.SPAWN_FAILED,
                               errno=failure)))
                raise _spawn_failed(exc, peer) from exc
            session = self._session(session_id, process, spec, owner, peer,
                                    request.detachable, request.detached_timeout)
            # Shielded: a cancel now must not leave a process without its record, nor its
            # owner.
            session.life.recorded = await self._record(lambda journal: journal.append(
                journal.start_record(session_id, peer, spec.argv, spec.pty, process.pid,
                                     process.cgroup_path)))
        finally:
            self._opening -= 1
        return self._admitted(session)

    def open_nowait(self, request: Open, owner: str, peer: str,
                    sessions_here: int) -> ServerSession | None:
        """`open` where nothing has to be awaited (no journal, and a backend with
        `spawn_nowait`): the session, or RequestError as `open` raises; None when the open
        has to be awaited."""
        spawn_nowait = self._spawn_nowait
        if self.journal is not None or spawn_nowait is None:
            return None
        session_id = self._new_id(request.detachable)
        spec = self._admit_open(request, peer, sessions_here, session_id)
        try:
            process = spawn_nowait(spec)
        except OSError as exc:
            raise _spawn_failed(exc, peer) from exc
        return self._admitted(
            self._session(session_id, process, spec, owner, peer, request.detachable,
                          request.detached_timeout))

    def _new_id(self, detachable: bool) -> str:
        """A detachable session's id names it to whoever attaches: unguessable. Another's
        only tells its records apart."""
        return new_session_id() if detachable else self._journal_id()

    def _admit_open(self, request: Open, peer: str, sessions_here: int,
                    session_id: str) -> ProcessSpec:
        """What an `open` runs, once admitted: RequestError when it may not."""
        settings = self.settings
        self.admit(sessions_here)
        if request.detachable and not settings.keeps_detached:
            raise RequestError(ErrorCode.BAD_REQUEST, "this server cannot keep a detachable "
                               "session: it ends with its one connection (serve --stdio)")
        if request.detached_timeout is not None:
            if not request.detachable:
                raise RequestError(ErrorCode.BAD_REQUEST, "detached_timeout needs "
                                   "detachable: true")
            if request.detached_timeout > settings.detached_timeout:
                raise RequestError(ErrorCode.BAD_REQUEST, (
                    f"detached_timeout {request.detached_timeout} is over this server's "
                    f"--detached-timeout of {settings.detached_timeout:g} s"))
        try:
            self._policy.check(request)
        except RequestError as exc:
            log.warning("%s: %s: %s", peer, exc.code, exc.message)
            raise
        return self.spec_for(request, session_id)

    def _session(self, session_id: str, process: ProcessHandle, spec: ProcessSpec, owner: str,
                 peer: str, detachable: bool, detached_timeout: int | None) -> ServerSession:
        session = ServerSession(session_id, process, spec, peer, self._start_task,
                                linger=self.settings.linger, owner=owner,
                                scrollback=self.settings.scrollback if detachable else None,
                                detached_timeout=detached_timeout or self.settings.detached_timeout,
                                kill_leftovers=self._kill_leftovers, typing=self.typing)
        session.on_delivered = self._delivered  # (told the session: no cycle through it)
        return session

    def _admitted(self, session: ServerSession) -> ServerSession:
        settings = self.settings
        assert self._task_group is not None, "SessionRegistry.running() is not entered"
        if settings.record is not None:
            start_recording(session, settings.record, settings.record_input,
                            self._task_group)
        self.sessions[session.id] = session
        if self.closing:  # the shutdown began while it was spawned: hung up as the others
            session.hang_up()
        return session

    def attach(self, request: Attach, owner: str, sessions_here: int,
               grant: Grant | None = None) -> ServerSession:
        """Admit an attach to ``owner``'s detachable session (or, through ``grant``, to the
        grant's): RequestError shutting_down, unauthorized (the grant has ended),
        no_such_session (unknown, expired or being ended, not detachable, or another
        principal's, alike so its existence is not revealed), session_in_use (a writer
        attached elsewhere, unless ``request.steal``: the other channel then ends with
        `detached` "stolen"), or busy (the connection's sessions, or the session's
        observers). Observers never conflict with anyone."""
        if self.closing:
            raise shutting_down()
        if self.restarting:
            raise restarting()
        if grant is not None:
            if not self.grants.live(grant):
                raise RequestError(ErrorCode.UNAUTHORIZED, "the grant this connection came "
                                   "with has expired or was revoked")
            owner = grant.owner
        session = self._owned(request.session, owner)
        observing = request.role == OBSERVER
        if observing:
            limit = self.settings.max_observers
            if len(session.observers) >= limit:
                raise busy(f"the session has its maximum of {limit} observers")
        elif session.sink is not None and not request.steal:
            raise RequestError(ErrorCode.SESSION_IN_USE, "the session is attached elsewhere "
                               "(attach with steal to take it over, or as an observer)")
        self.check_room(sessions_here)
        if (offsets := request.offsets) is not None:
            assert session.ring is not None
            try:
                session.ring.since(offsets.stdout, offsets.stderr)
            except OffsetBeyondOutput as exc:
                raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None
        previous = session.sink
        if not observing and previous is not None:
            session.sink = None  # (the attach that follows takes it)
            self.cut(session, previous, STOLEN)
        return session  # (the sweeper plans again with the attach's `note_soon`)

    def _owned(self, session_id: str, owner: str) -> ServerSession:
        """``owner``'s detachable session, not being ended; RequestError no_such_session for
        anything else (unknown, expired, not detachable, another principal's: alike, so
        its existence is not revealed)."""
        session = self.sessions.get(session_id)
        if (session is None or not session.detachable or session.owner != owner
                or session.life.reason is not None):
            raise RequestError(ErrorCode.NO_SUCH_SESSION,
                               "no such session: unknown, ended, or not yours")
        return session

    def cut(self, session: ServerSession, channel: Sink | Observer, reason: str) -> None:
        """End one channel of ``session`` with `detached` ``reason`` (stolen, or its grant
        revoked or expired); the session goes on (detached, when it was its writer and no
        other takes over)."""
        channel.release(reason)
        if session.sink is channel:
            session.detach()
        self.note_soon(session, SessionDetach, channel.peer, role=channel.role,
                       grant=channel.grant, reason=reason)

    # --- grants (section 11) ------------------------------------------------------------

    def share(self, request: Share, owner: str, peer: str) -> tuple[str, Grant]:
        """A grant for ``owner``'s session: the secret and its record; RequestError
        bad_request (a ttl over --max-share-ttl) or no_such_session (as `attach`)."""
        limit = self.settings.max_share_ttl
        ttl = request.ttl if request.ttl is not None else min(DEFAULT_SHARE_TTL, limit)
        if ttl > limit:
            raise RequestError(ErrorCode.BAD_REQUEST, f"ttl {ttl} is over this server's "
                               f"--max-share-ttl of {limit} s")
        session = self._owned(request.session, owner)
        if session.final is not None:
            raise RequestError(ErrorCode.NO_SUCH_SESSION,
                               "no such session: unknown, ended, or not yours")
        secret, grant = self.grants.make(session.id, request.role, ttl, owner)
        log.info("%s: session %s shared (%s, grant %s, until %s)", peer, session.id,
                 grant.role, grant.id, grant.expires_at)
        self.deadline_moved()
        self._record_soon(SessionShare, session.id, peer=peer, grant=grant.id,
                          role=grant.role, expires=grant.expires_at)
        return secret, grant

    def unshare(self, name: str, owner: str, peer: str) -> tuple[Grant, int]:
        """Revoke ``owner``'s grant (named by the grant or its public id): every channel
        attached through it ends with `detached` "revoked"; the grant and how many ended.
        RequestError no_such_session for a grant that is unknown, over, or another's."""
        grant = self.grants.find(name, owner)
        if grant is None:
            raise RequestError(ErrorCode.NO_SUCH_SESSION,
                               "no such grant: unknown, expired, or not yours")
        return grant, self._end_grant(grant, REVOKED, peer)

    def _end_grant(self, grant: Grant, reason: str, peer: str | None = None) -> int:
        """The grant is over (revoked by ``peer``, or expired): its channels end with
        `detached` ``reason``, and the journal says so; how many channels."""
        self.grants.remove(grant)
        session = self.sessions.get(grant.session)
        through = [] if session is None else [
            channel for channel in (session.sink, *session.observers)
            if channel is not None and channel.grant == grant.id]
        for channel in through:
            assert session is not None
            self.cut(session, channel, reason)
        log.info("%sgrant %s of session %s %s (%d channels detached)",
                 f"{peer}: " if peer else "", grant.id, grant.session, reason, len(through))
        self._record_soon(SessionUnshare, grant.session, peer=peer, grant=grant.id,
                          reason=reason, channels=len(through))
        return len(through)

    def _expire_grants(self, now: float) -> float | None:
        """End the grants whose time ran out; the wall-clock time the next one does."""
        for grant in self.grants.due(now):
            self._end_grant(grant, EXPIRED)
        return self.grants.nearest()

    def listing(self, owner: str) -> list[SessionInfo]:
        """``owner``'s detachable sessions, for `list`."""
        return [SessionInfo(session=s.id, argv=s.spec.argv, pid=s.pid, pty=s.spec.pty,
                            started=s.started, attached=s.sink is not None,
                            exit=members(s.final) if s.final else None,
                            observers=len(s.observers),
                            grants=[grant.info() for grant in self.grants.of_session(s.id)])
                for s in self.sessions.values() if s.detachable and s.owner == owner]

    # --- running -----------------------------------------------------------------------

    def start(self, session: ServerSession) -> None:
        """Run an opened (and attached) session: on the loop's callbacks alone where it can,
        else as a task of the registry's."""
        assert self._tasks is not None, "SessionRegistry.running() is not entered"
        self._running += 1
        if not session.start(self._session_over):
            self._tasks.start_soon(self._run, session, scope=session.cancel_scope())

    def _start_task(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert self._tasks is not None, "SessionRegistry.running() is not entered"
        self._tasks.start_soon(work)

    async def _run(self, session: ServerSession) -> None:
        """A session's task, where the loop has no readiness callbacks for all of it."""
        status: Exit | None = None
        try:
            status = await session.run()
        except Exception:  # one session's bug must not take the server down
            log.exception("session %s failed", session.id)
        finally:
            await self._end(session, status)

    def _session_over(self, session: ServerSession, status: Exit | None) -> None:
        """A session on readiness callbacks alone is over (``status``), or must be ended
        (None: cancelled, a fault). What is left is done at once when nothing has to be
        awaited, else in a task: the kill and the reap, the recording, the journal."""
        if status is not None and not session.life.recorded and not session.taps:
            session.close()
            self._ending(session, status)
            self._ended(session)
        else:
            assert self._tasks is not None, "SessionRegistry.running() is not entered"
            self._tasks.start_soon(self._finish, session, status, scope=session.cancel_scope())

    async def _finish(self, session: ServerSession, status: Exit | None) -> None:
        try:
            await session.aclose()
        finally:
            await self._end(session, status)

    async def _end(self, session: ServerSession, status: Exit | None) -> None:
        """What a session leaves behind: its channel's end, its recording, its end record."""
        self._ending(session, status)
        await finish_recording(session)  # its exit, then the file closed: never raises
        if session.life.recorded:
            await self._record(lambda journal: journal.append(
                self._end_record(journal, session, status)))
        self._ended(session)

    @staticmethod
    def _ending(session: ServerSession, status: Exit | None) -> None:
        if session.fault is not None:
            log.error("session %s failed: %r", session.id, session.fault)
        session.stdin.close()
        if status is None:  # (a fault in its task: ended all the same)
            session.life.end(Reason.CANCELLED)
        if status is None and session.sink is not None:
            session.sink.lost()  # a fault: the channel ends with exit -1 all the same
            session.sink = None
        if status is None:  # ended, not exited: observers learn how it died (they saw it all)
            for observer in list(session.observers):
                observer.finish(session.process.status or LOST)

    def _ended(self, session: ServerSession) -> None:
        session.life.over = True
        if self._kept(session):  # for the next attach, in bounded memory
            self.deadline_moved()
        else:
            self._forget(session)
        self._running -= 1  # after the end record: "none running" means all written
        if self._emptied is not None:
            self._emptied.set()

    @staticmethod
    def _end_record(journal: Journal, session: ServerSession, status: Exit | None,
                    ) -> SessionEnd:
        final = session.process.status
        return SessionEnd(
            id=session.id, at=journal.now(), reason=session.life.end_reason(status),
            code=final.code if final else None, signal=final.signal if final else None,
            error=final.error if final else None,
            bytes_in=session.bytes_in, bytes_out=session.bytes_out,
            leftovers=session.process.leftovers, oom=session.process.oom)

    async def _record(self, write: Callable[[Journal], Awaitable[None]]) -> bool:
        """Write journal records, shielded (a start always gets its end); False when there is
        no journal or the write failed (logged: the session goes on without records)."""
        if self.journal is None:
            return False
        with anyio.CancelScope(shield=True):
            try:
                await write(self.journal)
            except OSError as exc:
                log.error("journal %s: %s", self.journal.path, exc)
                return False
        return True

    def note_soon(self, session: ServerSession, kind: type[SessionDetach | SessionAttach],
                  peer: str, **members: object) -> None:
        """A detach or an attach: the sweeper plans again, and the journal records it (in a
        task: this is called from where nothing can wait)."""
        self.deadline_moved()
        self._record_soon(kind, session.id, peer=peer, **members)

    def _record_soon(self, kind: type[Record], session_id: str, **members: object) -> None:
        """Write a record of ``session_id`` in a task (the journal's `at`)."""
        if self.journal is not None and self._task_group is not None:
            self._noting += 1
            self._task_group.start_soon(self._note, kind, session_id, members)

    async def _note(self, kind: type[Record], session_id: str,
                    members: dict[str, object]) -> None:
        try:
            await self._record(lambda journal: journal.append(
                kind(id=session_id, at=journal.now(), **members)))
        finally:
            self._noting -= 1

    # --- the sweeper, and the end ----------------------------------------------------

    def deadline_moved(self) -> None:
        """A session was detached or attached: the sweeper plans again."""
        if self._replan is not None:
            self._replan.set()

    def _forget(self, session: ServerSession) -> None:
        session.life.step(Event.FORGOTTEN)
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            for grant in self.grants.of_session(session.id):  # a grant ends with its session
                self.grants.remove(grant)

    def _kept(self, session: ServerSession) -> bool:
        """Whether an ended session stays attachable: its exit not delivered yet, or delivered
        less than --keep-ended ago (the client may not have read it)."""
        return session.detachable and session.final is not None and (
            session.delivered_at is None or self.settings.keep_ended > 0)

    def _delivered(self, session: ServerSession) -> None:
        """An ended session's exit went out: it is kept --keep-ended seconds more."""
        if session.output_over and not self._kept(session):
            self._forget(session)
        else:
            self.deadline_moved()

    def release(self, session_id: str, owner: str) -> None:
        """`release`: forget ``owner``'s ended session now (its exit was read); anything
        else (running, attached, unknown, another's) is left as it is."""
        session = self.sessions.get(session_id)
        if (session is not None and session.owner == owner and session.final is not None
                and session.sink is None):
            self._forget(session)
    def sweep(self, now: float) -> float | None:
        """Hang up detached sessions nobody attached for their detached timeout (journal:
        abandoned), drop ended ones whose exit nobody came for, and those whose exit went
        out --keep-ended ago, and end the grants whose time ran out; the nearest deadline
        still ahead, if any."""
        keep_ended = self.settings.keep_ended
        nearest: float | None = None
        wall = time.time()
        if (next_grant := self._expire_grants(wall)) is not None:
            nearest = now + max(0.0, next_grant - wall)
        for session in list(self.sessions.values()):
            if session.detached_at is None or session.sink is not None:
                continue
            if session.delivered_at is not None:
                deadline = session.delivered_at + keep_ended
            else:
                deadline = session.detached_at + session.detached_timeout
            if deadline > now:
                nearest = deadline if nearest is None else min(nearest, deadline)
            elif session.delivered_at is not None:
                self._forget(session)
            elif session.final is not None:
                log.info("session %s: its exit was not collected in time: dropped", session.id)
                self._forget(session)
            elif session.life.reason is None:
                log.info("session %s: detached for %g s: hung up", session.id,
                         session.detached_timeout)
                session.cancel(Reason.ABANDONED)
        return nearest

    async def _sweep(self) -> None:
        """Run `sweep` at each deadline, on time to the second."""
        while True:
            self._replan = anyio.Event()
            now = time.monotonic()
            nearest = self.sweep(now)
            with anyio.move_on_after(math.inf if nearest is None else nearest - now):
                await self._replan.wait()

    def hang_up_all(self) -> None:
        """Graceful shutdown: no new sessions; SIGHUP to every running session's process
        group, detached ones included."""
        self.closing = True
        for session in list(self.sessions.values()):
            if session.final is None:
                session.hang_up()

    async def wait_empty(self) -> None:
        """Until no session runs (ended ones waiting for an attach do not count)."""
        await self._until(lambda: not self._running)

    async def _until(self, condition: Callable[[], bool]) -> None:
        """Until ``condition`` holds, looked at again whenever a session has ended."""
        while not condition():
            self._emptied = anyio.Event()
            await self._emptied.wait()

    # --- an upgrade in place (section 12) -----------------------------------------------

    async def end_undetachable(self, drain: float, grace: float) -> None:
        """Let the sessions no client can attach again end by themselves for ``drain``
        seconds, then hang them up, as a graceful shutdown does; those still running
        ``grace`` seconds later are ended (killed)."""
        def undetachable() -> list[ServerSession]:
            return [s for s in self.sessions.values() if not s.detachable]

        with anyio.move_on_after(drain):
            await self._until(lambda: not undetachable())
        for session in undetachable():
            session.hang_up()
        with anyio.move_on_after(grace):
            await self._until(lambda: not undetachable())
        for session in undetachable():
            session.cancel(Reason.SHUTDOWN)
        await self._until(lambda: not undetachable())

    def quiet(self) -> bool:
        """Whether no session is half-way through its end and no record is being written: a
        state can be handed over."""
        return (not self._opening and not self._noting
                and (self.journal is None or self.journal.idle)
                and not any(s.in_transition or any(isinstance(o, Recording) and o.writing
                                                   for o in s.taps)
                            for s in self.sessions.values()))

    async def until_quiet(self, timeout: float) -> bool:
        """Until `quiet`, with every recording's events written; whether it came in time."""
        with anyio.move_on_after(timeout):
            while True:
                while not self.quiet():
                    await anyio.sleep(QUIET_POLL)
                for session in self.sessions.values():
                    for tap in session.taps:
                        if isinstance(tap, Recording):
                            await tap.flushed()
                if self.quiet():  # (and nothing began while the recordings were written)
                    return True
        return False

    def describe(self) -> list[SessionState]:
        """What `handover` would hand over now, changing nothing (for the dry run: the new
        code must read it): the detachable sessions."""
        return [s.handover(dry=True) for s in self.sessions.values() if s.detachable]

    def handover(self) -> list[SessionState]:
        """Every session, for new code in this process (the caller executes it next, with no
        await between): by now each is detachable and detached. They are this registry's no
        more (`adopt` takes them back if the new code cannot be executed)."""
        states = [session.handover() for session in self.sessions.values()]
        self.sessions.clear()
        self._running = 0
        return states

    def describe_grants(self) -> list[GrantState]:
        """The open grants, for new code in this process (their hashes: never a grant)."""
        return [GrantState(id=g.id, digest=g.digest, session=g.session, role=g.role,
                           owner=g.owner, expires=g.expires) for g in self.grants]

    async def adopted(self, states: list[SessionState], backend: ChildBackend,
                      from_version: str, grants: list[GrantState] | None = None) -> None:
        """Go on after an upgrade in place: the sessions and grants handed over, adopted;
        the journal's one `server.upgrade` record."""
        self.adopt(states, backend)
        for state in grants or []:
            if state.session in self.sessions:
                self.grants.restore(Grant(
                    id=state.id, digest=state.digest, session=state.session,
                    role=OBSERVER if state.role == OBSERVER else WRITER, owner=state.owner,
                    expires=state.expires))
        await self._record(lambda journal: journal.append(ServerUpgrade(
            at=journal.now(), from_version=from_version, to_version=__version__,
            sessions=len(states))))
        log.info("upgraded: %d sessions kept", len(states))

    def adopt(self, states: list[SessionState], backend: ChildBackend) -> None:
        """Go on with the sessions that code before an upgrade handed over."""
        assert self._task_group is not None, "SessionRegistry.running() is not entered"
        for state in states:
            process: ProcessHandle
            if state.process is not None:
                process = backend.adopt(state.process)
            else:  # over (released once its exit was offered): the exit waits for a client
                assert state.final is not None
                process = ExitedProcess(state.pid, state.final)
            session = ServerSession.adopted(
                state, process, self._start_task, linger=self.settings.linger,
                kill_leftovers=self._kill_leftovers)
            session.on_delivered = self._delivered
            if state.recording is not None:
                recording = Recording.adopted(state.recording)
                session.taps.append(recording)
                self._task_group.start_soon(recording.run)
            self.sessions[session.id] = session
            if state.process is not None:
                self.start(session)
        self.deadline_moved()
