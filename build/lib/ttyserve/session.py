"""The session adapter: one process, owned by the server, its output to an attached sink.

A session belongs to the server's registry, not to a connection: a connection
attaches a channel to it (`OutputSink`), and the session writes its output
there. Per session one task group runs the output pumps (stdout and, in pipe
mode, stderr) while the session's own task awaits the process; stdin is
written straight from the connection's reader when the process takes it, and
only what would block goes through an input pump started for the purpose.
`run` sends the exit status only after the process is reaped and its output
reached end-of-file or the linger grace ran out. Cancelling the session's
scope is the cancel path: the process group is hung up, killed after a
grace, reaped, and nothing more is sent.
"""

from __future__ import annotations

import collections
import signal
from typing import Protocol

import anyio
import anyio.abc

from .backends.base import OutputSource, ProcessHandle, ProcessSpec
from .journal import Reason
from .protocol.frames import FrameKind
from .protocol.messages import Eof, Exit, Message, Resize, Signal
from .settings import DEFAULT_LINGER

STDIN_LIMIT = 1 << 20  # stdin queued for a process that does not read, without windows


class OutputSink(Protocol):
    """Where a session's output goes: the channel of the connection it is attached to."""

    def limit(self) -> int:
        """Bytes that may be sent now (one frame at most); 0 until credit comes."""
        ...

    async def wait_credit(self) -> None:
        """Until `limit` may be above 0."""
        ...

    async def send_output(self, kind: FrameKind, data: bytes) -> None:
        """Send one output frame, waiting while the connection's queue is full."""
        ...

    async def send_exit(self, status: Exit) -> None:
        """Send the channel's last frame."""
        ...

    def stdin_consumed(self, size: int) -> None:
        """The process took ``size`` bytes of input (STDIN credit may be granted back)."""
        ...

    def ended(self) -> None:
        """The session is over, whichever way it ended: the sink is released."""
        ...


class _Reading:
    """Whether an output pump is waiting for output (not sending it) right now."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = False


class Session:
    """One process the server runs, from spawn until its exit status is sent."""

    def __init__(self, session_id: str, process: ProcessHandle, spec: ProcessSpec,
                 peer: str, linger: float = DEFAULT_LINGER) -> None:
        self.id = session_id
        self.process = process
        self.spec = spec
        self.peer = peer  # for the journal and the logs
        self.scope = anyio.CancelScope()  # cancelled to cancel the session
        self.sink: OutputSink | None = None
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
        self._outputs_done = anyio.Event()

    @property
    def pid(self) -> int:
        return self.process.pid

    def attach(self, sink: OutputSink) -> None:
        self.sink = sink

    def cancel(self, reason: Reason = Reason.CANCELLED) -> None:
        """End the session now: kill and reap its processes, send nothing more."""
        self.ending = self.ending or reason
        self.scope.cancel()

    # --- called by the connection ------------------------------------------

    async def feed_stdin(self, data: bytes, wait: bool = True) -> None:
        """Write stdin now if the process takes it, else queue it.

        With ``wait`` (a connection without windows) this waits while more than
        STDIN_LIMIT is queued; with windows the client's credit bounds the queue.
        """
        self.bytes_in += len(data)
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
        while wait and self._stdin_queued > STDIN_LIMIT and not self._stdin_broken:
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

    def control(self, message: Message) -> None:
        """Apply `resize` or `signal` at once: they do not wait behind stdin."""
        if isinstance(message, Resize):
            self.process.resize(message.rows, message.cols)
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
                if not self._outputs_done.is_set():
                    with anyio.move_on_after(self._linger):
                        await self._outputs_done.wait()
                self._lingering_over = True
                for scope, reading in self._readers:
                    if reading.now:
                        scope.cancel()
                if not self._outputs_done.is_set():
                    await self._outputs_done.wait()  # the pumps send what is buffered, then stop
                assert self.sink is not None
                await self.sink.send_exit(status)
                tg.cancel_scope.cancel()
            return status
        finally:
            self._task_group = None
            await self.process.aclose()

    async def _pump_output(self, source: OutputSource, kind: FrameKind) -> None:
        # Credit is checked and spent with no await in between (two pumps share it),
        # and no credit is held while waiting for output. Without credit one byte may be
        # read ahead and held: that is how the pump learns of end-of-file (and lets the
        # exit go) when the output ended exactly at the edge of the window.
        sink = self.sink
        assert sink is not None
        reading = _Reading()
        held = b""
        try:
            with anyio.CancelScope() as scope:
                self._readers.append((scope, reading))
                while not self._lingering_over:
                    reading.now = True  # only a wait may be cut short by the linger
                    limit = sink.limit()
                    if not limit:
                        if held:
                            await sink.wait_credit()
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
                        await source.wait_readable()
                        continue
                    reading.now = False
                    self.bytes_out += len(data)
                    await sink.send_output(kind, data)
            # The linger ran out: send what is buffered now, not what comes later.
            while not (limit := sink.limit()):
                if not held and not (held := source.receive_nowait(1)):
                    return
                await sink.wait_credit()
            data = held + source.receive_nowait(limit - len(held))
            if data:
                self.bytes_out += len(data)
                await sink.send_output(kind, data)
        finally:
            self._open_outputs -= 1
            if self._open_outputs == 0:
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
