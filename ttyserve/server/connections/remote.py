"""What a client asks of sessions that live in another worker (`serve --workers N`): sent
on over a hop (hop.py), and `list` gathered from every worker.

A part of `ConnectionHandler` (handler.py), apart for size: a mixin whose state is two
tables made on first use, so a connection of a single-process server pays nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ErrorCode, RequestError
from ...protocol.messages import (
    Attach,
    Detach,
    Error,
    Exit,
    Hello,
    Message,
    SessionInfo,
    Sessions,
    Share,
    Shared,
    Unshare,
    Unshared,
)
from ...protocol.server import ServerConnection
from ...transport.outbox import Outbox, TaskStarter
from ..auth import Peer
from ..mesh import Mesh
from ..registry.registry import SessionRegistry
from .hop import WORKER_LOST, Hop, refusal
from .peer_checks import SERVER_NAME
from .waits import Later

if TYPE_CHECKING:
    from ...transport.streams import Buffer


LINK_LET_GO = 0.5  # seconds a writer attached over a link has to let go (requests.py)


class RemoteRequests:
    """The handler's hops, and its requests that go over them."""

    core: ServerConnection
    registry: SessionRegistry
    peer: Peer
    principal: str
    _tasks: TaskStarter
    outbox: Outbox
    link = False  # a link from another worker (mesh.py)
    _hops: dict[int, Hop] | None = None  # by slot, made on first use
    remote: dict[int, Hop] | None = None  # the client's channels whose sessions are elsewhere

    if TYPE_CHECKING:  # the handler's own
        def flush(self) -> None: ...
        def _stop_reading(self) -> None: ...
        def _channel_over(self) -> None: ...

    @property
    def mesh(self) -> Mesh | None:
        return self.registry.mesh

    def elsewhere(self, name: str) -> int | None:
        """The other worker a session id or grant names, if any (a link's requests are for
        this worker: it never sends one on)."""
        mesh = self.mesh
        return None if mesh is None or self.link else mesh.elsewhere(name)

    @property
    def spans_workers(self) -> bool:
        """Whether a `list` here gathers from every worker (not on a link)."""
        return self.mesh is not None and self.mesh.workers > 1 and not self.link

    def hop_for(self, channel: int) -> Hop | None:
        """The hop that carries ``channel``, when its session is elsewhere."""
        remote = self.remote
        return remote.get(channel) if remote is not None else None

    async def _hop(self, slot: int, grant: str | None = None) -> Hop:
        """This connection's hop to ``slot``, dialled on first use. Raises RequestError."""
        hops = self._hops
        if hops is None:
            hops = self._hops = {}
        hop = hops.get(slot)
        if hop is None or hop.over:
            mesh, hello = self.mesh, self.core.hello
            assert mesh is not None and hello is not None
            if grant is not None:  # the far worker checks the grant itself
                hello = Hello(protocol=1, window=hello.window, grant=grant)
            principal = None if grant is not None else self.principal
            hop = hops[slot] = await Hop.open(
                self, mesh, slot, self.peer, principal, hello, self._tasks,
                self.core.max_frame)
        return hop

    # --- requests for sessions elsewhere ---------------------------------------------------

    def remote_attach(self, channel: int, request: Attach, slot: int) -> Later:
        async def attach() -> None:
            try:
                hop = await self._hop(slot)
            except RequestError as exc:
                self.core.refuse(channel, exc)
                return
            if self.remote is None:
                self.remote = {}
            self.remote[channel] = hop
            if not await hop.attach(channel, request):
                self.remote.pop(channel, None)
                self.core.refuse(channel, RequestError(
                    ErrorCode.BUSY, f"worker {slot} stopped before it answered",
                    retry_after_ms=250))
        return attach

    def remote_stdin(self, hop: Hop, channel: int, data: Buffer) -> Later | None:
        hop.stdin(channel, data)
        return None if hop.outbox.has_room else hop.outbox.wait_for_room

    def remote_control(self, hop: Hop, channel: int, message: Message) -> None:
        hop.control(channel, message)

    def remote_detach(self, hop: Hop, channel: int) -> None:
        hop.control(channel, Detach())

    def remote_cancel(self, channel: int) -> None:
        if self.remote is not None and (hop := self.remote.pop(channel, None)) is not None:
            hop.cancel(channel)

    def remote_release(self, session: str, slot: int) -> Later:
        async def release() -> None:
            try:
                hop = await self._hop(slot)
            except RequestError:
                return  # (no answer either way)
            hop.send(hop.core.release(session))
        return release

    def remote_share(self, request: Share, slot: int) -> Later:
        async def share() -> None:
            answer = await self._ask(slot, lambda hop: hop.core.share(request))
            self._answer(answer, Shared)
        return share

    def remote_unshare(self, request: Unshare, slots: list[int]) -> Later:
        """`unshare` where the grant is not here: the worker its secret names, or (a public
        id names none) each other one in turn until one knows it."""
        async def unshare() -> None:
            answer: Message | None = None
            for slot in slots:
                answer = await self._ask(slot, lambda hop: hop.core.unshare(request))
                if not (isinstance(answer, Error) and answer.code == ErrorCode.NO_SUCH_SESSION):
                    break
            self._answer(answer, Unshared)
        return unshare

    def remote_list(self, here: list[SessionInfo]) -> Later:
        async def listing() -> None:
            mesh = self.mesh
            assert mesh is not None
            found = list(here)
            for slot in mesh.others():
                answer = await self._ask(slot, lambda hop: hop.core.list_sessions())
                if isinstance(answer, Sessions):
                    found += answer.sessions
            self.core.answer(Sessions(sessions=found))
        return listing

    def remote_hello(self, grant: str, slot: int) -> Later:
        """A `hello` with a grant another worker made: that worker admits it, or not."""
        async def hello() -> None:
            try:
                hop = await self._hop(slot, grant)
            except RequestError as exc:
                self.core.close(exc)
                self._stop_reading()
                return
            self.core.accept_hello(SERVER_NAME, hop.welcome.grant)
        return hello

    async def _ask(self, slot: int, frame: object) -> Message | None:
        try:
            hop = await self._hop(slot)
        except RequestError:
            return None
        return await hop.ask(frame(hop))  # type: ignore[operator]

    def _answer(self, answer: Message | None, kind: type) -> None:
        if isinstance(answer, kind):
            self.core.answer(answer)  # type: ignore[arg-type]
        elif isinstance(answer, Error):
            self.core.refuse_request(refusal(answer))
        else:
            self.core.refuse_request(RequestError(
                ErrorCode.BUSY, "the worker that holds it cannot be reached",
                retry_after_ms=250))

    # --- what the hops say ---------------------------------------------------------------

    def end_remote(self, channel: int, last: Exit | str | None) -> None:
        """A remote channel's last frame, `exit` or `detached`."""
        if self.remote is not None:
            self.remote.pop(channel, None)
        if isinstance(last, Exit):
            self.core.send_exit(channel, last)
        else:
            self.core.send_detached(channel, last)
        self._channel_over()

    def hop_lost(self, hop: Hop, error: Error | None) -> None:
        """A link ended under its channels: the far worker restarts or stops (the client is
        told so, as its own worker would tell it), or it died (each session's `exit` with
        code -1 and an error: its status cannot be learned)."""
        channels = sorted(hop.channels)
        hop.channels.clear()
        if error is not None and error.code in (ErrorCode.SERVER_RESTARTING,
                                                 ErrorCode.SHUTTING_DOWN):
            self.core.close(refusal(error))
            self._stop_reading()
            self.flush()
            return
        for channel in channels:
            self.end_remote(channel, Exit(code=-1, error=WORKER_LOST))
        self.flush()

    def close_hops(self) -> None:
        """The connection ends: every link closes (the far sessions go on, detached)."""
        if self._hops is not None:
            for hop in self._hops.values():
                hop.close()
        self.remote = None

