"""The registry's part in a session's end: where a session runs (the loop's callbacks, or a
task), and what its end leaves behind: its channel's end, its recording, its journal record;
and the detach and attach records written beside.

A part of `SessionRegistry` (registry.py) that owns the count of what runs and what is
being written.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ...protocol.messages import Exit
from ..journal import Journal, Record, SessionAttach, SessionDetach, SessionEnd
from ..sessions.recording import finish_recording
from ..sessions.session import ServerSession

if TYPE_CHECKING:
    from .registry import SessionRegistry

log = logging.getLogger("ttyserve")


class SessionEnds:
    """Runs the registry's sessions and writes their ends."""

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry
        self.running = 0  # sessions started and not ended yet (their end record written)
        self.noting = 0  # detach and attach records not written yet
        self._emptied: anyio.Event | None = None  # a wait for a session's end

    def start(self, session: ServerSession) -> None:
        """Run an opened (and attached) session: on the loop's callbacks alone where it can,
        else as a task of the registry's."""
        assert self.registry.tasks is not None, "SessionRegistry.running() is not entered"
        self.running += 1
        if not session.start(self._session_over):
            self.registry.tasks.start_soon(self._run, session, scope=session.cancel_scope())

    def start_task(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert self.registry.tasks is not None, "SessionRegistry.running() is not entered"
        self.registry.tasks.start_soon(work)

    async def _run(self, session: ServerSession) -> None:
        """A session's task, where the loop has no readiness callbacks for all of it."""
        status: Exit | None = None
        try:
            status = await session.run()
        except Exception:  # one session's bug must not take the server down
            log.exception("session %s failed", session.id, extra={"session": session.id})
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
            tasks = self.registry.tasks
            assert tasks is not None, "SessionRegistry.running() is not entered"
            tasks.start_soon(self._finish, session, status, scope=session.cancel_scope())

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
            await self.record(lambda journal: journal.append(
                self._end_record(journal, session, status)))
        self._ended(session)

    @staticmethod
    def _ending(session: ServerSession, status: Exit | None) -> None:
        if session.fault is not None:
            log.error("session %s failed: %r", session.id, session.fault,
                      extra={"session": session.id})
        session.stdin.close()
        if status is None:
            session.ended_without_status()

    def _ended(self, session: ServerSession) -> None:
        session.life.closed()
        if self.registry.kept(session):  # for the next attach, in bounded memory
            self.registry.deadline_moved()
        else:
            self.registry.forget(session)
        self.running -= 1  # after the end record: "none running" means all written
        if self._emptied is not None:
            self._emptied.set()

    @staticmethod
    def _end_record(journal: Journal, session: ServerSession, status: Exit | None,
                    ) -> SessionEnd:
        final = session.process.status
        return SessionEnd(
            id=session.id, at=journal.now(), principal=session.owner,
            target=session.spec.target, reason=session.life.end_reason(status),
            code=final.code if final else None, signal=final.signal if final else None,
            error=final.error if final else None,
            bytes_in=session.bytes_in, bytes_out=session.bytes_out,
            leftovers=session.process.leftovers, oom=session.process.oom)

    async def record(self, write: Callable[[Journal], Awaitable[None]]) -> bool:
        """Write journal records, shielded (a start always gets its end); False when there is
        no journal or the write failed (logged: the session goes on without records)."""
        if self.registry.journal is None:
            return False
        with anyio.CancelScope(shield=True):
            try:
                await write(self.registry.journal)
            except OSError as exc:
                log.error("journal %s: %s", self.registry.journal.path, exc)
                return False
        return True

    def note_soon(self, session: ServerSession, kind: type[SessionDetach | SessionAttach],
                  peer: str, **members: object) -> None:
        """A detach or an attach: the sweeper plans again, and the journal records it (in a
        task: this is called from where nothing can wait)."""
        self.registry.deadline_moved()
        self.record_soon(kind, session.id, peer=peer, **members)

    def record_soon(self, kind: type[Record], session_id: str, **members: Any) -> None:
        """Write a record of ``session_id`` in a task (the journal's `at`), with its
        principal and target where the record does not name them."""
        if self.registry.journal is not None and self.registry.task_group is not None:
            if (session := self.registry.sessions.get(session_id)) is not None:
                members.setdefault("principal", session.owner)
                members.setdefault("target", session.spec.target)
            self.noting += 1
            self.registry.task_group.start_soon(self._note, kind, session_id, members)

    async def _note(self, kind: type[Record], session_id: str,
                    members: dict[str, Any]) -> None:
        try:
            await self.record(lambda journal: journal.append(
                kind(id=session_id, at=journal.now(), **members)))
        finally:
            self.noting -= 1

    async def wait_empty(self) -> None:
        """Until no session runs (ended ones waiting for an attach do not count)."""
        await self.until(lambda: not self.running)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Until ``condition`` holds, looked at again whenever a session has ended."""
        while not condition():
            self._emptied = anyio.Event()
            await self._emptied.wait()
