"""Sessions belong to the server: admission, spawn, the journal, ids, attach and steal, the
hang-up at shutdown, the detached timeout.

A connection asks the registry to open a session, or to attach to one, and
attaches a channel to it; the session runs on the loop's callbacks or in the
registry's task group, never the connection's, so a session can outlive the
connection that opened it. Three parts own what they do: where sessions run and what
their ends leave (`ends`, session_ends.py), grants (`sharing`, sharing.py), and an
upgrade in place (`handing_over`, handing_over.py).
"""

from __future__ import annotations

import errno
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from ...backends.base import Backend, ProcessHandle, ProcessSpec, SpawnsAtOnce
from ...defaults import BUSY_RETRY_MS, KILL_GRACE, UPGRADE_RETRY_MS
from ...errors import ErrorCode, RequestError
from ...ids import SESSION, JournalIds, new_session_id
from ...protocol.frames import FrameKind
from ...protocol.messages import (
    HTTP,
    INPUT,
    OBSERVER,
    STOLEN,
    STREAM,
    Attach,
    Offsets,
    Open,
    SessionInfo,
    members,
)
from ..channels.observer import Observer
from ..grants import Grant, Grants
from ..journal import (
    Journal,
    Reason,
    SessionDetach,
    SessionEnd,
    SessionRefused,
)
from ..mesh import Mesh
from ..sessions.life import Phase
from ..sessions.recording import start_recording
from ..sessions.scrollback import OffsetBeyondOutput
from ..sessions.session import ServerSession
from ..sessions.sinks import Sink
from ..sessions.typing_first import Typing
from ..settings import ServerSettings
from ..targets.hosts import TargetHosts
from ..targets.process import RemoteProcess
from ..tasks import Tasks, open_tasks
from .handing_over import HandingOver
from .idempotency import IdempotencyKeys
from .session_ends import SessionEnds
from .sessions_here import SessionsHere
from .sharing import Sharing

log = logging.getLogger("ttyserve")
# How long the server's last act waits for the sessions it ended: each one's hang-up and
# kill grace, and the kill's own wait for its cgroup to empty.
END_ALL_GRACE = 3 * KILL_GRACE


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


