"""The session adapter: one process, one channel, three pumps, the exit frame last.

Per session one task group runs: the output pumps (stdout and, in pipe mode,
stderr -> client), the input pump (client -> stdin), and the exit watcher.
Only the exit watcher writes the `exit` frame, and only after the process is
reaped and its output has reached end-of-file or the linger grace has run out.
Cancelling the session's scope is the cancel path: the process group is hung
up, killed after a grace, reaped, and nothing more is sent.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .backends.base import OutputSource, ProcessHandle
from .protocol.frames import FrameKind, encode_frame
from .protocol.messages import Eof, Exit, Message, Resize, Signal, Window

DEFAULT_LINGER = 2.0  # seconds of output drain after exit (the contract's default grace)
INBOX_SIZE = 16  # stdin frames queued per session before the connection reader waits

READ_SIZE = 256 * 1024  # the most one frame carries: one wake-up's worth of output

SendFrame = Callable[[int, bytes], Awaitable[None]]
InboxItem = bytes | Message


class Credit:
    """Output credit of one channel (protocol section 7); None when the client set no window."""

    def __init__(self, initial: int | None) -> None:
        self.available = initial
        self._changed = anyio.Event()

    async def wait(self) -> int:
        """How many bytes may be read and sent now, once there is any credit."""
        while self.available is not None and self.available <= 0:
            await self._changed.wait()
        return READ_SIZE if self.available is None else min(READ_SIZE, self.available)

    def spend(self, size: int) -> None:
        if self.available is not None:
            self.available -= size

    def grant(self, size: int) -> None:
        if self.available is not None:
            self.available += size
            self._changed.set()
            self._changed = anyio.Event()


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
    ) -> None:
        self.channel = channel
        self.credit = Credit(window)
        self.process = process
        self._send_frame = send_frame
        self._make_exit_frame = make_exit_frame
        self._linger = linger
        self._inbox_send: MemoryObjectSendStream[InboxItem]
        self._inbox_receive: MemoryObjectReceiveStream[InboxItem]
        self._inbox_send, self._inbox_receive = anyio.create_memory_object_stream[InboxItem](
            INBOX_SIZE
        )
        self._read_scopes: set[anyio.CancelScope] = set()
        self._lingering_over = False
        self._open_outputs = 2 if process.stderr is not None else 1
        self._outputs_done = anyio.Event()
        self.status: Exit | None = None
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def process_status(self) -> Exit | None:
        """How the process ended, even when the session was cancelled (None if unknown)."""
        return self.status or self.process.status

    # --- called by the connection ------------------------------------------

    async def feed_stdin(self, data: bytes) -> None:
        """Queue stdin bytes; waits while the inbox is full (backpressure)."""
        self.bytes_in += len(data)
        await self._inbox_send.send(data)

    async def feed_eof(self) -> None:
        """Queue end-of-input behind the stdin already queued."""
        await self._inbox_send.send(Eof())

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
                tg.start_soon(self._pump_input)
                async with anyio.create_task_group() as outputs:
                    outputs.start_soon(self._pump_output, self.process.stdout, FrameKind.STDOUT)
                    if self.process.stderr is not None:
                        outputs.start_soon(
                            self._pump_output, self.process.stderr, FrameKind.STDERR
                        )
                    outputs.start_soon(self._watch_exit)
                status = self.status
                assert status is not None
                await self._send_frame(self.channel, self._make_exit_frame(self.channel, status))
                tg.cancel_scope.cancel()
            assert status is not None
            return status
        finally:
            await self.process.aclose()

    async def _watch_exit(self) -> None:
        self.status = await self.process.wait()
        with anyio.move_on_after(self._linger):
            await self._outputs_done.wait()
        self._lingering_over = True
        for scope in self._read_scopes:
            scope.cancel()

    async def _pump_output(self, source: OutputSource, kind: FrameKind) -> None:
        try:
            while not self._lingering_over:
                with anyio.CancelScope() as scope:
                    self._read_scopes.add(scope)
                    data = await source.receive(await self.credit.wait())
                self._read_scopes.discard(scope)
                if scope.cancelled_caught:
                    break
                if not data:
                    return
                await self._send_output(kind, data)
            # The linger ran out: send what is buffered now, not what comes later.
            data = source.receive_nowait(await self.credit.wait())
            if data:
                await self._send_output(kind, data)
        finally:
            self._open_outputs -= 1
            if self._open_outputs == 0:
                self._outputs_done.set()

    async def _send_output(self, kind: FrameKind, data: bytes) -> None:
        self.bytes_out += len(data)
        self.credit.spend(len(data))
        await self._send_frame(self.channel, encode_frame(kind, self.channel, data))

    async def _pump_input(self) -> None:
        broken = False
        async with self._inbox_receive:
            async for item in self._inbox_receive:
                if broken:
                    continue  # the process closed its input: drop the rest, keep draining
                try:
                    if isinstance(item, bytes):
                        await self.process.send_stdin(item)
                    elif isinstance(item, Eof):
                        await self.process.send_eof()
                except anyio.BrokenResourceError:
                    broken = True
