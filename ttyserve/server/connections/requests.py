"""What a client asks of sessions, answered in this process: open, attach or watch,
release, list, share and unshare. Where sessions may live in other workers, the
connection's requests are a `WorkerRequests` (remote.py) instead, which answers here what
is here and sends the rest on: the mode is chosen once, when the connection is made.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import anyio

from ...errors import ErrorCode, RequestError
from ...ids import new_session_id
from ...protocol.messages import (
    HTTP,
    INPUT,
    OBSERVER,
    STREAM,
    WRITER,
    Attach,
    Opened,
    Sessions,
    Shared,
    TargetInfo,
    Targets,
    Unshared,
)
from ...protocol.server import (
    AttachRequested,
    ListRequested,
    OpenRequested,
    ReleaseRequested,
    ShareRequested,
    TargetsRequested,
    UnshareRequested,
)
from ..channels.attachment import Attachment, StreamAttachment
from ..channels.observer import InputChannel, Observer
from ..channels.route import Later
from ..journal import SessionAttach, SessionRefused
from ..sessions.session import ServerSession

if TYPE_CHECKING:
    from .handler import ConnectionHandler

LINK_LET_GO = 0.5  # seconds a writer attached over a link has to let go (docs/design.md)


class SessionRequests:
    """The answers to what a client asks of sessions in this process; stateless, so one
    serves every connection (`HERE`), which it is handed with each request."""

    __slots__ = ()

    def hello_elsewhere(self, handler: ConnectionHandler, grant: str) -> Later | None:
        """The admission of a `hello` whose grant another worker made (none here)."""
        return None

    def close(self, handler: ConnectionHandler) -> None:
        """The connection ends (nothing of its own to let go here)."""

    def open_requested(self, handler: ConnectionHandler, event: OpenRequested) -> Later | None:
        target = event.request.target
        if target is None and not handler.gate.may_run_here(handler.principal):
            self._refused(handler, event.channel, RequestError(
                ErrorCode.FORBIDDEN, f"principal {handler.principal!r} may not run sessions "
                "on this host (local = false in the principals file)"))
            return None
        if target is not None and not self._may_open(handler, target):
            self._refused(handler, event.channel, RequestError(
                ErrorCode.NO_SUCH_TARGET, f"no target {target!r} this principal may open"),
                target)
            return None
        if self._open_now(handler, event):
            return None
        return functools.partial(self._open, handler, event)

    def release_requested(self, handler: ConnectionHandler,
                          event: ReleaseRequested) -> Later | None:
        if handler.grant is None or handler.registry.sharing.grants.live(handler.grant):
            handler.registry.release(event.session, handler.principal)
        return None

    def list_requested(self, handler: ConnectionHandler, event: ListRequested) -> Later | None:
        handler.core.answer(Sessions(sessions=handler.registry.listing(handler.principal)))
        return None

    def targets_requested(self, handler: ConnectionHandler,
                          event: TargetsRequested) -> Later | None:
        """`targets`: those this principal may open, and how each is reached now."""
        handler.core.answer(Targets(targets=self.targets_here(handler)))
        return None

    @staticmethod
    def targets_here(handler: ConnectionHandler) -> list[TargetInfo]:
        """The targets the connection's principal may open, as this process sees them."""
        hosts = handler.registry.targets
        return [] if hosts is None else hosts.listing(
            functools.partial(handler.gate.may_open, handler.principal))

    @staticmethod
    def _may_open(handler: ConnectionHandler, name: str) -> bool:
        """Whether the target exists and the connection's principal may open it (one
        answer for both: names are not revealed)."""
        hosts = handler.registry.targets
        place = hosts.place(name) if hosts is not None else None
        return place is not None and handler.grant is None and handler.gate.may_open(
            handler.principal, name, place.target.labels)

    @staticmethod
    def _refused(handler: ConnectionHandler, channel: int, error: RequestError,
                 target: str | None = None) -> None:
        """Refuse an `open` for who asked or where, and journal it (`session.refused`)."""
        handler.core.refuse(channel, error)
        handler.registry.ends.record_soon(
            SessionRefused, new_session_id(), principal=handler.principal, target=target,
            code=str(error.code))

    def _open_now(self, handler: ConnectionHandler, event: OpenRequested) -> bool:
        """Answer an `open` that needs no waiting (no journal to write first); False when it
        has to be awaited (`_open`)."""
        try:
            session = handler.registry.open_nowait(event.request, handler.principal,
                                                   str(handler.peer), len(handler.routes))
        except RequestError as exc:
            handler.core.refuse(event.channel, exc)
            return True
        if session is None:
            return False
        self._opened(handler, event.channel, session, event.request.modes)
        return True

    async def _open(self, handler: ConnectionHandler, event: OpenRequested) -> None:
        try:
            session = await handler.registry.open(event.request, handler.principal,
                                                  str(handler.peer), len(handler.routes))
        except RequestError as exc:
            handler.core.refuse(event.channel, exc)
            return
        self._opened(handler, event.channel, session, event.request.modes)

    def _opened(self, handler: ConnectionHandler, channel: int, session: ServerSession,
                modes: bool) -> None:
        """`opened` (then the terminal's state, if ``modes`` asks), and the session runs,
        attached to ``channel``."""
        attachment = Attachment(handler, channel, session)
        handler.routes[channel] = attachment
        session.attach(attachment)
        handler.registry.ends.start(session)
        if not handler.core.opened(channel, Opened(
                pid=session.pid, argv=session.spec.argv, pty=session.spec.pty,
                session=session.id if session.detachable else None,
                target=session.spec.target)):
            handler.routes.pop(channel, None)  # the connection closed meanwhile
            attachment.released = True
            session.cancel()
        elif modes:
            attachment.watch_modes(session.bytes_out)

    def attach_requested(self, handler: ConnectionHandler,
                         event: AttachRequested, patient: bool = True) -> Later | None:
        """Take over a detachable session, or watch it (section 11): `attached`, its
        scrollback, then live output."""
        request, channel = event.request, event.channel
        if request.role in (STREAM, INPUT) and handler.peer.transport != HTTP:
            handler.core.refuse(channel, RequestError(
                ErrorCode.BAD_REQUEST, f"role {request.role!r} is the HTTP API's own: attach "
                "as writer or observer"))
            return None
        try:
            session = handler.registry.attach(request, handler.principal, len(handler.routes),
                                              handler.grant)
        except RequestError as exc:
            if patient and exc.code == ErrorCode.SESSION_IN_USE and (
                    wait := _patience(handler, request)) is not None:
                return functools.partial(self._attach_once_let_go, handler, event, *wait)
            handler.core.refuse(channel, exc)
            return None
        grant = handler.grant.id if handler.grant is not None else None
        if request.role in (OBSERVER, INPUT):  # its size is not the terminal's
            (Observer if request.role == OBSERVER else InputChannel).attach(
                handler, channel, session, request.offsets, grant, request.modes)
        else:
            if session.final is None and (request.rows or request.cols):
                rows, cols = session.size
                session.resize(request.rows or rows, request.cols or cols)
            (Attachment if request.role == WRITER else StreamAttachment).attach(
                handler, channel, session, request.offsets, grant, request.modes)
        handler.registry.ends.note_soon(session, SessionAttach, str(handler.peer),
                                   role=request.role, grant=grant)
        return None

    async def _attach_once_let_go(self, handler: ConnectionHandler, event: AttachRequested,
                                  session: ServerSession, wait: float) -> None:
        """An attach that meets a writer, tried again once it let go or ``wait`` seconds
        passed: one that asked to wait (`wait`: the HTTP door's output stream taking its
        place back from a framed client that stole it), or one that meets a writer from
        another worker (a client that has just left that worker's connection and come back
        here may be quicker than the news of its leaving, the link's end, which it would
        meet as `session_in_use` where a single process would not: LINK_LET_GO)."""
        deadline = anyio.current_time() + wait
        await handler.reader.interruptibly(session.wait_writer_gone(), deadline)
        if not handler.core.closing:  # (a connection closed meanwhile attaches nothing)
            self.attach_requested(handler, event, patient=False)

    def share_requested(self, handler: ConnectionHandler, event: ShareRequested) -> Later | None:
        try:
            secret, grant = handler.registry.sharing.share(event.request, handler.principal,
                                                   str(handler.peer))
        except RequestError as exc:
            handler.core.refuse_request(exc)
            return None
        handler.core.answer(Shared(session=grant.session, grant=secret, role=grant.role,
                                   expires=grant.expires_at, id=grant.id))
        return None

    def unshare_requested(self, handler: ConnectionHandler,
                          event: UnshareRequested) -> Later | None:
        try:
            grant, channels = handler.registry.sharing.unshare(
                event.request.grant, handler.principal, str(handler.peer))
        except RequestError as exc:
            return self.unshare_refused(handler, event, exc)
        handler.core.answer(Unshared(id=grant.id, channels=channels))
        return None

    def unshare_refused(self, handler: ConnectionHandler,
                        event: UnshareRequested, exc: RequestError) -> Later | None:
        """This worker does not know the grant, or may not end it."""
        handler.core.refuse_request(exc)
        return None


def _patience(handler: ConnectionHandler, request: Attach) -> tuple[ServerSession, float] | None:
    """The session an attach met a writer of, and how long to wait for it to let go: what
    the attach asked (`wait`), or LINK_LET_GO when the writer came over a link from
    another worker; None to answer session_in_use now."""
    session = handler.registry.sessions.get(request.session)
    if session is None:
        return None
    if request.wait:
        return session, request.wait
    sink = session.sink
    return (session, LINK_LET_GO) if isinstance(sink, Attachment) and sink.host.link else None


HERE = SessionRequests()  # the requests of a single process's connections, and of links