class SessionRegistry:
    """Every live session of one server, by id."""

    def __init__(self, settings: ServerSettings, backend: Backend,
                 journal: Journal | None = None, mesh: Mesh | None = None) -> None:
        self.settings = settings
        self.mesh = mesh  # with workers: the others, and the counts all of them share
        self._id_prefix = mesh.prefix if mesh is not None else ""
        self.on_upgraded: Callable[[str, int], None] | None = None
        self.backend = backend
        self._spawn_nowait: Callable[[ProcessSpec], ProcessHandle] | None = (
            backend.spawn_nowait if isinstance(backend, SpawnsAtOnce) else None)
        self.journal = journal
        self.targets: TargetHosts | None = None  # section 15: the hosts behind this server
        # Running sessions, and detachable ones whose exit waits for a client (until it is
        # delivered, or --detached-timeout passes).
        self.sessions = SessionsHere(mesh.census if mesh is not None else None)
        self.sharing = Sharing(self, Grants(self._id_prefix))  # section 11: grants
        self.ends = SessionEnds(self)  # where sessions run, and what their ends leave
        self.handing_over = HandingOver(self)  # an upgrade in place (section 12)
        self.typing = Typing()  # interactive first: while anyone types, others read small
        self.closing = False  # a graceful shutdown began: no new sessions
        self._killing = False  # ...and its kill grace is over: what still runs is killed
        self.restarting = False  # an upgrade in place began: no new sessions or attaches
        self.keys = IdempotencyKeys(mesh.census if mesh is not None else None)  # section 13
        self.task_group: anyio.abc.TaskGroup | None = None
        self.tasks: Tasks | None = None  # sessions and their input pumps run here
        self._replan: anyio.Event | None = None  # the sweeper waits: a deadline moved
        self._journal_id = JournalIds(SESSION + self._id_prefix if mesh is not None else "")
        self.kill_leftovers = settings.leftovers == "kill"
        self._default_argv = settings.default_argv  # each read of these makes them anew
        self._policy = settings.policy

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionRegistry]:
        """The task group sessions run in; on the way out (a forced shutdown too), every
        session still running is ended (killed and reaped) and its end written."""
        async with anyio.create_task_group() as tg:
            self.task_group = tg
            tg.start_soon(self._sweep)
            try:
                async with open_tasks(tg) as self.tasks:
                    try:
                        yield self
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._end_all()
            finally:
                tg.cancel_scope.cancel()
                self.task_group = self.tasks = None

    # --- admission ----------------------------------------------------------------------

    def spec_for(self, request: Open, session_id: str | None = None) -> ProcessSpec:
        """What to run for an `open`: its members, the server's defaults where it has none
        (and the session's id, which names its cgroup)."""
        here = request.target is None  # (a target's defaults are the far side's own)
        return ProcessSpec(
            argv=list(request.argv) or (list(self._default_argv) if here else []),
            pty=request.pty, rows=request.rows, cols=request.cols, term=request.term,
            env=dict(request.env), cwd=request.cwd or (self.settings.default_cwd if here
                                                        else None), name=session_id,
            target=request.target, detachable=request.detachable,
            detached_timeout=request.detached_timeout or self.settings.detached_timeout)

    def admit(self, sessions_here: int) -> None:
        """RequestError when no session may start now: shutting_down, or busy (the server's
        or this connection's limit)."""
        if self.closing:
            raise shutting_down()
        if self.restarting:
            raise restarting()
        if self.sessions.counted >= self.settings.max_sessions:
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
        with self.keys.holding(owner, request.idempotency_key, request.detachable):
            return await self._open(request, owner, peer, sessions_here)

    async def _open(self, request: Open, owner: str, peer: str,
                    sessions_here: int) -> ServerSession:
        session_id = self._new_id(request.detachable)
        spec = self._admit_open(request, peer, sessions_here, session_id)
        with self.sessions.open_under_way():
            try:
                process = await self._backend_for(spec).spawn(spec)
            except OSError as exc:
                failure = exc.errno
                await self.ends.record(lambda journal: journal.append(
                    journal.start_record(session_id, peer, spec.argv, spec.pty, None, owner,
                                         target=spec.target),
                    SessionEnd(id=session_id, at=journal.now(), reason=Reason.SPAWN_FAILED,
                               errno=failure, principal=owner, target=spec.target)))
                raise _spawn_failed(exc, peer) from exc
            except RequestError as exc:  # a target's: unreachable, or the far side's refusal
                code = str(exc.code)
                if exc.code in (ErrorCode.TARGET_UNREACHABLE, ErrorCode.NO_SUCH_TARGET):
                    await self.ends.record(lambda journal: journal.append(SessionRefused(
                        id=session_id, at=journal.now(), principal=owner,
                        target=spec.target, code=code)))
                raise
            if isinstance(process, RemoteProcess):  # what runs there, as the far side said
                spec = process.spec
            session = self._session(session_id, process, spec, owner, peer,
                                    request.detachable, request.detached_timeout)
            session.key = request.idempotency_key
            # Shielded: a cancel now must not leave a process without its record, nor its
            # owner.
            session.life.started(await self.ends.record(lambda journal: journal.append(
                journal.start_record(session_id, peer, spec.argv, spec.pty, process.pid,
                                     owner, process.cgroup_path, spec.target))))
        return self._admitted(session)

    def open_nowait(self, request: Open, owner: str, peer: str,
                    sessions_here: int) -> ServerSession | None:
        """`open` where nothing has to be awaited (no journal, and a backend with
        `spawn_nowait`): the session, or RequestError as `open` raises; None when the open
        has to be awaited."""
        spawn_nowait = self._spawn_nowait
        if self.journal is not None or spawn_nowait is None or request.target is not None:
            return None
        with self.keys.holding(owner, request.idempotency_key, request.detachable):
            session_id = self._new_id(request.detachable)
            spec = self._admit_open(request, peer, sessions_here, session_id)
            try:
                process = spawn_nowait(spec)
            except OSError as exc:
                self.sessions.unreserve()
                raise _spawn_failed(exc, peer) from exc
            session = self._session(session_id, process, spec, owner, peer,
                                    request.detachable, request.detached_timeout)
            session.key = request.idempotency_key
            return self._admitted(session)

    def _backend_for(self, spec: ProcessSpec) -> Backend:
        """This host's backend, or the target's the spec names (section 15)."""
        if spec.target is None:
            return self.backend
        place = self.targets.place(spec.target) if self.targets is not None else None
        if place is None:  # (removed from the file since the open was admitted)
            raise RequestError(ErrorCode.NO_SUCH_TARGET, f"no target {spec.target!r}")
        return place

    def _new_id(self, detachable: bool) -> str:
        """A detachable session's id names it to whoever attaches: unguessable. Another's
        only tells its records apart."""
        return new_session_id(self._id_prefix) if detachable else self._journal_id()

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
        if self.sessions.over_the_server_limit(self.settings.max_sessions):
            raise busy(f"the server runs its maximum of {self.settings.max_sessions} sessions")
        return self.spec_for(request, session_id)

    def _session(self, session_id: str, process: ProcessHandle, spec: ProcessSpec, owner: str,
                 peer: str, detachable: bool, detached_timeout: int | None) -> ServerSession:
        session = ServerSession(session_id, process, spec, peer, self.ends.start_task,
                                linger=self.settings.linger, owner=owner,
                                scrollback=self.settings.scrollback if detachable else None,
                                detached_timeout=detached_timeout or self.settings.detached_timeout,
                                kill_leftovers=self.kill_leftovers, typing=self.typing)
        session.on_delivered = self.delivered  # (told the session: no cycle through it)
        session.on_forget = self.forget
        return session

    def _admitted(self, session: ServerSession) -> ServerSession:
        settings = self.settings
        assert self.task_group is not None, "SessionRegistry.running() is not entered"
        if settings.record is not None:
            start_recording(session, settings.record, settings.record_input,
                            self.task_group)
        self.sessions[session.id] = session
        self.keys.opened(session.owner, session.key, session.id)
        if self.closing:  # the shutdown began while it was spawned: hung up as the others
            session.hang_up()
            if self._killing:
                session.kill()
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
            if not self.sharing.grants.live(grant):
                raise RequestError(ErrorCode.UNAUTHORIZED, "the grant this connection came "
                                   "with has expired or was revoked")
            owner = grant.owner
        session = self.owned(request.session, owner)
        observing = request.role in (OBSERVER, INPUT)  # (neither is the session's sink)
        if request.role == OBSERVER:
            limit = self.settings.max_observers
            if len(session.observers) >= limit:
                raise busy(f"the session has its maximum of {limit} observers")
        elif observing:  # an HTTP write: beside no writer, or the HTTP door's stream
            if session.sink is not None and session.sink.role != STREAM:
                raise RequestError(ErrorCode.SESSION_IN_USE, "a client of the framed "
                                   "protocol is attached as the session's writer: its input "
                                   "is that client's")
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

    def owned(self, session_id: str, owner: str) -> ServerSession:
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
        self.ends.note_soon(session, SessionDetach, channel.peer, role=channel.role,
                       grant=channel.grant, reason=reason)

    def listing(self, owner: str) -> list[SessionInfo]:
        """``owner``'s detachable sessions, for `list`."""
        return [SessionInfo(session=s.id, argv=s.spec.argv, pid=s.pid, pty=s.spec.pty,
                            started=s.started, attached=s.sink is not None,
                            exit=members(s.final) if s.final else None,
                            observers=sum(o.role == OBSERVER for o in s.observers),
                            grants=[grant.info() for grant in self.sharing.grants.of_session(s.id)],
                            offsets=Offsets(stdout=s.ring.end[FrameKind.STDOUT],
                                            stderr=s.ring.end[FrameKind.STDERR])
                            if s.ring is not None else None, idempotency_key=s.key,
                            attached_by=HTTP if s.sink is not None
                            and s.sink.role == STREAM else None, target=s.spec.target)
                for s in self.sessions.values() if s.detachable and s.owner == owner]

    # --- the sweeper, and the end ----------------------------------------------------

    def deadline_moved(self) -> None:
        """A session was detached or attached: the sweeper plans again."""
        if self._replan is not None:
            self._replan.set()

    def forget(self, session: ServerSession) -> None:
        session.forgotten()
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            self.keys.release(session.owner, session.key)
            grants = self.sharing.grants
            for grant in grants.of_session(session.id):  # a grant ends with its session
                grants.remove(grant)

    def kept(self, session: ServerSession) -> bool:
        """Whether an ended session stays attachable: its exit not delivered yet, or delivered
        less than --keep-ended ago (the client may not have read it)."""
        return session.detachable and session.final is not None and (
            session.delivered_at is None or self.settings.keep_ended > 0)

    def delivered(self, session: ServerSession) -> None:
        """An ended session's exit went out: it is kept --keep-ended seconds more."""
        if session.output_over and not self.kept(session):
            self.forget(session)
        else:
            self.deadline_moved()

    def release(self, session_id: str, owner: str) -> None:
        """`release`: forget ``owner``'s ended session now (its exit was read); anything
        else (running, attached, unknown, another's) is left as it is."""
        session = self.sessions.get(session_id)
        if (session is not None and session.owner == owner and session.final is not None
                and session.sink is None):
            self.forget(session)

    def sweep(self, now: float) -> float | None:
        """Hang up detached sessions nobody attached for their detached timeout (journal:
        abandoned), drop ended ones whose exit nobody came for, and those whose exit went
        out --keep-ended ago, and end the grants whose time ran out; the nearest deadline
        still ahead, if any."""
        keep_ended = self.settings.keep_ended
        nearest: float | None = None
        wall = time.time()
        if (next_grant := self.sharing.expire(wall)) is not None:
            nearest = now + max(0.0, next_grant - wall)
        for session in list(self.sessions.values()):
            if (deadline := session.deadline(keep_ended)) is None:
                continue
            if deadline > now:
                nearest = deadline if nearest is None else min(nearest, deadline)
                continue
            phase = session.life.phase
            session.timed_out()  # (what that means is its life's: life.py)
            if phase is Phase.EXITED:
                log.info("session %s: its exit was not collected in time: dropped", session.id,
                         extra={"session": session.id})
            elif session.life.phase is Phase.ENDING and phase is not Phase.ENDING:
                log.info("session %s: detached for %g s: hung up", session.id,
                         session.detached_timeout, extra={"session": session.id})
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
        """Graceful shutdown: no new sessions; every running session is hung up as `cancel`
        does, detached ones included (SIGHUP to its process group, and what still runs
        KILL_GRACE seconds later killed), and ends as its process does, its exit sent."""
        self.closing = True
        self.hang_up(None)

    def hang_up(self, owner: str | None) -> None:
        """Hang ``owner``'s sessions up as a shutdown does (a principal removed from the
        file), or every session (None: the shutdown's, whose grace also kills what was
        admitted meanwhile)."""
        for session in self._of(owner):
            if session.final is None:
                session.hang_up()
        assert self.task_group is not None, "SessionRegistry.running() is not entered"
        self.task_group.start_soon(self._kill_after_grace, owner)

    async def _kill_after_grace(self, owner: str | None) -> None:
        await anyio.sleep(KILL_GRACE)
        self._killing = self._killing or owner is None
        for session in self._of(owner):
            session.kill()

    def _of(self, owner: str | None) -> list[ServerSession]:
        return [s for s in self.sessions.values() if owner is None or s.owner == owner]

    async def _end_all(self) -> None:
        """The server's last act: every session still running is ended now (killed and
        reaped) and its end written, so no way out of it, forced or not, leaves a process
        running or a start without its end. The wait is bounded (END_ALL_GRACE): a tree that
        a cgroup.kill cannot empty in that time is left to the next start's recovery, as
        after a crash."""
        for session in list(self.sessions.values()):
            session.cancel(Reason.SHUTDOWN)
        with anyio.move_on_after(END_ALL_GRACE):
            await self.ends.wait_empty()
