"""The one writer of a connection: bytes go out in the order the core framed them.

What the protocol core hands out (`data_to_send()`) is first tried straight on
the socket by the task that made it (no hop through another task when nothing
is queued: the keystroke-echo path). What does not fit is queued, and a
writer task, started only then and ending when the queue is empty, sends it as
the socket drains. Producers that can wait (`wait_for_room`) wait while more
than `limit` bytes are queued: that is how a client that stops reading stops
the process's output instead of growing our memory. On a Unix socket a frame's
payload may also wait in its pipe, in flight (`push_from_pipe`, `PipeTail`): the
kernel moves it when the socket drains.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.abc

from ..defaults import OUTBOX_LIMIT
from .splice import discard
from .streams import MAX_IOVECS, Buffer, SocketTransport, Transport, unsent


class TaskStarter(Protocol):
    """Where the writer task runs: an anyio task group, or anything that starts tasks alike."""

    def start_soon(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> object:
        ...


_NOTHING_QUEUED: collections.deque[Item] = collections.deque()  # shared, never added to:
# an empty deque costs 600 bytes, and most connections never queue a byte
BATCH_BYTES = 1 << 20  # the most one sendmsg() is given


class Outbox:
    """Serialises buffers onto a transport, in order, with bounded memory."""

    _tails = 0  # pipes' bytes in flight (PipeTail) in the queue (an instance's own only
    # once one was: a connection's attributes are memory per session)

    def __init__(self, transport: Transport, on_broken: Callable[[], None] | None = None,
                 on_room: Callable[[], None] | None = None, limit: int = OUTBOX_LIMIT) -> None:
        self.transport = transport
        self.limit = limit
        self._on_broken = on_broken
        self._on_room = on_room  # told when the queue falls back to the limit
        self._task_group: TaskStarter | None = None
        self._writing = False
        self.broken = False
        self._buffers = _NOTHING_QUEUED  # a deque of its own once something waits
        self._queued = 0
        self._closing = False
        self._room: anyio.Event | None = None  # made only when a producer has to wait
        self._done = False  # closed and flushed, or broken
        self._done_event: anyio.Event | None = None  # made only when someone waits for it

    def attach(self, task_group: TaskStarter) -> None:
        """Where the writer task runs when one is needed; call before the first `push`."""
        self._task_group = task_group

    def push(self, buffers: Sequence[Buffer]) -> None:
        """Send ``buffers`` in order: now if the socket takes them, else queued. Never waits.

        Raises anyio.BrokenResourceError once the connection is broken or closed.
        """
        if self.broken or self._closing:
            raise anyio.BrokenResourceError("the connection is closed")
        if not buffers:
            return
        if not self._buffers:
            try:
                sent = self.transport.try_send(buffers)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.abort()
                raise anyio.BrokenResourceError("the connection is broken") from None
            rest = unsent(buffers, sent)
            if not rest:
                return
        else:
            rest = list(buffers)
        self._queue(rest)

    def _queue(self, items: Sequence[Item]) -> None:
        """Queue ``items`` behind what waits, and have the writer task send them."""
        if self._buffers is _NOTHING_QUEUED:
            self._buffers = collections.deque(items)
        else:
            self._buffers.extend(items)
        for item in items:
            self._queued += len(item)
            if isinstance(item, PipeTail):
                self._tails += 1
        if not self._writing:
            assert self._task_group is not None, "Outbox.attach() was not called"
            self._writing = True
            self._task_group.start_soon(self._drain)

    @property
    def splices(self) -> bool:
        """Whether `push_from_pipe` may be used: the transport splices (a Unix socket)."""
        transport = self.transport
        return isinstance(transport, SocketTransport) and transport.splices

    def push_from_pipe(self, buffers: Sequence[Buffer], pipe: int, size: int) -> None:
        """Send ``buffers``, then the next ``size`` bytes of ``pipe`` (it holds them now),
        moved by the kernel (only where the transport `splices`).

        What the socket does not take now stays in the pipe, in flight (`PipeTail`, on a
        descriptor of its own): no room is counted while any is (`has_room`), so nobody
        frames more until the writer task has spliced it. Raises anyio.BrokenResourceError
        as `push` (the bytes are dropped from the pipe then).
        """
        if self.broken or self._closing:
            discard(pipe, size)
            raise anyio.BrokenResourceError("the connection is closed")
        assert isinstance(self.transport, SocketTransport) and self.transport.splices
        if not self._buffers:
            try:
                buffers = unsent(buffers, self.transport.try_send(buffers))
                if not buffers:
                    size -= self.transport.try_splice(pipe, size)
                    if not size:
                        return
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                discard(pipe, size)
                self.abort()
                raise anyio.BrokenResourceError("the connection is broken") from None
        self._queue([*buffers, PipeTail(os.dup(pipe), size)])

    @property
    def idle(self) -> bool:
        """Whether nothing waits to be sent (everything pushed went out)."""
        return not self._writing and not self._buffers

    @property
    def has_room(self) -> bool:
        """Whether a producer may go on without waiting (not while a pipe's bytes are in
        flight: their pump must not read that pipe before they went out)."""
        return (self._queued <= self.limit and not self._tails) or self.broken

    async def wait_for_room(self) -> None:
        """Wait while more than `limit` bytes are queued (returns at once when broken)."""
        while self._queued > self.limit and not self.broken:
            room = self._room = self._room or anyio.Event()
            await room.wait()

    def close(self) -> None:
        """No more pushes: what is queued is still sent (`wait_done`)."""
        self._closing = True
        if not self._writing:
            self._set_done()

    def release(self) -> None:
        """Its owner is done with it: the callbacks go (they hold the owner, and would keep
        it until a collection)."""
        self._on_broken = self._on_room = None

    async def wait_done(self) -> None:
        """Until everything pushed was sent after `close`, or the connection broke."""
        if not self._done:
            self._done_event = self._done_event or anyio.Event()
            await self._done_event.wait()

    def _set_done(self) -> None:
        self._done = True
        if self._done_event is not None:
            self._done_event.set()

    def abort(self) -> None:
        """The connection is broken, or given up (its peer went silent): what is queued is
        dropped, and no producer waits for it any more."""
        if self.broken:
            return
        self.broken = True
        for item in self._buffers:
            if isinstance(item, PipeTail):
                item.close(drop=True)
        self._buffers.clear()
        self._queued = 0
        if self._tails:
            self._tails = 0
        self._wake_producers()
        self._set_done()
        if self._on_broken is not None:
            self._on_broken()

    def _wake_producers(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    def _batch(self) -> list[Buffer]:
        batch: list[Buffer] = []
        size = 0
        for buffer in self._buffers:
            if size >= BATCH_BYTES or len(batch) >= MAX_IOVECS or isinstance(buffer, PipeTail):
                break
            batch.append(buffer)
            size += len(buffer)
        return batch

    async def _drain(self) -> None:
        """The writer task: send the queue as the socket takes it, until it is empty."""
        try:
            while self._buffers and not self.broken:
                head = self._buffers[0]
                try:
                    if isinstance(head, PipeTail):  # (its descriptor is closed once broken:
                        assert isinstance(self.transport, SocketTransport)  # check after waits)
                        sent = self.transport.try_splice(head.pipe, head.size)
                        if not sent:
                            await self.transport.wait_writable()
                            continue
                    else:
                        sent = await self.transport.send_some(self._batch())
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self.abort()
                    return
                if self.broken:
                    return  # aborted while it sent: the queue is gone
                full = self._queued > self.limit or self._tails
                self._queued -= sent
                while sent:
                    head = self._buffers[0]
                    if sent < len(head):
                        self._buffers[0] = head.rest(sent) if isinstance(head, PipeTail) else (
                            memoryview(head)[sent:])
                        break
                    sent -= len(head)
                    self._buffers.popleft()
                    if isinstance(head, PipeTail):
                        head.close()
                        self._tails -= 1
                if self._queued <= self.limit and not self._tails:
                    self._wake_producers()
                    if full and self._on_room is not None:
                        self._on_room()
        except anyio.get_cancelled_exc_class():
            if self._tails:
                self.abort()  # (the connection is going: no pipe descriptor outlives it)
            raise
        finally:
            self._writing = False
            self._wake_producers()
            if self._closing or self.broken:
                self._set_done()


@dataclass(slots=True)
class PipeTail:
    """The rest of a frame still in a pipe (`Outbox.push_from_pipe`), on a duplicate of the
    pipe's descriptor: the session may close its own meanwhile."""

    pipe: int
    size: int

    def __len__(self) -> int:
        return self.size

    def rest(self, sent: int) -> PipeTail:
        self.size -= sent
        return self

    def close(self, drop: bool = False) -> None:
        """Done with it; with ``drop``, its bytes are taken out of the pipe unsent."""
        if drop:
            discard(self.pipe, self.size)
        os.close(self.pipe)


Item = Buffer | PipeTail
