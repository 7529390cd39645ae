"""Sessions belong to the server: admission, spawn, the journal, ids, the hang-up at shutdown.

A connection asks the registry to open a session and attaches a channel to
it; the session's task runs in the registry's task group, so a session can
outlive the connection that opened it (the seam detachable sessions use).
"""

from __future__ import annotations

import errno
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from .backends.base import Backend, ProcessSpec
from .errors import ErrorCode, RequestError
from .journal import Journal, Reason
from .protocol.messages import Exit, Open
from .session import Session
from .settings import ServerSettings

log = logging.getLogger("ttyserve")

BUSY_RETRY_MS = 1000  # the hint sent with `busy` and `shutting_down`


def busy(message: str) -> RequestError:
    return RequestError(ErrorCode.BUSY, message, retry_after_ms=BUSY_RETRY_MS)


def shutting_down() -> RequestError:
    return RequestError(ErrorCode.SHUTTING_DOWN, "the server is shutting down",
                        retry_after_ms=BUSY_RETRY_MS)


def new_session_id() -> str:
    """128 random bits, URL-safe: unguessable, so it can name a session to reattach."""
    return secrets.token_urlsafe(16)


class SessionRegistry:
    """Every live session of one server, by id."""

    def __init__(self, settings: ServerSettings, backend: Backend,
                 journal: Journal | None = None) -> None:
        self.settings = settings
        self.backend = backend
        self.journal = journal
        self.sessions: dict[str, Session] = {}
        self.closing = False  # a graceful shutdown began: no new sessions
        self._task_group: anyio.abc.TaskGroup | None = None
        self._emptied: anyio.Event | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[SessionRegistry]:
        """The task group sessions run in; on the way out, every session still running is
        cancelled (killed and reaped)."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                self._task_group = None

    def spec_for(self, request: Open) -> ProcessSpec:
        """What to run for an `open`: its members, the server's defaults where it has none."""
        return ProcessSpec(
            argv=list(request.argv) or list(self.settings.default_argv), pty=request.pty,
            rows=request.rows, cols=request.cols, term=request.term, env=dict(request.env),
            cwd=request.cwd or self.settings.default_cwd)

    async def open(self, request: Open, peer: str, sessions_here: int) -> Session:
        """Admit and spawn a session; RequestError says why not (shutting_down, busy,
        bad_request or forbidden from the policy, spawn_failed)."""
        settings = self.settings
        if self.closing:
            raise shutting_down()
        if len(self.sessions) >= settings.max_sessions:
            raise busy(f"the server runs its maximum of {settings.max_sessions} sessions")
        if sessions_here >= settings.max_sessions_per_connection:
            raise busy(f"this connection runs its maximum of "
                       f"{settings.max_sessions_per_connection} sessions")
        try:
            settings.policy.check(request)
        except RequestError as exc:
            log.warning("%s: %s: %s", peer, exc.code, exc.message)
            raise
        spec = self.spec_for(request)
        session_id = new_session_id()
        try:
            process = await self.backend.spawn(spec)
        except OSError as exc:
            log.info("%s: spawn failed: %s", peer, exc)
            failure = exc.errno

            async def records(journal: Journal) -> None:
                await journal.start(session_id, peer, spec.argv, spec.pty, None)
                await journal.end(session_id, Reason.SPAWN_FAILED, errno=failure)

            await self._record(records)
            raise RequestError(ErrorCode.SPAWN_FAILED, str(exc.strerror or exc),
                               errno=exc.errno or errno.EIO) from exc
        session = Session(session_id, process, spec, peer, settings.linger)
        self.sessions[session_id] = session
        return session

    def start(self, session: Session) -> None:
        """Run an opened (and attached) session in the registry's task group."""
        assert self._task_group is not None, "SessionRegistry.running() is not entered"
        self._task_group.start_soon(self._run, session)

    async def _run(self, session: Session) -> None:
        spec = session.spec
        recorded = await self._record(lambda journal: journal.start(
            session.id, session.peer, spec.argv, spec.pty, session.pid))
        status: Exit | None = None
        try:
            with session.scope:
                status = await session.run()
        except Exception:  # one session's bug must not take the server down
            log.exception("session %s failed", session.id)
        finally:
            await session.process.aclose()  # run() closes it; this covers a run never begun
            session.close_input()
            if session.sink is not None:
                session.sink.ended()
            if recorded:
                await self._record(lambda journal: self._journal_end(journal, session, status))
            del self.sessions[session.id]  # after the end record: "empty" means all written
            if not self.sessions and self._emptied is not None:
                self._emptied.set()

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

    @staticmethod
    async def _journal_end(journal: Journal, session: Session, status: Exit | None) -> None:
        reason = session.ending or (Reason.EXIT if status is not None else Reason.CANCELLED)
        final = session.process.status
        await journal.end(
            session.id, reason,
            code=final.code if final else None, signal=final.signal if final else None,
            error=final.error if final else None,
            bytes_in=session.bytes_in, bytes_out=session.bytes_out)

    def hang_up_all(self) -> None:
        """Graceful shutdown: no new sessions; SIGHUP to every session's process group."""
        self.closing = True
        for session in list(self.sessions.values()):
            session.hang_up()

    async def wait_empty(self) -> None:
        while self.sessions:
            self._emptied = anyio.Event()
            await self._emptied.wait()
