"""The names the server hands out, in one place: session ids, journal ids and grants, and
which worker a name belongs to.

A session id and a grant are unguessable (they name what a client may attach) and begin
with a letter (`s`, `g`), since they are typed as arguments and one beginning with `-`
would read as an option. With workers, the worker's slot follows the letter (`s2.…`,
`g2.…`): any worker routes a name to its owner with no directory (mesh.py).
"""

from __future__ import annotations

import itertools
import re
import secrets

SESSION = "s"
GRANT = "g"
SESSION_BYTES = 16  # random bytes in a session id: 128 bits
GRANT_BYTES = 32  # random bytes in a grant: 256 bits (the contract asks for at least 128)
GRANT_PATTERN = re.compile(GRANT + r"(\d+\.)?[A-Za-z0-9_-]{43}")  # what `new_grant` makes


def slot_prefix(slot: int | None) -> str:
    """What follows the letter in this worker's names (none with one process)."""
    return "" if slot is None else f"{slot}."


def new_session_id(prefix: str = "") -> str:
    """A detachable session's id: 128 random bits, URL-safe, after ``slot_prefix``."""
    return SESSION + prefix + secrets.token_urlsafe(SESSION_BYTES)


def new_grant(prefix: str = "") -> str:
    """A grant's secret: 256 random bits, URL-safe, after ``slot_prefix``."""
    return GRANT + prefix + secrets.token_urlsafe(GRANT_BYTES)


def slot_of(name: str, workers: int) -> int | None:
    """The slot a session id or grant names (`s2.…`, `g2.…`); None when it names none."""
    head, dot, _ = name[1:].partition(".")
    if not dot or not head.isdigit() or name[:1] not in (SESSION, GRANT):
        return None
    slot = int(head)
    return slot if slot < workers else None


class JournalIds:
    """Ids for sessions no client can name (not detachable): unique, not secret, so cheap:
    this server's random prefix and a count (the journal outlives the server)."""

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix + secrets.token_urlsafe(9) + "."
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count)}"
