"""Channel bookkeeping shared by both ends: states, their transitions, and used ids.

A channel is opening, open or ended (section 1). Live channels have a record
each; ended ones are only remembered as "used", in a compact set of id ranges,
so a long connection's memory does not grow with the sessions it has seen.
"""

from __future__ import annotations

import bisect
import enum

import msgspec

from ..errors import LocalProtocolError


class ChannelState(enum.Enum):
    OPENING = "opening"  # `open` (or `attach`) seen; neither its answer nor its refusal yet
    OPEN = "open"  # `opened` sent: raw carriage until the channel's last frame
    ENDED = "ended"  # `exit`, `detached` or a refusal of the open sent, or cancelled


class Step(enum.Enum):
    """What moves a channel from one state to the next."""

    OPENED = "opened"  # the server answered the open
    REFUSED = "refused"  # the server refused the open with an `error`
    EXITED = "exited"  # the server sent `exit`
    DETACHED = "detached"  # the server sent `detached`
    CANCELLED = "cancelled"  # the client sent `cancel`


# Every legal transition, as data (after h11's _state.py). A step not listed here
# is refused: by the core for its own side, as a protocol error for the peer's.
TRANSITIONS: dict[tuple[ChannelState, Step], ChannelState] = {
    (ChannelState.OPENING, Step.OPENED): ChannelState.OPEN,
    (ChannelState.OPENING, Step.REFUSED): ChannelState.ENDED,
    (ChannelState.OPENING, Step.CANCELLED): ChannelState.ENDED,
    (ChannelState.OPEN, Step.EXITED): ChannelState.ENDED,
    (ChannelState.OPEN, Step.DETACHED): ChannelState.ENDED,
    (ChannelState.OPEN, Step.CANCELLED): ChannelState.ENDED,
}


def next_state(state: ChannelState, step: Step) -> ChannelState | None:
    """The state ``step`` leads to from ``state``, or None when it is not allowed."""
    return TRANSITIONS.get((state, step))


class Credit:
    """One direction of one channel's flow control (section 7), as both ends keep it.

    ``available`` is what the sender may still send. The receiver counts what its side
    has taken (`consumed`) and grants it back once half the window was taken, so the
    sender always has at least half a window to go on with: one policy, written once,
    for STDIN (granted by the server) and output (granted by the client).
    """

    __slots__ = ("_grant_at", "_taken", "available")

    def __init__(self, window: int) -> None:
        self.available = window
        self._taken = 0  # consumed by the receiver and not granted back yet
        self._grant_at = max(1, window // 2)

    def spend(self, size: int) -> bool:
        """Take ``size`` bytes of credit; False (and nothing taken) when there is not enough."""
        if size > self.available:
            return False
        self.available -= size
        return True

    def add(self, size: int) -> None:
        """A grant arrived (the sender's side)."""
        self.available += size

    def consumed(self, size: int) -> int:
        """The receiver took ``size`` bytes: the grant to send back now (added to
        ``available`` already), or 0 while less than half the window is owed."""
        self._taken += size
        if self._taken < self._grant_at:
            return 0
        grant, self._taken = self._taken, 0
        self.available += grant
        return grant


class Channel(msgspec.Struct):
    """A live channel: its state and its credit each way (section 7), None on a connection
    without windows. STDOUT and STDERR share the output credit."""

    state: ChannelState
    pty: bool = True
    output: Credit | None = None
    stdin: Credit | None = None
    observer: bool = False  # attached as an observer (section 11): it may only watch


class IdSet:
    """The ids a connection has used, as sorted disjoint ranges, in bounded memory.

    Ids used in order (1, 2, 3, ...) stay one range. Beyond ``max_ranges``
    the narrowest gap between two ranges is filled: ids in it then count as used
    (an `open` on them is refused as reuse, frames for them are discarded), which
    errs on the side the contract allows and keeps memory bounded whatever a peer does.
    """

    def __init__(self, max_ranges: int = 256) -> None:
        self.max_ranges = max_ranges
        self._starts: list[int] = []
        self._ends: list[int] = []  # inclusive

    def __contains__(self, value: int) -> bool:
        index = bisect.bisect_right(self._starts, value) - 1
        return index >= 0 and value <= self._ends[index]

    def __len__(self) -> int:
        """The number of ranges (what the memory is proportional to)."""
        return len(self._starts)

    def add(self, value: int) -> None:
        if value in self:
            return
        index = bisect.bisect_right(self._starts, value)
        joins_left = index > 0 and self._ends[index - 1] == value - 1
        joins_right = index < len(self._starts) and self._starts[index] == value + 1
        if joins_left and joins_right:
            self._ends[index - 1] = self._ends[index]
            del self._starts[index], self._ends[index]
        elif joins_left:
            self._ends[index - 1] = value
        elif joins_right:
            self._starts[index] = value
        else:
            self._starts.insert(index, value)
            self._ends.insert(index, value)
            if len(self._starts) > self.max_ranges:
                self._fill_narrowest_gap()

    def _fill_narrowest_gap(self) -> None:
        gaps = [self._starts[i + 1] - self._ends[i] for i in range(len(self._starts) - 1)]
        i = gaps.index(min(gaps))
        self._ends[i] = self._ends[i + 1]
        del self._starts[i + 1], self._ends[i + 1]


class ChannelTable:
    """Live channels by id, plus every id ever used: what both cores look channels up in."""

    def __init__(self) -> None:
        self.live: dict[int, Channel] = {}
        self.used = IdSet()

    def state(self, channel: int) -> ChannelState | None:
        """OPENING, OPEN, ENDED, or None for an id never used."""
        record = self.live.get(channel)
        if record is not None:
            return record.state
        return ChannelState.ENDED if channel in self.used else None

    def begin(self, channel: int, pty: bool, window: int | None, stdin_window: int) -> None:
        """``channel``'s `open` (or `attach`): it is opening, with ``window`` of output credit
        and ``stdin_window`` of STDIN credit on a connection with windows (``window`` set)."""
        self.used.add(channel)
        self.live[channel] = Channel(
            ChannelState.OPENING, pty=pty, output=None if window is None else Credit(window),
            stdin=None if window is None else Credit(stdin_window))

    def step(self, channel: int, step: Step) -> bool:
        """Apply our own ``step``: False when the channel has already ended (nothing to
        frame), LocalProtocolError when the step is not allowed from its state."""
        record = self.live.get(channel)
        if record is None:
            if channel in self.used:
                return False
            raise LocalProtocolError(f"channel {channel} was never opened")
        state = next_state(record.state, step)
        if state is None:
            raise LocalProtocolError(
                f"channel {channel}: {step.value} is not allowed while {record.state.value}")
        if state is ChannelState.ENDED:
            del self.live[channel]
        else:
            record.state = state
        return True
