"""The registry's part in an upgrade in place (section 12): the sessions no client can
attach again ended, a quiet moment waited for, every session and grant handed to the new
code in this process, and taken back from it.

A part of `SessionRegistry` (registry.py), apart for size: a mixin with no state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ...backends.base import ProcessHandle
from ...backends.local import ChildBackend
from ...protocol.messages import OBSERVER, WRITER
from ...version import __version__
from ..grants import Grant, Grants
from ..handover import ExitedProcess, GrantState, SessionState
from ..journal import Journal, Reason, ServerUpgrade
from ..sessions.adoption import adopted_session, session_state
from ..sessions.recording import Recording
from ..sessions.session import ServerSession
from ..settings import ServerSettings
from .idempotency import IdempotencyKeys
from .sessions_here import SessionsHere

log = logging.getLogger("ttyserve")

QUIET_POLL = 0.01  # seconds between looks for a state that can be handed over


class HandingOver:
    """Ends, hands over and adopts the registry's sessions across an upgrade in place."""

    settings: ServerSettings
    journal: Journal | None
    sessions: SessionsHere
    grants: Grants
    keys: IdempotencyKeys
    _noting: int
    _running: int
    _kill_leftovers: bool
    _task_group: anyio.abc.TaskGroup | None
    on_upgraded: Callable[[str, int], None] | None  # a worker's report to its supervisor

    if TYPE_CHECKING:  # the registry's own
        async def _until(self, condition: Callable[[], bool]) -> None: ...
        def _start_task(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None: ...
        def _delivered(self, session: ServerSession) -> None: ...
        def start(self, session: ServerSession) -> None: ...
        def deadline_moved(self) -> None: ...
        async def _record(self, write: Callable[[Journal], Any]) -> bool: ...

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
        return (not self.sessions.opening and not self._noting
                and (self.journal is None or self.journal.idle)
                and not any(s.life.in_transition or any(isinstance(o, Recording) and o.writing
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
        return [session_state(s, dry=True) for s in self.sessions.values() if s.detachable]

    def handover(self) -> list[SessionState]:
        """Every session, for new code in this process (the caller executes it next, with no
        await between): by now each is detachable and detached. They are this registry's no
        more (`adopt` takes them back if the new code cannot be executed)."""
        states = [session_state(session) for session in self.sessions.values()]
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
        if self.on_upgraded is not None:  # a worker: the supervisor writes the one record
            self.on_upgraded(from_version, len(states))
        else:
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
            session = adopted_session(
                state, process, self._start_task, linger=self.settings.linger,
                kill_leftovers=self._kill_leftovers)
            session.on_delivered = self._delivered
            if state.recording is not None:
                recording = Recording.adopted(state.recording)
                session.taps.append(recording)
                self._task_group.start_soon(recording.run)
            self.sessions[session.id] = session
            self.keys.adopted(session.owner, session.key, session.id)
            if state.process is not None:
                self.start(session)
        self.deadline_moved()
