"""The session adapter: one process, one channel, the exit frame last.

Per session one task group runs the output pumps (stdout and, in pipe mode,
stderr -> client) while the session's own task awaits the process; stdin is
written straight from the connection's reader when the process takes it, and
only what would block goes through an input pump started for the purpose.
Only `run` writes the `exit` frame, and only after the process is reaped and
its output has reached end-of-file or the linger grace has run out.
Cancelling the session's scope is the cancel path: the process group is hung
up, killed after a grace, reaped, and nothing more is sent.
"""

from __future__ import annotations

import collections
import signal
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from .backends.base import OutputSource, ProcessHandle
from .protocol.frames import HEADER, FrameKind
from .protocol.messages import Eof, Exit, Message, Resize, Signal, Window

DEFAULT_LINGER = 2.0  # seconds of output drain after exit (the contract's default grace)
READ_SIZE = 1 << 20  # the most one frame carries (never above max_frame): one wake-up's output
STDIN_LIMIT = 1 << 20  # stdin bytes queued for a process that does not read before we wait

SendFrame = Callable[..., Awaitable[None]]  # (channel, *parts)


class Credit:
    """Output credit of one channel (protocol section 7); None when the client set no window."""

    def __init__(self, initial: int | None, frame_limit: int = READ_SIZE) -> None:
        self.available = initial
        self.frame_limit = min(READ_SIZE, frame_limit)
        self._changed: anyio.Event | None = None  # made only when someone has to wait

    async def wait(self) -> None:
        """Until there is credit to send anything."""
        while self.available is not None and self.available <= 0:
            changed = self._changed = self._changed or anyio.Event()
            await changed.wait()

    def limit(self) -> int:
        """What may be read and sent now: at most one frame, at most the credit."""
        if self.available is None:
            return self.frame_limit
        return max(0, min(self.frame_limit, self.available))

    def spend(self, size: int) -> None:
        if self.available is not None:
            self.available -= size

    def grant(self, size: int) -> None:
        if self.available is not None:
            self.available += size
            if self._changed is not None:
                self._changed.set()
                self._changed = None


class _Reading:
    """Whether an output pump is waiting for output (not sending it) right now."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = False


class Session:
    """Drives one process for one channel until its `exit` frame is queued."""

    def __init__(
        self,
        channel: int,
        process: ProcessHandle,
        send_frame: SendFrame,
        make_exit_frame: Callable[[int, Exit], bytes],
        linger: float = DEFAULT_LINGER,
        window: int | None = None,
        max_frame: int = READ_SIZE,
    ) -> None:
        self.channel = channel
        self.process = process
        self.credit = Credit(window, max_frame)
        self._send_frame = send_frame
        self._make_exit_frame = make_exit_frame
        self._linger = linger
        self._stdin: collections.deque[bytes | Eof] = collections.deque()
        self._stdin_queued = 0
        self._stdin_space: anyio.Event | None = None  # made only when a feeder has to wait
        self._stdin_broken = False
        self._input_pump_running = False
        self._task_group: anyio.abc.TaskGroup | None = None
        self._readers: list[tuple[anyio.CancelScope, _Reading]] = []
        self._lingering_over = False
        self._open_outputs = 2 if process.stderr is not None else 1
        self._outputs_done = anyio.Event()
        self.bytes_in = 0
        self.bytes_out = 0

    # --- called by the connection ------------------------------------------

    async def feed_stdin(self, data: bytes) -> None:
        """Write stdin now if the process takes it, else queue it (waiting while too much is)."""
        self.bytes_in += len(data)
        if self._stdin_broken:
            return
        if not self._stdin and not self._input_pump_running:
            try:
                written = self.process.write_nowait(data)
            except anyio.BrokenResourceError:
                self._stdin_broken = True
                return
            if written == len(data):
                return
            data = data[written:]
        self._queue_input(data)
        while self._stdin_queued > STDIN_LIMIT and not self._stdin_broken:
            space = self._stdin_space = self._stdin_space or anyio.Event()
            await space.wait()

    def close_input(self) -> None:
        """The session is over: drop queued stdin and release any feeder waiting for room."""
        self._stdin_broken = True
        self._stdin.clear()
        self._stdin_queued = 0
        self._wake_feeders()

    async def feed_eof(self) -> None:
        """End-of-input, behind the stdin already queued."""
        self._queue_input(Eof())

    def control(self, message: Message) -> None:
        """Apply `resize`, `signal` or `window` at once: they do not wait behind stdin."""
        if isinstance(message, Resize):
            self.process.resize(message.rows, message.cols)
        elif isinstance(message, Signal):
            self.process.send_signal(signal.Signals["SIG" + message.name])
        elif isinstance(message, Window):
            self.credit.grant(message.bytes)

    # --- the adapter --------------------------------------------------------

    async def run(self) -> Exit:
        """Pump until the exit frame is queued; on cancellation, kill and reap, send nothing."""
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
                await self._send_frame(self.channel, self._make_exit_frame(self.channel, status))
                tg.cancel_scope.cancel()
            return status
        finally:
            self._task_group = None
            await self.process.aclose()

    async def _pump_output(self, source: OutputSource, kind: FrameKind) -> None:
        # Credit is checked and spent with no await in between (two pumps share it),
        # and no credit is held while waiting for output.
        reading = _Reading()
        try:
            with anyio.CancelScope() as scope:
                self._readers.append((scope, reading))
                while not self._lingering_over:
                    reading.now = True  # only a wait may be cut short by the linger
                    await self.credit.wait()
                    data = source.receive_nowait(self.credit.limit())
                    if not data:
                        if source.at_eof:
                            return
                        await source.wait_readable()
                        continue
                    reading.now = False
                    await self._send_output(kind, data)
            # The linger ran out: send what is buffered now, not what comes later.
            await self.credit.wait()
            data = source.receive_nowait(self.credit.limit())
            if data:
                await self._send_output(kind, data)
        finally:
            self._open_outputs -= 1
            if self._open_outputs == 0:
                self._outputs_done.set()

    async def _send_output(self, kind: FrameKind, data: bytes) -> None:
        self.bytes_out += len(data)
        self.credit.spend(len(data))
        await self._send_frame(self.channel, HEADER.pack(kind, self.channel, len(data)), data)

    # --- input that has to wait ---------------------------------------------

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
                    if self._stdin_queued <= STDIN_LIMIT:
                        self._wake_feeders()
        finally:
            self._input_pump_running = False
            self._wake_feeders()

    def _wake_feeders(self) -> None:
        if self._stdin_space is not None:
            self._stdin_space.set()
            self._stdin_space = None
