"""Who may talk to the server, and as whom: tokens on TCP and TLS, uids on Unix sockets,
grants for one session (section 11), and a brake on guessing. The handler reports the peer
and its `hello`; this decides.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import ErrorCode, RequestError
from .grants import Grant, Grants
from .principals import Principals

log = logging.getLogger("ttyserve")

FREE_FAILURES = 5  # failed hellos per peer within the window before answers slow down
WINDOW = 60.0  # seconds a failure is remembered
MAX_DELAY = 30.0  # the slowest answer to a peer that keeps guessing
THROTTLE_SLOTS = 4096  # peers whose failed hellos are counted at once (a newer takes the
TABLE_BYTES = 3 * 8 * THROTTLE_SLOTS  # slot of an older one): memory stays bounded


@dataclass(frozen=True, slots=True)
class Peer:
    """The other end: an IP for TCP and TLS, a uid and pid for a Unix socket; for `serve
    --stdio`, whoever the carrier authenticated as this server's user."""

    transport: str  # "unix", "tcp", "tls", or "stdio"
    host: str = ""
    uid: int | None = None
    pid: int | None = None

    @property
    def key(self) -> str:
        """What failures are counted by: the address for IP, the uid for Unix sockets."""
        return f"uid:{self.uid}" if self.transport == "unix" else self.host

    def __str__(self) -> str:
        if self.transport == "unix":
            return f"unix(uid={self.uid},pid={self.pid})"
        if self.transport == "stdio":
            return "stdio"
        return f"{self.transport}:{self.host}"


def stdio_peer() -> Peer:
    """The peer of `serve --stdio`."""
    return Peer("stdio", uid=os.getuid())


def peer_of(sock: socket.socket, transport: str) -> Peer:
    if sock.family == socket.AF_UNIX:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        return Peer("unix", uid=uid, pid=pid)
    host = sock.getpeername()[0]
    return Peer(transport, host=host)


@dataclass(frozen=True)
class Access:
    """Who may connect: the token TCP and TLS peers must send, the uids allowed on Unix
    sockets besides the server's own; or, with `--principals`, the principals' tokens on
    every listener."""

    token: str | None = None
    allowed_uids: frozenset[int] = field(default_factory=frozenset)
    principals: Principals | None = None


def principal_of(peer: Peer) -> str:
    """Whom a session belongs to: the uid on a Unix socket; on TCP and TLS every holder of
    the server's token is one principal (protocol section 9)."""
    return f"uid:{peer.uid}" if peer.transport in ("unix", "stdio") else "token"


def refusal(access: Access, peer: Peer, token: str | None) -> str | None:
    """Why this peer may not go on (for the log, never for the peer), or None."""
    if peer.transport == "stdio":
        return None  # the carrier (ssh, kubectl) authenticated it; no token is asked
    if peer.transport == "unix":
        if peer.uid == os.getuid() or peer.uid in access.allowed_uids:
            return None
        return f"uid {peer.uid} is not allowed on this socket"
    if access.token is None or token_matches(access.token, token):
        return None
    return "missing token" if token is None else "wrong token"


def token_matches(expected: str, offered: str | None) -> bool:
    """Constant-time comparison: how long it takes says nothing about the token."""
    return hmac.compare_digest(expected.encode(), (offered or "").encode())


def delay_after(failures: int) -> float:
    """How long a peer's next hello waits after ``failures`` recent failures."""
    excess = failures - FREE_FAILURES
    return 0.0 if excess < 0 else min(MAX_DELAY, 0.5 * 2.0**excess)


