"""The registry's grants (section 11): a session shared with a link that admits one role,
until it expires or is revoked, and the channels its end detaches.

A part of `SessionRegistry` (registry.py) that owns the grants.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ...defaults import DEFAULT_SHARE_TTL
from ...errors import ErrorCode, RequestError
from ...protocol.messages import EXPIRED, REVOKED, Share
from ..grants import Grant, Grants
from ..journal import SessionShare, SessionUnshare

if TYPE_CHECKING:
    from .registry import SessionRegistry

log = logging.getLogger("ttyserve")


class Sharing:
    """Makes, revokes and expires the registry's grants."""

    def __init__(self, registry: SessionRegistry, grants: Grants) -> None:
        self.registry = registry
        self.grants = grants

    def share(self, request: Share, owner: str, peer: str) -> tuple[str, Grant]:
        """A grant for ``owner``'s session: the secret and its record; RequestError
        bad_request (a ttl over --max-share-ttl) or no_such_session (as `attach`)."""
        limit = self.registry.settings.max_share_ttl
        ttl = request.ttl if request.ttl is not None else min(DEFAULT_SHARE_TTL, limit)
        if ttl > limit:
            raise RequestError(ErrorCode.BAD_REQUEST, f"ttl {ttl} is over this server's "
                               f"--max-share-ttl of {limit} s")
        session = self.registry.owned(request.session, owner)
        if session.final is not None:
            raise RequestError(ErrorCode.NO_SUCH_SESSION,
                               "no such session: unknown, ended, or not yours")
        secret, grant = self.grants.make(session.id, request.role, ttl, owner)
        log.info("%s: session %s shared (%s, grant %s, until %s)", peer, session.id,
                 grant.role, grant.id, grant.expires_at)
        self.registry.deadline_moved()
        self.registry.ends.record_soon(SessionShare, session.id, peer=peer, grant=grant.id,
                          role=grant.role, expires=grant.expires_at)
        return secret, grant

    def unshare(self, name: str, owner: str, peer: str) -> tuple[Grant, int]:
        """Revoke ``owner``'s grant (named by the grant or its public id): every channel
        attached through it ends with `detached` "revoked"; the grant and how many ended.
        RequestError no_such_session for a grant that is unknown, over, or another's."""
        grant = self.grants.find(name, owner)
        if grant is None:
            raise RequestError(ErrorCode.NO_SUCH_SESSION,
                               "no such grant: unknown, expired, or not yours")
        return grant, self._end_grant(grant, REVOKED, peer)

    def _end_grant(self, grant: Grant, reason: str, peer: str | None = None) -> int:
        """The grant is over (revoked by ``peer``, or expired): its channels end with
        `detached` ``reason``, and the journal says so; how many channels."""
        self.grants.remove(grant)
        session = self.registry.sessions.get(grant.session)
        through = [] if session is None else [
            channel for channel in (session.sink, *session.observers)
            if channel is not None and channel.grant == grant.id]
        for channel in through:
            assert session is not None
            self.registry.cut(session, channel, reason)
        log.info("%sgrant %s of session %s %s (%d channels detached)",
                 f"{peer}: " if peer else "", grant.id, grant.session, reason, len(through))
        self.registry.ends.record_soon(SessionUnshare, grant.session, peer=peer, grant=grant.id,
                          reason=reason, channels=len(through))
        return len(through)

    def expire(self, now: float) -> float | None:
        """End the grants whose time ran out; the wall-clock time the next one does."""
        for grant in self.grants.due(now):
            self._end_grant(grant, EXPIRED)
        return self.grants.nearest()
