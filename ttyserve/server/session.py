"""The session adapter: one process, owned by the server, its output to an attached sink.

A session belongs to the server's registry, not to a connection: a connection
attaches a channel to it (`OutputSink`), and the session writes its output
there. Per session one task group runs the output pumps (stdout and, in pipe
mode, stderr) while the session's own task awaits the process; stdin is
written straight from the connection's reader when the process takes it, and
only what would block goes through an input pump started for the purpose.
While a pump waits for output, the event loop's readiness callback delivers
what can go out at once (the keystroke path: no task step), and wakes the
pump only for what has to wait: credit, room to send, end-of-file.
`run` sends the exit status only after the process is reaped and its output
reached end-of-file or the linger grace ran out. Cancelling the session's
scope is the cancel path: the process group is hung up, killed after a
grace, reaped, and nothing more is sent.
"""

from __future__ import annotations

import collections
import functools
import signal
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.abc
import anyio.lowlevel

from ..backends.base import OutputSource, ProcessHandle, ProcessSpec
from ..defaults import DEFAULT_LINGER
from ..protocol.frames import FrameKind
from ..protocol.messages import STOLEN, Eof, Exit, Message, Resize, Signal
from .journal import Reason, now_rfc3339
from .scrollback import Scrollback

STDIN_LIMIT = 1 << 20  # stdin queued for a process that does not read, without windows
READ_SIZE = 1 << 17  # the most one read takes, and the largest output frame


class OutputSink(Protocol):
    """Where a session's output goes: the channel of the connection it is attached to."""

    def limit(self) -> int:
        """Bytes that may be sent now (one frame at most); 0 until credit comes."""
        ...

    async def wait_credit(self) -> None:
        """Until `limit` may be above 0."""
        ...

    def send_output(self, kind: FrameKind, data: bytes) -> None:
        """Frame one output frame and hand it to the connection, without waiting."""
        ...

    @property
    def has_room(self) -> bool:
        """Whether the connection's send queue has room for more output."""
        ...

    async def wait_room(self) -> None:
        """Until the connection's send queue has room (at once when the sink is let go)."""
        ...

    async def send_exit(self, status: Exit) -> bool:
        """Send the channel's last frame; False when the sink was let go first (detached)."""
        ...

    def stdin_consumed(self, size: int) -> None:
        """The process took ``size`` bytes of input (STDIN credit may be granted back)."""
        ...

    def ended(self) -> None:
        """The session is over, whichever way it ended: the sink is released."""
        ...

    def release(self, reason: str | None = None) -> None:
        """The session goes on without this sink (detached; ``reason`` "stolen" when another
        took it): the channel ends with `detached`, and whatever waits on the sink wakes."""
        ...


class OutputObserver(Protocol):
    """Sees every output chunk, input chunk and resize, and the end, whether a client is
    attached or not."""

    def output(self, kind: FrameKind, data: bytes) -> None: ...

    def typed(self, data: bytes) -> None: ...

    def resized(self, rows: int, cols: int) -> None: ...

    def exited(self, status: Exit) -> None: ...


