"""Section 10's heartbeat, without I/O: when a side pings, and when it gives its peer up.

Each side sends something at least every ``interval`` seconds (a `ping` when it has
nothing else to send) and considers the connection dead after HEARTBEAT_MISSES intervals
in which nothing at all came. The I/O layer tells it what it sent and received, and
asks it at `next_check` what to do.
"""

from __future__ import annotations

import enum

from ..defaults import HEARTBEAT_MISSES


class Beat(enum.Enum):
    PING = "ping"  # nothing was sent for an interval: send `ping`
    DEAD = "dead"  # nothing came for HEARTBEAT_MISSES intervals: the connection is gone


class Heartbeat:
    """The clock of one connection's heartbeat (times in the caller's monotonic seconds)."""

    __slots__ = ("interval", "last_received", "last_sent")

    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self.last_sent = now
        self.last_received = now

    @property
    def silence_limit(self) -> float:
        return HEARTBEAT_MISSES * self.interval

    def check(self, now: float) -> Beat | None:
        """What is due at ``now``: DEAD before PING (a dead peer needs no ping)."""
        if now - self.last_received >= self.silence_limit:
            return Beat.DEAD
        if now - self.last_sent >= self.interval:
            return Beat.PING
        return None

    def next_check(self) -> float:
        """When something may next be due."""
        return min(self.last_sent + self.interval, self.last_received + self.silence_limit)
