"""The registry's part in an upgrade in place (section 12): the sessions no client can
attach again ended, a quiet moment waited for, every session and grant handed to the new
code in this process, and taken back from it.

A part of `SessionRegistry` (registry.py), with no state of its own: what it hands over
and takes back is the registry's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from ...backends.base import ProcessHandle
from ...backends.local import ChildBackend
from ...protocol.messages import OBSERVER, WRITER
from ...version import __version__
from ..grants import Grant
from ..handover import ExitedProcess, GrantState, SessionState
from ..journal import Reason, ServerUpgrade
from ..sessions.adoption import adopted_session, session_state
from ..sessions.recording import Recording
from ..sessions.session import ServerSession

if TYPE_CHECKING:
    from .registry import SessionRegistry

log = logging.getLogger("ttyserve")

QUIET_POLL = 0.01  # seconds between looks for a state that can be handed over


class HandingOver:
    """Ends, hands over and adopts the registry's sessions across an upgrade in place."""

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry

    async def end_undetachable(self, drain: float, grace: float) -> None:
        """Let the sessions no client can attach again end by themselves for ``drain``
        seconds, then hang them up, as a graceful shutdown does; those still running
        ``grace`` seconds later are ended (killed)."""
        def undetachable() -> list[ServerSession]:
            return [s for s in self.registry.sessions.values() if not s.outlives_upgrade]

        with anyio.move_on_after(drain):
            await self.registry.ends.until(lambda: not undetachable())
        for session in undetachable():
            session.hang_up()
        with anyio.move_on_after(grace):
            await self.registry.ends.until(lambda: not undetachable())
        for session in undetachable():
            session.cancel(Reason.SHUTDOWN)
        await self.registry.ends.until(lambda: not undetachable())

    def quiet(self) -> bool:
        """Whether no session is half-way through its end and no record is being written: a
        state can be handed over."""
        return (not self.registry.sessions.opening and not self.registry.ends.noting
                and (self.registry.journal is None or self.registry.journal.idle)
                and not any(s.life.in_transition or any(isinstance(o, Recording) and o.writing
                                                   for o in s.taps)
                            for s in self.registry.sessions.values()))

    async def until_quiet(self, timeout: float) -> bool:
        """Until `quiet`, with every recording's events written; whether it came in time."""
        with anyio.move_on_after(timeout):
            while True:
                while not self.quiet():
                    await anyio.sleep(QUIET_POLL)
                for session in self.registry.sessions.values():
                    for tap in session.taps:
                        if isinstance(tap, Recording):
                            await tap.flushed()
                if self.quiet():  # (and nothing began while the recordings were written)
                    return True
        return False

    def describe(self) -> list[SessionState]:
        """What `handover` would hand over now, changing nothing (for the dry run: the new
        code must read it): the detachable sessions."""
        return [session_state(s, dry=True) for s in self.registry.sessions.values()
                if s.outlives_upgrade]

    def handover(self) -> list[SessionState]:
        """Every session, for new code in this process (the caller executes it next, with no
        await between): by now each is detachable and detached. They are this registry's no
        more (`adopt` takes them back if the new code cannot be executed)."""
        states = [session_state(session) for session in self.registry.sessions.values()]
        self.registry.sessions.clear()
        self.registry.ends.running = 0
        return states

    def describe_grants(self) -> list[GrantState]:
        """The open grants, for new code in this process (their hashes: never a grant)."""
        return [GrantState(id=g.id, digest=g.digest, session=g.session, role=g.role,
                           owner=g.owner, expires=g.expires) for g in self.registry.sharing.grants]

    async def adopted(self, states: list[SessionState], backend: ChildBackend,
                      from_version: str, grants: list[GrantState] | None = None) -> None:
        """Go on after an upgrade in place: the sessions and grants handed over, adopted;
        the journal's one `server.upgrade` record."""
        self.adopt(states, backend)
        for state in grants or []:
            if state.session in self.registry.sessions:
                self.registry.sharing.grants.restore(Grant(
                    id=state.id, digest=state.digest, session=state.session,
                    role=OBSERVER if state.role == OBSERVER else WRITER, owner=state.owner,
                    expires=state.expires))
        if self.registry.on_upgraded is not None:  # a worker: the supervisor writes the one record
            self.registry.on_upgraded(from_version, len(states))
        else:
            await self.registry.ends.record(lambda journal: journal.append(ServerUpgrade(
                at=journal.now(), from_version=from_version, to_version=__version__,
                sessions=len(states))))
        log.info("upgraded: %d sessions kept", len(states))

    def adopt(self, states: list[SessionState], backend: ChildBackend) -> None:
        """Go on with the sessions that code before an upgrade handed over."""
        assert self.registry.task_group is not None, "SessionRegistry.running() is not entered"
        for state in states:
            process: ProcessHandle
            if state.process is not None:
                process = backend.adopt(state.process)
            else:  # over (released once its exit was offered): the exit waits for a client
                assert state.final is not None
                process = ExitedProcess(state.pid, state.final)
            session = adopted_session(
                state, process, self.registry.ends.start_task, linger=self.registry.settings.linger,
                kill_leftovers=self.registry.kill_leftovers)
            session.on_delivered = self.registry.delivered
            session.on_forget = self.registry.forget
            if state.recording is not None:
                recording = Recording.adopted(state.recording)
                session.taps.append(recording)
                self.registry.task_group.start_soon(recording.run)
            self.registry.sessions[session.id] = session
            self.registry.keys.adopted(session.owner, session.key, session.id)
            if state.process is not None:
                self.registry.ends.start(session)
        self.registry.deadline_moved()
