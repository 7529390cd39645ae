"""The resume of section 10, for a connection: when its link is lost, the sessions spawned or
attached with ``resume`` wait while it dials again, with backoff, for as long as their
windows allow; the others end. Each new link is the connection's to adopt and read.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from ..errors import ConnectionLost, RemoteProtocolError, RequestError
from ..protocol.messages import Attached
from ..transport.streams import Transport
from .retry import RETRIED, backoff, retriable
from .session import ConnectionEnded, ResumeEvent, Session

if TYPE_CHECKING:
    from ..backends.carrier import Carrier

# Dial a new link, its resources (a carrier) entered into the stack, within a time (where it
# can be bounded: a carrier's ssh has its own): what `connect` did.
Dial = Callable[[contextlib.AsyncExitStack, float],
                Awaitable[tuple[Transport, "Carrier | None"]]]
# Take a new link on (its `hello`, an `attach` for each session waiting) and read it until it
# is lost: what ended it.
Adopt = Callable[[Transport, "Carrier | None"], Awaitable[Exception]]


class Resume:
    """Which sessions wait for the next link, the redials, and what each resume told."""

    def __init__(self, redial: Dial | None,
                 on_resume: Callable[[ResumeEvent], None] | None) -> None:
        self._redial = redial
        self._on_resume = on_resume
        self.waiting: list[Session] | None = None  # while a lost link is replaced
        self.relinked = anyio.Event()  # set when the wait is over, either way
        self._attempt = 0  # links dialled since a session last came back (the backoff)

    def resumable(self, failure: Exception, sessions: Sequence[Session]) -> bool:
        """Whether a link lost for ``failure`` is one a new link may mend, with one of
        ``sessions`` to mend."""
        if (self._redial is None or isinstance(failure, RemoteProtocolError)
                or (isinstance(failure, RequestError) and not failure.retriable)):
            return False
        if isinstance(failure, RequestError | ConnectionLost) or retriable(failure)[0]:
            return any(s.resumable for s in sessions)
        return False

    def begin(self, sessions: Sequence[Session]) -> list[Session]:
        """The link is lost: the resumable of ``sessions`` wait for the next one (requests
        wait with them); the others, returned, end."""
        waiting = [s for s in sessions if s.resumable]
        self.waiting = waiting
        self.relinked = anyio.Event()
        return [s for s in sessions if s not in waiting]

    def stop_waiting(self) -> list[Session]:
        """The wait is over (a new link is up, or the connection ended): the sessions that
        waited."""
        waiting, self.waiting = self.waiting or [], None
        self.relinked.set()
        return waiting

    async def redial(self, failure: Exception, adopt: Adopt) -> Exception:
        """Tell each waiting session's loss, then dial until a link is up (backing off when
        the last one failed) and hand it to ``adopt``: what ended that link. Or why resuming
        gave up, once every waiting session's window is over (each ends saying so)."""
        assert self._redial is not None and self.waiting is not None
        waiting = self.waiting
        now = time.monotonic()
        for session in waiting:
            if (lost := session.lost(now, str(failure))) is not None:
                self._tell(lost)
        while True:
            if self._attempt:  # the last link failed too: back off (the server's hint first)
                await anyio.sleep(min(backoff(self._attempt - 1, retriable(failure)[1]),
                                      _time_left(waiting)))
            self._attempt += 1
            now = time.monotonic()
            for session in list(waiting):
                if session.time_left(now) <= 0:
                    waiting.remove(session)
                    await session.feed(ConnectionEnded(ConnectionLost(
                        f"could not resume within {session.resume:g} s: {failure}")))
            if not waiting:
                return failure
            async with contextlib.AsyncExitStack() as stack:
                try:
                    transport, carrier = await self._redial(stack, _time_left(waiting))
                except RETRIED as exc:
                    failure = exc
                else:
                    return await adopt(transport, carrier)  # (then the connection decides)

    def resumed(self, session: Session, attached: Attached) -> None:
        """``session`` is attached again (its `attached` not fed yet): tell it, with what
        was lost; the next loss dials at once."""
        self._attempt = 0
        self._tell(session.resumed(attached, time.monotonic()))

    def _tell(self, event: ResumeEvent) -> None:
        if self._on_resume is not None:
            self._on_resume(event)


def _time_left(waiting: list[Session]) -> float:
    """Seconds until the last of ``waiting`` gives up (at least a moment)."""
    now = time.monotonic()
    return max(0.01, max(s.time_left(now) for s in waiting))
