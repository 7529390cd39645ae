"""What a client asks of sessions, answered for one connection: open, attach or watch,
cancel, detach, release, list, share and unshare; and its channels let go at its end.

A part of `ConnectionHandler` (handler.py), apart for size: a mixin with no state of its
own, which reads and changes the handler's channel table and answers through its core.
"""

from __future__ import annotations

import functools
from typing import cast

import anyio

from ...errors import ErrorCode, RequestError
from ...protocol.messages import OBSERVER, Opened, Sessions, Shared, Unshared
from ...protocol.server import (
    AttachRequested,
    CancelRequested,
    DetachRequested,
    ListRequested,
    OpenRequested,
    ReleaseRequested,
    ServerConnection,
    ShareRequested,
    UnshareRequested,
)
from ..auth import Peer
from ..channels.attachment import Attachment, ChannelHost
from ..channels.observer import Observer
from ..grants import Grant
from ..journal import SessionAttach, SessionDetach
from ..registry.registry import SessionRegistry
from ..sessions.session import ServerSession
from .remote import LINK_LET_GO, RemoteRequests
from .waits import Later


class SessionRequests(RemoteRequests):
    """The handler's answers to what its client asks of sessions."""

    core: ServerConnection
    registry: SessionRegistry
    attachments: dict[int, Attachment | Observer]
    principal: str
    grant: Grant | None
    peer: Peer

    def open_requested(self, event: OpenRequested) -> Later | None:
        return None if self._open_now(event) else functools.partial(self._open, event)

    def cancel_requested(self, event: CancelRequested) -> None:
        """The core has ended the channel: its session is cancelled."""
        self.remote_cancel(event.channel)
        attachment = self.attachments.pop(event.channel, None)
        if attachment is not None:
            attachment.leave()
            attachment.session.cancel()

    def release_requested(self, event: ReleaseRequested) -> Later | None:
        if (slot := self.elsewhere(event.session)) is not None:
            return self.remote_release(event.session, slot)
        if self.grant is None or self.registry.grants.live(self.grant):
            self.registry.release(event.session, self.principal)
        return None

    def list_requested(self, event: ListRequested) -> Later | None:
        here = self.registry.listing(self.principal)
        if self.spans_workers:
            return self.remote_list(here)
        self.core.answer(Sessions(sessions=here))
        return None

    def _open_now(self, event: OpenRequested) -> bool:
        """Answer an `open` that needs no waiting (no journal to write first); False when it
        has to be awaited (`_open`)."""
        try:
            session = self.registry.open_nowait(event.request, self.principal, str(self.peer),
                                                len(self.attachments))
        except RequestError as exc:
            self.core.refuse(event.channel, exc)
            return True
        if session is None:
            return False
        self._opened(event.channel, session)
        return True

    async def _open(self, event: OpenRequested) -> None:
        try:
            session = await self.registry.open(event.request, self.principal, str(self.peer),
                                               len(self.attachments))
        except RequestError as exc:
            self.core.refuse(event.channel, exc)
            return
        self._opened(event.channel, session)

    def _opened(self, channel: int, session: ServerSession) -> None:
        """`opened`, and the session runs, attached to ``channel``."""
        attachment = Attachment(cast(ChannelHost, self), channel, session)
        self.attachments[channel] = attachment
        session.attach(attachment)
        self.registry.start(session)
        if not self.core.opened(channel, Opened(
                pid=session.pid, argv=session.spec.argv, pty=session.spec.pty,
                session=session.id if session.detachable else None)):
            self.attachments.pop(channel, None)  # the connection closed meanwhile
            attachment.released = True
            session.cancel()

    def attach_requested(self, event: AttachRequested, patient: bool = True) -> Later | None:
        """Take over a detachable session, or watch it (section 11): `attached`, its
        scrollback, then live output; over a hop where it lives in another worker."""
        request, channel = event.request, event.channel
        if (slot := self.elsewhere(request.session)) is not None:
            return self.remote_attach(channel, request, slot)
        try:
            session = self.registry.attach(request, self.principal, len(self.attachments),
                                           self.grant)
        except RequestError as exc:
            if patient and exc.code == ErrorCode.SESSION_IN_USE and self._held_by_link(
                    request.session):
                return functools.partial(self._attach_once_let_go, event)
            self.core.refuse(channel, exc)
            return None
        grant = self.grant.id if self.grant is not None else None
        if request.role == OBSERVER:  # its size is not the terminal's
            Observer.attach(cast(ChannelHost, self), channel, session, request.offsets, grant)
        else:
            if session.final is None and (request.rows or request.cols):
                rows, cols = session.size
                session.resize(request.rows or rows, request.cols or cols)
            Attachment.attach(cast(ChannelHost, self), channel, session, request.offsets,
                              grant)
        self.registry.note_soon(session, SessionAttach, str(self.peer), role=request.role,
                                grant=grant)
        return None

    def _held_by_link(self, session_id: str) -> bool:
        """Whether the session's writer came over a link from another worker."""
        session = self.registry.sessions.get(session_id)
        sink = session.sink if session is not None else None
        return bool(getattr(getattr(sink, "host", None), "link", False))

    async def _attach_once_let_go(self, event: AttachRequested) -> None:
        """An attach that meets a writer from another worker: a client that has just left
        that worker's connection and come back here may be quicker than the news of its
        leaving (the link's end), which it would meet as `session_in_use` where a single
        process would not; such a writer is given LINK_LET_GO seconds to let go."""
        deadline = anyio.current_time() + LINK_LET_GO
        while self._held_by_link(event.request.session) and anyio.current_time() < deadline:
            await anyio.sleep(LINK_LET_GO / 50)
        self.attach_requested(event, patient=False)

    def share_requested(self, event: ShareRequested) -> Later | None:
        if (slot := self.elsewhere(event.request.session)) is not None:
            return self.remote_share(event.request, slot)
        try:
            secret, grant = self.registry.share(event.request, self.principal, str(self.peer))
        except RequestError as exc:
            self.core.refuse_request(exc)
            return None
        self.core.answer(Shared(session=grant.session, grant=secret, role=grant.role,
                                expires=grant.expires_at, id=grant.id))
        return None

    def unshare_requested(self, event: UnshareRequested) -> Later | None:
        name, mesh = event.request.grant, self.mesh
        elsewhere = [] if mesh is None or self.link else (
            [slot] if (slot := mesh.owner(name)) is not None else mesh.others())
        if mesh is not None and mesh.slot in elsewhere:
            elsewhere = []
        try:
            grant, channels = self.registry.unshare(name, self.principal, str(self.peer))
        except RequestError as exc:
            if elsewhere and exc.code == ErrorCode.NO_SUCH_SESSION:
                return self.remote_unshare(event.request, elsewhere)
            self.core.refuse_request(exc)
            return None
        self.core.answer(Unshared(id=grant.id, channels=channels))
        return None

    def detach_requested(self, event: DetachRequested) -> None:
        channel = event.channel
        if (hop := self.hop_for(channel)) is not None:
            self.remote_detach(hop, channel)
            return
        attachment = self.attachments.get(channel)
        if attachment is None:
            return
        if not attachment.session.detachable:
            self.core.refuse(channel, RequestError(
                ErrorCode.BAD_REQUEST, "this session is not detachable (it was not opened "
                "with detachable: true); cancel it instead"))
            return
        attachment.release()  # `detached`: the channel's last frame
        self._let_go(attachment)

    def _leave(self, attachment: Attachment | Observer) -> None:
        """This connection lets go of a session: a detachable one goes on, detached; any other
        is cancelled (the client has gone, as `cancel` does)."""
        self.attachments.pop(attachment.channel, None)
        attachment.leave()
        if attachment.session.detachable:
            self._let_go(attachment)
        else:
            attachment.session.cancel()

    def _let_go(self, attachment: Attachment | Observer) -> None:
        # Noted at once, not left to this task: a client that hangs up right after `detach`
        # breaks the send of `detached`, and that ends the reader before it could note it.
        session = attachment.session
        if isinstance(attachment, Attachment) and session.sink is attachment:
            session.detach()
        self.registry.note_soon(session, SessionDetach, str(self.peer), role=attachment.role,
                                grant=attachment.grant)
