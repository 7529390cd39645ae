"""Interactive first: while someone types, the sessions nobody types into read small.

One process and one loop serve every session. A flooding session's chunk (up to 128 KiB
read, framed and sent) delays whatever else the loop has to do in that turn, and a
keystroke's echo needs two turns (its input, then the terminal's echo). So while anyone
typed into a PTY session in the last TYPING_WINDOW seconds, every session nobody typed
into reads BULK_GRAIN at most per turn: the echo waits behind a small read, not a large
one. When nobody types, nothing changes: pipe output keeps its whole chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

TYPING_WINDOW = 1.0  # seconds after a keystroke during which bulk reads are small
BULK_GRAIN = 16 * 1024  # the most a session nobody types into reads per turn meanwhile


class Typing:
    """When anyone last typed into this server's PTY sessions."""

    __slots__ = ("_clock", "_until")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = 0.0

    def typed(self) -> float:
        """A keystroke now; its time, for the session's own clock."""
        now = self._clock()
        self._until = now + TYPING_WINDOW
        return now

    def limit(self, limit: int, typed_at: float) -> int:
        """What a session last typed into at ``typed_at`` may read of ``limit`` now."""
        if limit <= BULK_GRAIN or not self._until:
            return limit  # (the output pump's path when nobody types: no clock read)
        now = self._clock()
        if now >= self._until:
            self._until = 0.0
            return limit
        return limit if now - typed_at < TYPING_WINDOW else BULK_GRAIN
