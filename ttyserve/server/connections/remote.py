"""What a client of one worker of `serve --workers N` asks of sessions: answered here when
they are here, sent on over a hop (hop.py) to the worker that holds them otherwise, and
`list` gathered from every worker. The session id or grant names its worker (ids.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import ErrorCode, RequestError
from ...protocol.messages import (
    CONNECTED,
    IDLE,
    UNREACHABLE,
    Error,
    Exit,
    Hello,
    Message,
    Sessions,
    Shared,
    TargetInfo,
    Targets,
    TargetState,
    Unshared,
)
from ...protocol.server import (
    AttachRequested,
    ListRequested,
    ReleaseRequested,
    ShareRequested,
    TargetsRequested,
    UnshareRequested,
)
from ..channels.route import Later
from ..mesh import Mesh
from .hop import WORKER_LOST, Hop, refusal
from .peer_checks import SERVER_NAME
from .requests import SessionRequests

if TYPE_CHECKING:
    from .handler import ConnectionHandler


def _merged(states: set[TargetState]) -> TargetState:
    """One target's state from what each worker says of it."""
    return CONNECTED if CONNECTED in states else UNREACHABLE if UNREACHABLE in states else IDLE


class WorkerRequests(SessionRequests):
    """One client connection's requests in a worker: its hops, by slot, dialled on first
    use, and the requests that go over them."""

    __slots__ = ("_hops", "mesh")

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._hops: dict[int, Hop] = {}

    async def _hop(self, handler: ConnectionHandler, slot: int, grant: str | None = None) -> Hop:
        """This connection's hop to ``slot``, dialled on first use. Raises RequestError."""
        hop = self._hops.get(slot)
        if hop is None or hop.over:
            hello = handler.core.hello
            assert hello is not None
            if grant is not None:  # the far worker checks the grant itself
                hello = Hello(protocol=1, window=hello.window, grant=grant)
            principal = None if grant is not None else handler.principal
            hop = self._hops[slot] = await Hop.open(
                handler, self.mesh, slot, handler.peer, principal, hello, handler.tasks,
                handler.core.max_frame, functools.partial(self._lost, handler))
        return hop

    def close(self, handler: ConnectionHandler) -> None:
        """The connection ends: every link closes (the far sessions go on, detached)."""
        hops, self._hops = self._hops, {}
        for hop in hops.values():
            hop.close()

    # --- requests for sessions elsewhere ---------------------------------------------------

    def hello_elsewhere(self, handler: ConnectionHandler, grant: str) -> Later | None:
        """A `hello` with a grant another worker made: that worker admits it, or not."""
        if (slot := self.mesh.elsewhere(grant)) is None:
            return None

        async def hello() -> None:
            try:
                hop = await self._hop(handler, slot, grant)
            except RequestError as exc:
                handler.close(exc)
                return
            handler.core.accept_hello(SERVER_NAME, hop.welcome.grant)
        return hello

    def attach_requested(self, handler: ConnectionHandler,
                         event: AttachRequested, patient: bool = True) -> Later | None:
        if (slot := self.mesh.elsewhere(event.request.session)) is None:
            return super().attach_requested(handler, event, patient)
        core, channel = handler.core, event.channel

        async def attach() -> None:
            try:
                hop = await self._hop(handler, slot)
            except RequestError as exc:
                core.refuse(channel, exc)
                return
            if await hop.attach(channel, event.request) is None:
                core.refuse(channel, RequestError(
                    ErrorCode.BUSY, f"worker {slot} stopped before it answered",
                    retry_after_ms=250))
        return attach

    def release_requested(self, handler: ConnectionHandler,
                          event: ReleaseRequested) -> Later | None:
        if (slot := self.mesh.elsewhere(event.session)) is None:
            return super().release_requested(handler, event)

        async def release() -> None:
            try:
                hop = await self._hop(handler, slot)
            except RequestError:
                return  # (no answer either way)
            hop.send(hop.core.release(event.session))
        return release

    def list_requested(self, handler: ConnectionHandler, event: ListRequested) -> Later | None:
        here = handler.registry.listing(handler.principal)

        async def listing() -> None:
            found = list(here)
            for slot in self.mesh.others():
                answer = await self._ask(handler, slot, lambda hop: hop.core.list_sessions())
                if isinstance(answer, Sessions):
                    found += answer.sessions
            handler.core.answer(Sessions(sessions=found))
        return listing

    def targets_requested(self, handler: ConnectionHandler,
                          event: TargetsRequested) -> Later | None:
        """`targets` as every worker sees them: each keeps carrier connections of its own,
        so a target is connected while any worker's connection to it is up, and unreachable
        when one's last try failed and none is connected."""
        if handler.registry.targets is None:
            return super().targets_requested(handler, event)
        here = self.targets_here(handler)

        async def listing() -> None:
            states = {target.name: {target.state} for target in here}
            for slot in self.mesh.others():
                answer = await self._ask(handler, slot, lambda hop: hop.core.list_targets())
                if isinstance(answer, Targets):
                    for target in answer.targets:
                        states.get(target.name, set()).add(target.state)
            handler.core.answer(Targets(targets=[
                TargetInfo(name=target.name, labels=target.labels,
                           state=_merged(states[target.name])) for target in here]))
        return listing

    def share_requested(self, handler: ConnectionHandler, event: ShareRequested) -> Later | None:
        if (slot := self.mesh.elsewhere(event.request.session)) is None:
            return super().share_requested(handler, event)

        async def share() -> None:
            answer = await self._ask(handler, slot, lambda hop: hop.core.share(event.request))
            self._answer(handler, answer, Shared)
        return share

    def unshare_refused(self, handler: ConnectionHandler, event: UnshareRequested,
                        exc: RequestError) -> Later | None:
        """A grant this worker does not know: the worker its secret names, or (a public id
        names none) each other one in turn until one knows it."""
        name, mesh = event.request.grant, self.mesh
        slots = [slot] if (slot := mesh.owner(name)) is not None else mesh.others()
        if exc.code != ErrorCode.NO_SUCH_SESSION or mesh.slot in slots:
            return super().unshare_refused(handler, event, exc)

        async def unshare() -> None:
            answer: Message | None = None
            for slot in slots:
                answer = await self._ask(handler, slot, lambda hop: hop.core.unshare(event.request))
                if not (isinstance(answer, Error) and answer.code == ErrorCode.NO_SUCH_SESSION):
                    break
            self._answer(handler, answer, Unshared)
        return unshare

    async def _ask(self, handler: ConnectionHandler,
                   slot: int, frame: Callable[[Hop], bytes]) -> Message | None:
        try:
            hop = await self._hop(handler, slot)
        except RequestError:
            return None
        return await hop.ask(frame(hop))

    def _answer(self, handler: ConnectionHandler, answer: Message | None, kind: type) -> None:
        core = handler.core
        if isinstance(answer, kind):
            core.answer(answer)  # type: ignore[arg-type]
        elif isinstance(answer, Error):
            core.refuse_request(refusal(answer))
        else:
            core.refuse_request(RequestError(
                ErrorCode.BUSY, "the worker that holds it cannot be reached",
                retry_after_ms=250))

    def _lost(self, handler: ConnectionHandler, hop: Hop) -> None:
        """A link ended under its channels: the far worker restarts or stops (the client is
        told so, as its own worker would tell it), or it died (each session's `exit` with
        code -1 and an error: its status cannot be learned)."""
        routes = [hop.channels[channel] for channel in sorted(hop.channels)]
        hop.channels.clear()
        error = hop.error
        if error is not None and error.code in (ErrorCode.SERVER_RESTARTING,
                                                 ErrorCode.SHUTTING_DOWN):
            handler.close(refusal(error))
            return
        for route in routes:
            handler.end_channel(route, Exit(code=-1, error=WORKER_LOST))
        handler.flush()
