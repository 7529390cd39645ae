"""Section 13's Idempotency-Key: a principal's key starts one session in the whole server,
while that session is known (a retried request never runs twice).

The registry's part that owns the keys: those its sessions hold, and those of opens under
way; with workers, each is also claimed server-wide (`Census.claim`), so no other worker
starts a second session with it, even at the same moment.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ...errors import ErrorCode, RequestError
from ..mesh import Census

log = logging.getLogger("ttyserve")
OPENING = "(opening)"  # what holds a key while its session is spawned


class IdempotencyKeys:
    """Which session holds each (principal, key): this worker's, and its claims on the rest
    of the server's."""

    def __init__(self, census: Census | None) -> None:
        self._census = census  # with workers: the claims every worker sees
        self._held: dict[tuple[str, str], str] = {}  # -> its session's id, or OPENING

    def take(self, owner: str, key: str | None, detachable: bool) -> None:
        """Hold ``key`` for an open of ``owner``'s; RequestError bad_request (a key needs a
        detachable session) or session_in_use, naming the session that holds it (or the
        other worker that does)."""
        if key is None:
            return
        if not detachable:
            raise RequestError(ErrorCode.BAD_REQUEST, "idempotency_key needs detachable: true")
        held = self._held.get((owner, key))
        if held is not None:
            raise RequestError(ErrorCode.SESSION_IN_USE,
                               f"a session with this idempotency key exists: {held}")
        if self._census is not None and not self._census.claim(_name(owner, key)):
            raise RequestError(ErrorCode.SESSION_IN_USE, "a session with this idempotency "
                               "key exists on another worker")
        self._held[(owner, key)] = OPENING

    @contextmanager
    def holding(self, owner: str, key: str | None, detachable: bool) -> Iterator[None]:
        """`take` for an open, let go again if the open fails in any way (a refusal, a
        failed spawn, a cancel); once it succeeded, its session holds the key (`opened`)."""
        self.take(owner, key, detachable)
        try:
            yield
        except BaseException:
            self.release(owner, key)
            raise

    def opened(self, owner: str, key: str | None, session_id: str) -> None:
        """``session_id``, opened here, holds ``key`` (taken) from now on."""
        if key is not None:
            self._held[(owner, key)] = session_id

    def adopted(self, owner: str, key: str | None, session_id: str) -> None:
        """``session_id``, handed over by an upgrade in place, holds ``key``: claimed again
        server-wide (the execve closed a descriptor of the census, which let this process's
        record locks go; no other worker opens anything while an upgrade is under way)."""
        if key is None:
            return
        if self._census is not None and not self._census.claim(_name(owner, key)):
            log.warning("session %s: its idempotency key is another worker's now", session_id)
        self._held[(owner, key)] = session_id

    def release(self, owner: str, key: str | None) -> None:
        """Another open may use ``key`` again: its session was forgotten, or never began."""
        if (key is not None and self._held.pop((owner, key), None) is not None
                and self._census is not None):
            self._census.release(_name(owner, key))


def _name(owner: str, key: str) -> str:
    """A key as the whole server knows it: its principal's."""
    return f"{owner}\0{key}"
