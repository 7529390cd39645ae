"""A session's input: written to the process at once when it takes it, else queued.

Stdin is written straight from the connection's reader when the process takes
it (`write_nowait`): no task step for a keystroke. What would block is queued,
with `eof` in order behind it, and written by an input pump that exists only
while something is queued. With windows the client's STDIN credit bounds the
queue; without, the connection waits while more than STDIN_LIMIT is queued.
Input the server took stays queued when its writer detaches or its connection
drops: it reaches the process all the same, `eof` included; the connection of a
later writer waits while more than its window plus STDIN_LIMIT is queued, so that
attaching again and again cannot grow the queue without bound.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from ...backends.base import ProcessHandle
from ...defaults import STDIN_LIMIT
from ...protocol.messages import Eof

Consumed = Callable[[int], None]  # input the process took later, for credit: its size
StartTask = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]

_CLOSED = (anyio.BrokenResourceError, anyio.ClosedResourceError)
# Shared and never added to: an empty deque costs 600 bytes, and most input is taken at once.
_NOTHING_QUEUED: collections.deque[bytes | Eof] = collections.deque()


def _nothing_consumed(size: int) -> None:
    """The consumer of a closed queue."""


class StdinQueue:
    """What a session's process has not taken of its input yet."""

    __slots__ = (
        "_broken",
        "_consumed",
        "_process",
        "_pumping",
        "_queue",
        "_queued",
        "_room",
        "_start_task",
    )

    def __init__(self, process: ProcessHandle, consumed: Consumed,
                 start_task: StartTask) -> None:
        self._process = process
        self._consumed = consumed  # told of what the input pump writes
        self._start_task = start_task
        self._queue = _NOTHING_QUEUED  # a deque of its own once something waits
        self._queued = 0  # bytes in the queue
        self._room: anyio.Event | None = None  # made only when a feeder has to wait
        self._broken = False  # the process closed its input, or the session is over
        self._pumping = False

    def feed(self, data: bytes) -> int:
        """Write ``data`` now as far as the process takes it, queue the rest; the bytes taken
        now (input dropped because the process closed its input counts as taken)."""
        if self._broken:
            return len(data)
        if self._queue or self._pumping:
            self._append(data)
            return 0
        try:
            written = self._process.write_nowait(data)
        except anyio.BrokenResourceError:
            self._broken = True
            return len(data)
        if written < len(data):
            self._append(data[written:])
        return written

    def feed_eof(self) -> None:
        """End of input, behind what is queued. An `eof` while one still waits is the same
        one (so a client cannot grow the queue with them). Nothing once input is over."""
        if not self._broken and not (self._queue and isinstance(self._queue[-1], Eof)):
            self._append(Eof())

    def over(self, window: int | None) -> bool:
        """Whether the feeding connection must wait (`wait_room`): more than STDIN_LIMIT is
        queued, plus its STDIN ``window`` when it has one (its credit bounds what it adds;
        beyond that is input an earlier writer left)."""
        return self._queued > STDIN_LIMIT + (window or 0) and not self._broken

    async def wait_room(self, window: int | None) -> None:
        while self.over(window):
            room = self._room = self._room or anyio.Event()
            await room.wait()

    def close(self) -> None:
        """The session is over: drop the queue, release any feeder waiting for room, let go
        of the session's callback (a cycle through it)."""
        self._broken = True
        self._queue.clear()
        self._queued = 0
        self._consumed = _nothing_consumed
        self._wake_feeders()

    def _append(self, item: bytes | Eof) -> None:
        if self._queue is _NOTHING_QUEUED:
            self._queue = collections.deque()
        self._queue.append(item)
        if isinstance(item, bytes):
            self._queued += len(item)
        if not self._pumping:
            self._pumping = True
            self._start_task(self._pump)

    async def _pump(self) -> None:
        """Write the queue as the process takes it; end when it is empty."""
        try:
            while self._queue:
                item = self._queue[0]
                try:
                    if isinstance(item, Eof):
                        await self._process.send_eof()
                    elif not self._broken:
                        await self._process.send_stdin(item)
                except _CLOSED:
                    self._broken = True  # the process closed its input: drop the rest
                if not self._queue or self._queue[0] is not item:
                    continue  # closed meanwhile: the queue was cleared
                self._queue.popleft()
                if isinstance(item, bytes):
                    self._queued -= len(item)
                    self._consumed(len(item))
                    if self._queued <= STDIN_LIMIT:
                        self._wake_feeders()
        finally:
            self._pumping = False
            self._wake_feeders()

    def _wake_feeders(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None