class _Reading:
    """Whether an output pump is waiting for output (not sending it) right now."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = False


class ServerSession:
    """One process the server runs, from spawn until its exit status is sent."""

    def __init__(self, session_id: str, process: ProcessHandle, spec: ProcessSpec,
                 peer: str, linger: float = DEFAULT_LINGER, owner: str = "",
                 scrollback: int | None = None) -> None:
        self.id = session_id
        self.process = process
        self.spec = spec
        self.peer = peer  # for the journal and the logs
        self.owner = owner  # the principal that opened it: only it may list or attach it
        self.started = now_rfc3339()
        self.size = (spec.rows, spec.cols)  # the terminal's, as last set
        self.scope = anyio.CancelScope()  # cancelled to cancel the session
        self.sink: OutputSink | None = None
        # Detachable sessions (section 9) keep a ring of their output, attached or not.
        self.ring = Scrollback(scrollback) if scrollback is not None else None
        self.detached_at: float | None = None  # when it was last left without a sink
        self.pending_exit: Exit | None = None  # it ended while detached: for the next attach
        self.observers: list[OutputObserver] = []  # a recording, say: sees all output
        self.on_delivered: Callable[[], None] | None = None  # the registry forgets it then
        self.ending: Reason | None = None  # why it was ended, when something ended it
        self.bytes_in = 0
        self.bytes_out = 0
        self._linger = linger
        self._stdin: collections.deque[bytes | Eof] = collections.deque()
        self._stdin_queued = 0
        self._stdin_room: anyio.Event | None = None  # made only when a feeder has to wait
        self._stdin_broken = False
        self._input_pump_running = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._readers: list[tuple[anyio.CancelScope, _Reading]] = []
        self._lingering_over = False
        self._open_outputs = 2 if process.stderr is not None else 1
        self._outputs_done: anyio.Event | None = None  # made when the exit waits for them

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def detachable(self) -> bool:
        return self.ring is not None

    def attach(self, sink: OutputSink) -> None:
        """Write to ``sink`` from now on; a sink it wrote to before is released as stolen."""
        previous, self.sink = self.sink, sink
        self.detached_at = None
        if previous is not None:
            previous.release(STOLEN)

    def detach(self) -> None:
        """Go on without a sink: output only goes to the ring, and the process never waits.

        Input the process has not taken yet is dropped: it was sent on the channel that
        left, and the next one starts with a whole STDIN window of its own.
        """
        previous, self.sink = self.sink, None
        self.detached_at = time.monotonic()
        in_flight = 1 if self._input_pump_running and self._stdin else 0
        while len(self._stdin) > in_flight:
            item = self._stdin.pop()
            if isinstance(item, bytes):
                self._stdin_queued -= len(item)
        self._wake_feeders()
        if previous is not None:
            previous.release()

    def exit_delivered(self) -> None:
        """The exit of a session that ended while detached reached the next attach."""
        self.pending_exit = None
        if self.on_delivered is not None:
            self.on_delivered()

    def cancel(self, reason: Reason = Reason.CANCELLED) -> None:
        """End the session now: kill and reap its processes, send nothing more."""
        self.ending = self.ending or reason
        self.scope.cancel()

    # --- called by the connection ------------------------------------------

    def feed_stdin(self, data: bytes) -> None:
        """Write stdin now if the process takes it, else queue it (see `stdin_full`)."""
        self.bytes_in += len(data)
        for observer in self.observers:
            observer.typed(data)
        if self._stdin_broken:
            self._consumed(len(data))  # dropped input is granted back all the same
            return
        if not self._stdin and not self._input_pump_running:
            try:
                written = self.process.write_nowait(data)
            except anyio.BrokenResourceError:
                self._stdin_broken = True
                self._consumed(len(data))
                return
            if written:
                self._consumed(written)
            if written == len(data):
                return
            data = data[written:]
        self._queue_input(data)

    @property
    def stdin_full(self) -> bool:
        """Whether more than STDIN_LIMIT is queued: a connection without windows then waits
        (`wait_stdin_room`); with windows the client's credit bounds the queue."""
        return self._stdin_queued > STDIN_LIMIT and not self._stdin_broken

    async def wait_stdin_room(self) -> None:
        while self.stdin_full:
            room = self._stdin_room = self._stdin_room or anyio.Event()
            await room.wait()

    def feed_eof(self) -> None:
        """End-of-input, behind the stdin already queued. An `eof` while one still waits is
        the same one (so a client cannot grow the queue with them)."""
        if not (self._stdin and isinstance(self._stdin[-1], Eof)):
            self._queue_input(Eof())

    def close_input(self) -> None:
        """The session is over: drop queued stdin and release any feeder waiting for room."""
        self._stdin_broken = True
        self._stdin.clear()
        self._stdin_queued = 0
        self._wake_feeders()

    def resize(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)
        self.process.resize(rows, cols)
        for observer in self.observers:
            observer.resized(rows, cols)

    def control(self, message: Message) -> None:
        """Apply `resize` or `signal` at once: they do not wait behind stdin."""
        if isinstance(message, Resize):
            self.resize(message.rows, message.cols)
        elif isinstance(message, Signal):
            self.process.send_signal(signal.Signals["SIG" + message.name])

    def hang_up(self, reason: Reason = Reason.SHUTDOWN) -> None:
        """A graceful shutdown's request: SIGHUP (then SIGCONT) to the process group."""
        self.ending = self.ending or reason
        self.process.hang_up()

    # --- the adapter --------------------------------------------------------

    async def run(self) -> Exit:
        """Pump until the exit status is sent; on cancellation, kill and reap, send nothing."""
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                self._start_input_pump()
                tg.start_soon(self._pump_output, self.process.stdout, FrameKind.STDOUT)
                if self.process.stderr is not None:
                    tg.start_soon(self._pump_output, self.process.stderr, FrameKind.STDERR)
                status = await self.process.wait()
                if self._open_outputs:
                    self._outputs_done = anyio.Event()
                    with anyio.move_on_after(self._linger):
                        await self._outputs_done.wait()
                self._lingering_over = True
                for scope, reading in self._readers:
                    if reading.now:
                        scope.cancel()
                if self._outputs_done is not None:
                    await self._outputs_done.wait()  # the pumps send what is buffered, then stop
                for observer in self.observers:
                    observer.exited(status)
                await self._deliver_exit(status)
                if self._input_pump_running:  # the pumps are done; an input pump may wait on
                    tg.cancel_scope.cancel()
                self._task_group = None  # no input pump starts now: the group is closing
            return status
        finally:
            self._task_group = None
            await self.process.aclose()

    async def _deliver_exit(self, status: Exit) -> None:
        """The exit goes to whichever sink is attached when it can be sent; with none (a
        detached session), it waits for the next attach."""
        while (sink := self.sink) is not None:
            if await sink.send_exit(status):
                return
        self.pending_exit = status

    def _limit(self) -> int:
        """What a pump may read now: the sink's credit, or a frame's worth when detached."""
        sink = self.sink
        return READ_SIZE if sink is None else sink.limit()

    async def _wait_room(self) -> None:
        sink = self.sink
        if sink is not None:
            await sink.wait_credit()  # also ends when the sink is let go

    def _deliver_nowait(self, kind: FrameKind, data: bytes) -> OutputSink | None:
        """Output to the ring, the observers and the sink; the sink, which may be full now."""
        self.bytes_out += len(data)
        if self.ring is not None:
            self.ring.append(kind, data)
        for observer in self.observers:
            observer.output(kind, data)
        sink = self.sink
        if sink is not None:
            sink.send_output(kind, data)
        return sink

    async def _deliver(self, kind: FrameKind, data: bytes) -> None:
        sink = self._deliver_nowait(kind, data)
        if sink is not None and not sink.has_room:  # a slow client: its output waits here
            await sink.wait_room()

    def _deliver_ready(self, source: OutputSource, kind: FrameKind) -> bool:
        """The readiness callback's delivery: True while it may go on, False to wake the pump
        (no credit or no room to send, end-of-file, the session ending)."""
        if self._lingering_over or self.scope.cancel_called:
            return False
        sink = self.sink
        if sink is not None and not sink.has_room:
            return False
        limit = self._limit()
        if not limit:
            return False
        data = source.receive_nowait(limit)
        if not data:
            return not source.at_eof
        self._deliver_nowait(kind, data)
        return sink is None or sink.has_room

    async def _wait_output(self, source: OutputSource, kind: FrameKind) -> None:
        """Until output can be read. Meanwhile, where the loop calls back on readiness, what
        can go out at once is delivered from the callback: no task step per keystroke."""
        if not await source.serve_readable(functools.partial(self._deliver_ready, source, kind)):
            await source.wait_readable()
            return
        sink = self.sink
        if sink is not None and not sink.has_room:
            await sink.wait_room()

    async def _pump_output(self, source: OutputSource, kind: FrameKind) -> None:
        # Credit is checked and spent with no await in between (two pumps share it),
        # and no credit is held while waiting for output. Without credit one byte may be
        # read ahead and held: that is how the pump learns of end-of-file (and lets the
        # exit go) when the output ended exactly at the edge of the window.
        reading = _Reading()
        held = b""
        try:
            with anyio.CancelScope() as scope:
                self._readers.append((scope, reading))
                while not self._lingering_over:
                    reading.now = True  # only a wait may be cut short by the linger
                    limit = self._limit()
                    if not limit:
                        if held:
                            await self._wait_room()
                        elif not (held := source.receive_nowait(1)):
                            if source.at_eof:
                                return
                            await source.wait_readable()
                        continue
                    if held:
                        data, held = held + source.receive_nowait(limit - len(held)), b""
                    else:
                        data = source.receive_nowait(limit)
                    if not data:
                        if source.at_eof:
                            return
                        await self._wait_output(source, kind)
                        continue
                    reading.now = False
                    await self._deliver(kind, data)
                    # A flood never waits for output or room: let the others have a turn
                    # (a keystroke in another session waits for at most one chunk).
                    await anyio.lowlevel.checkpoint()
            # The linger ran out: send what is buffered now, not what comes later.
            while not (limit := self._limit()):
                if not held and not (held := source.receive_nowait(1)):
                    return
                await self._wait_room()
            data = held + source.receive_nowait(limit - len(held))
            if data:
                await self._deliver(kind, data)
        finally:
            reading.now = False  # ended: nothing to cut short (a cancel costs a task's repr)
            self._open_outputs -= 1
            if self._open_outputs == 0 and self._outputs_done is not None:
                self._outputs_done.set()

    # --- input that has to wait ---------------------------------------------

    def _consumed(self, size: int) -> None:
        if self.sink is not None:
            self.sink.stdin_consumed(size)

    def _queue_input(self, item: bytes | Eof) -> None:
        self._stdin.append(item)
        if isinstance(item, bytes):
            self._stdin_queued += len(item)
        self._start_input_pump()

    def _start_input_pump(self) -> None:
        if self._stdin and not self._input_pump_running and self._task_group is not None:
            self._input_pump_running = True
            self._task_group.start_soon(self._pump_input)

    async def _pump_input(self) -> None:
        """Write queued stdin as the process takes it; end when the queue is empty."""
        try:
            while self._stdin:
                item = self._stdin[0]
                try:
                    if isinstance(item, bytes):
                        if not self._stdin_broken:
                            await self.process.send_stdin(item)
                    else:
                        await self.process.send_eof()
                except anyio.BrokenResourceError:
                    self._stdin_broken = True  # the process closed its input: drop the rest
                self._stdin.popleft()
                if isinstance(item, bytes):
                    self._stdin_queued -= len(item)
                    self._consumed(len(item))
                    if self._stdin_queued <= STDIN_LIMIT:
                        self._wake_feeders()
        finally:
            self._input_pump_running = False
            self._wake_feeders()

    def _wake_feeders(self) -> None:
        if self._stdin_room is not None:
            self._stdin_room.set()
            self._stdin_room = None
