"""The one writer of a connection: frames go out whole, in order, with bounded memory.

A frame is first tried straight on the socket by the task that made it (no
hop through another task when nothing is queued: the keystroke-echo path).
What does not fit is queued, and a writer task, started only then and ending
when the queue is empty, sends it as the socket drains. Producers wait while
more than `limit` bytes are queued, which is how a client that stops reading
stops the process's output instead of growing our memory. A frame begun on
the wire is always finished.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.abc

from .transport import MAX_IOVECS, Buffer, Transport

DEFAULT_LIMIT = 1 << 20  # bytes queued per connection before producers wait
BATCH_BYTES = 1 << 20  # the most one sendmsg() is given


@dataclass
class _Item:
    channel: int
    buffers: list[Buffer]
    size: int
    started: bool


class Outbox:
    """Serialises frames onto a transport; `run` is the writer task."""

    def __init__(self, transport: Transport, on_broken: Callable[[], None] | None = None,
                 limit: int = DEFAULT_LIMIT) -> None:
        self.transport = transport
        self.limit = limit
        self._on_broken = on_broken
        self._task_group: anyio.abc.TaskGroup | None = None
        self._writing = False
        self.dropped: set[int] = set()  # channels whose queued, unstarted frames are dropped
        self._forget_later: set[int] = set()
        self.broken = False
        self._items: collections.deque[_Item] = collections.deque()
        self._queued = 0
        self._closing = False
        self._space: anyio.Event | None = None  # made only when a producer has to wait
        self.done = anyio.Event()  # set once closed and flushed, or broken

    def attach(self, task_group: anyio.abc.TaskGroup) -> None:
        """Where the writer task runs when one is needed; call before the first `send`."""
        self._task_group = task_group

    async def send(self, channel: int, *parts: Buffer) -> None:
        """Queue one frame (its parts in order); waits while the queue is over its limit.

        Raises anyio.BrokenResourceError once the connection is broken or closed.
        """
        if self.broken or self._closing:
            raise anyio.BrokenResourceError("the connection is closed")
        if channel in self.dropped:
            return  # the client cancelled the channel: nothing more goes out on it
        size = sum(len(p) for p in parts)
        if not self._items:
            try:
                sent = self.transport.try_send(parts)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._break()
                raise anyio.BrokenResourceError("the connection is broken") from None
            if sent == size:
                return
            item = _Item(channel, list(parts), size, started=sent > 0)
            self._consume(item, sent)
        else:
            item = _Item(channel, list(parts), size, started=False)
        self._items.append(item)
        self._queued += item.size
        if not self._writing:
            assert self._task_group is not None, "Outbox.attach() was not called"
            self._writing = True
            self._task_group.start_soon(self._drain)
        while self._queued > self.limit and not self.broken:
            space = self._space = self._space or anyio.Event()
            await space.wait()

    def forget(self, channel: int) -> None:
        """The channel's session is gone: drop its unstarted frames and stop tracking it.

        While the writer task is sending, the queue is left alone (its batch refers
        to it); the writer forgets the channel once the queue is empty.
        """
        if self._writing:
            self._forget_later.add(channel)
        else:  # nothing is queued when no writer runs
            self.dropped.discard(channel)

    def close(self) -> None:
        """No more frames: what is queued is still sent, then `done` is set."""
        self._closing = True
        if not self._writing:
            self.done.set()

    def _break(self) -> None:
        if self.broken:
            return
        self.broken = True
        self._items.clear()
        self._queued = 0
        self._wake_producers()
        self.done.set()
        if self._on_broken is not None:
            self._on_broken()

    def _wake_producers(self) -> None:
        if self._space is not None:
            self._space.set()
            self._space = None

    @staticmethod
    def _consume(item: _Item, sent: int) -> None:
        """Drop ``sent`` bytes from the front of ``item``."""
        item.size -= sent
        while sent:
            first = item.buffers[0]
            if sent >= len(first):
                sent -= len(first)
                item.buffers.pop(0)
            else:
                item.buffers[0] = memoryview(first)[sent:]
                sent = 0

    def _batch(self) -> list[Buffer]:
        buffers: list[Buffer] = []
        size = 0
        for item in self._items:
            if size >= BATCH_BYTES or len(buffers) + len(item.buffers) > MAX_IOVECS:
                break
            buffers.extend(item.buffers)
            size += item.size
        return buffers

    def _drop_cancelled(self) -> None:
        if not self.dropped:
            return
        kept = collections.deque(i for i in self._items
                                 if i.started or i.channel not in self.dropped)
        self._queued = sum(i.size for i in kept)
        self._items = kept

    async def _drain(self) -> None:
        """The writer task: send the queue as the socket takes it, until it is empty."""
        try:
            while self._items and not self.broken:
                self._drop_cancelled()
                if not self._items:
                    break
                try:
                    sent = await self.transport.send_some(self._batch())
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._break()
                    return
                self._queued -= sent
                while sent:
                    head = self._items[0]
                    if sent >= head.size:
                        sent -= head.size
                        self._items.popleft()
                    else:
                        self._consume(head, sent)
                        head.started = True
                        sent = 0
                if self._queued <= self.limit:
                    self._wake_producers()
        finally:
            self._writing = False
            if not self._items:
                self.dropped -= self._forget_later
                self._forget_later.clear()
            self._wake_producers()
            if self._closing or self.broken:
                self.done.set()
