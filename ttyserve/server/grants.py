"""Grants (protocol section 11): bearer secrets that let someone without the token attach one
session, in one role, until they expire or are revoked.

A grant is 256 random bits, URL-safe. The server keeps a hash of it, never the grant, and
names it everywhere else (the journal, `list`, logs) by its public id: the first bits of
that hash, which say nothing about the grant. No I/O here: the registry asks, and detaches
the channels a grant's end concerns.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..ids import new_grant
from ..protocol.messages import GrantInfo, GrantScope, Role
from .journal import rfc3339


def public_id(grant: str) -> str:
    """The name of ``grant`` that records and listings may show: not the grant, and no way
    back to it (the first 72 bits of its SHA-256, URL-safe)."""
    return "gid-" + base64.urlsafe_b64encode(_digest(grant)[:9]).decode()


@dataclass
class Grant:
    """One open grant: whose, for what, until when. ``digest`` stands for the secret."""

    id: str  # public
    digest: bytes
    session: str
    role: Role
    owner: str  # the principal that made it: only it may revoke it
    expires: float  # wall-clock seconds (time.time): it survives an upgrade in place

    @property
    def expires_at(self) -> str:
        return rfc3339(self.expires)

    def scope(self) -> GrantScope:
        return GrantScope(session=self.session, role=self.role, expires=self.expires_at)

    def info(self) -> GrantInfo:
        return GrantInfo(id=self.id, role=self.role, expires=self.expires_at)


def _digest(grant: str) -> bytes:
    return hashlib.sha256(grant.encode("utf-8", "surrogateescape")).digest()


class Grants:
    """The open grants of one server."""

    def __init__(self, prefix: str = "") -> None:
        self._by_id: dict[str, Grant] = {}
        self._prefix = prefix  # with workers: the worker's slot (ids.slot_prefix)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Grant]:
        return iter(list(self._by_id.values()))

    def make(self, session: str, role: Role, ttl: float, owner: str) -> tuple[str, Grant]:
        """A new grant for ``session``: the secret (handed out once, never kept) and its
        record."""
        secret = new_grant(self._prefix)
        grant = Grant(id=public_id(secret), digest=_digest(secret), session=session, role=role,
                      owner=owner, expires=time.time() + ttl)
        self._by_id[grant.id] = grant
        return secret, grant

    def restore(self, grant: Grant) -> None:
        """Keep a grant an upgrade in place handed over."""
        self._by_id[grant.id] = grant

    def valid(self, secret: str, now: float | None = None) -> Grant | None:
        """The open grant whose secret is ``secret``, if it has not expired (compared in
        constant time)."""
        grant = self._by_id.get(public_id(secret))
        if grant is None or not hmac.compare_digest(grant.digest, _digest(secret)):
            return None
        if grant.expires <= (time.time() if now is None else now):
            return None
        return grant

    def find(self, name: str, owner: str) -> Grant | None:
        """``owner``'s grant named by its secret or by its public id (so a grant whose secret
        was lost can still be revoked by its owner)."""
        grant = self._by_id.get(name) or self._by_id.get(public_id(name))
        if grant is None or grant.owner != owner:
            return None
        if grant.id != name and not hmac.compare_digest(grant.digest, _digest(name)):
            return None
        return grant

    def remove(self, grant: Grant) -> None:
        self._by_id.pop(grant.id, None)

    def live(self, grant: Grant) -> bool:
        """Whether ``grant`` is still open: neither revoked nor expired."""
        return self._by_id.get(grant.id) is grant and grant.expires > time.time()

    def due(self, now: float) -> list[Grant]:
        """The grants whose time has run out (still kept: the caller ends them)."""
        return [grant for grant in self._by_id.values() if grant.expires <= now]

    def of_session(self, session: str) -> list[Grant]:
        return [grant for grant in self._by_id.values() if grant.session == session]

    def nearest(self) -> float | None:
        """The wall-clock time the next grant expires, if any."""
        return min((grant.expires for grant in self._by_id.values()), default=None)