class FailedHellos:
    """The failed-hello brake: a peer's failed hellos in the current window of WINDOW
    seconds (a fixed window), in a table of THROTTLE_SLOTS where a newer peer takes an
    older one's slot, so memory stays bounded. The table is this process's own, or one every
    worker maps (mesh.py's census), so the brake is the same with one process or many (a
    count two workers raise at the same instant may lose one)."""

    def __init__(self, table: memoryview | None = None) -> None:
        # Per slot: key, window start (ns, CLOCK_MONOTONIC: one clock for all), count.
        self._table = table if table is not None else memoryview(
            bytearray(TABLE_BYTES)).cast("q")

    def _slot(self, peer: Peer) -> tuple[int, int]:
        digest = hashlib.blake2b(peer.key.encode(), digest_size=8).digest()
        key = int.from_bytes(digest, "big", signed=True) or 1
        return 3 * (key % THROTTLE_SLOTS), key

    def _recent(self, peer: Peer, now: int) -> tuple[int, int, int]:
        """The peer's slot, key, and failures in the current window (0: none, or none yet)."""
        at, key = self._slot(peer)
        table = self._table
        if table[at] != key or now - table[at + 1] > WINDOW * 1e9:
            return at, key, 0
        return at, key, table[at + 2]

    def delay(self, peer: Peer) -> float:
        """Seconds to wait before answering this peer's hello: 0 until it guessed too often."""
        return delay_after(self._recent(peer, time.monotonic_ns())[2])

    def failed(self, peer: Peer) -> None:
        now = time.monotonic_ns()
        at, key, count = self._recent(peer, now)
        table = self._table
        if count == 0:  # a window of its own begins
            table[at], table[at + 1] = key, now
        table[at + 2] = count + 1


class Gate:
    """The access rules and the throttle of one server: `delay`, then `admit`."""

    def __init__(self, access: Access, throttle: FailedHellos | None = None) -> None:
        """``throttle``: the brake the server's workers share (mesh.py), or this process's
        own."""
        self.access = access
        self.throttle = throttle or FailedHellos()

    def delay(self, peer: Peer) -> float:
        """Seconds to hold this peer's `hello` before answering it."""
        return self.throttle.delay(peer)

    def admit(self, peer: Peer, token: str | None) -> str:
        """The principal this peer acts as; RequestError(unauthorized) when it may not.

        The reason goes to the log; the peer only learns that it was refused.
        """
        access, named = self.access, None
        if access.principals is not None and peer.transport != "stdio":  # (a uid alone is
            named = access.principals.named_by(token)  # not enough then)
            reason = None if named is not None else (
                "missing token" if token is None else "a token of no principal")
        else:
            reason = refusal(access, peer, token)
        if reason is not None:
            self.throttle.failed(peer)
            log.warning("%s: unauthorized: %s", peer, reason)
            raise RequestError(ErrorCode.UNAUTHORIZED, "missing or wrong token, or a peer "
                               "that is not allowed")
        return named.name if named is not None else principal_of(peer)

    def may_run_here(self, principal: str) -> bool:
        """Whether ``principal`` may run sessions on this host (`local` in the principals
        file; every principal may without one)."""
        principals = self.access.principals
        found = principals.get(principal) if principals is not None else None
        return found is None or found.local

    def may_open(self, principal: str, target: str, labels: Mapping[str, str]) -> bool:
        """Whether ``principal`` may open sessions on ``target`` (its `targets` in the
        principals file; without one, the server's one principal may open every target)."""
        principals = self.access.principals
        if principals is None:
            return True
        found = principals.get(principal)
        return found is not None and found.may_open(target, labels)

    def admit_grant(self, peer: Peer, secret: str, grants: Grants) -> Grant:
        """The open grant ``secret`` names (section 11): it admits the peer on any listener,
        for its one session; RequestError(unauthorized) for one unknown or expired (a guess,
        counted as a wrong token is)."""
        grant = grants.valid(secret)
        if grant is None:
            self.throttle.failed(peer)
            log.warning("%s: unauthorized: unknown or expired grant", peer)
            raise RequestError(ErrorCode.UNAUTHORIZED, "unauthorized: the grant is unknown, "
                               "expired or revoked")
        log.info("%s: admitted by grant %s (%s of session %s)", peer, grant.id, grant.role,
                 grant.session)
        return grant
