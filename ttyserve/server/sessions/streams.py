"""A session's output streams: a pump for each (stderr's made once it has output), how many
have not reached their end, and the end of them all: to end-of-file, or cut short once the
linger after the process's exit has run out (protocol section 4).

A part of the session (session.py), which stays the pumps' owner: where their output goes.
"""

from __future__ import annotations

import asyncio

import anyio

from ...backends.base import ProcessHandle
from ...protocol.frames import FrameKind
from ...transport.readiness import Watch
from .pump import OutputPump, PumpOwner


class SessionStreams:
    """The pumps of one session's process."""

    __slots__ = ("_linger", "_linger_timer", "_over", "_stderr", "_stderr_watch", "open",
                 "owner", "process", "pumps", "tasks")

    def __init__(self, owner: PumpOwner, process: ProcessHandle, linger: float) -> None:
        self.owner: PumpOwner | None = owner  # (let go at the end: it holds this part)
        self.process = process
        self._linger = linger
        self.pumps: list[OutputPump] = []
        self.tasks: list[OutputPump] = []  # pumps with no readiness callbacks
        self.open = 0  # streams not at their end yet
        self._stderr: OutputPump | None = None  # made once stderr has output (or its end)
        self._stderr_watch: Watch | None = None
        self._over: anyio.Event | None = None  # made when a task waits for the end
        self._linger_timer: asyncio.TimerHandle | None = None

    def start(self) -> list[OutputPump]:
        """Watch the streams; the pumps that need a task of their own (none where the loop
        calls back on readiness)."""
        process, tasks, owner = self.process, [], self.owner
        assert owner is not None, "started after it stopped"
        stdout = OutputPump(owner, process.stdout, FrameKind.STDOUT)
        self.pumps.append(stdout)
        self.open = 1
        watch = process.stdout.watch(stdout.readable)
        if watch is not None:
            stdout.watch(watch)
        else:
            tasks.append(stdout)
        if process.stderr is not None:
            self.open = 2
            self._stderr_watch = process.stderr.watch(self._stderr_readable)
            if self._stderr_watch is None:
                tasks.append(self._stderr_pump())
        self.tasks = tasks
        return tasks

    def resume(self) -> None:
        """The sink takes more, or changed: each pump goes on."""
        for pump in self.pumps:
            pump.resume()

    def ended_one(self) -> bool:
        """A stream reached its end (or was cut short); whether it was the last."""
        self.open -= 1
        if self.open:
            return False
        if self._over is not None:
            self._over.set()
        return True

    async def until_over(self) -> None:
        while self.open:
            self._over = anyio.Event()
            await self._over.wait()
        self._over = None

    async def linger(self) -> None:
        """The process was reaped: until every stream's end, or the linger's (a task's)."""
        if self.open:
            with anyio.move_on_after(self._linger):
                await self.until_over()
            self.linger_over()
            await self.until_over()

    def linger_soon(self) -> None:
        """The process was reaped: the loop cuts the streams short when the linger runs out."""
        if self.open:
            self._linger_timer = asyncio.get_running_loop().call_later(
                self._linger, self.linger_over)

    def linger_over(self) -> None:
        """The linger ran out: each stream sends what is buffered now, then stops."""
        if self.process.stderr is not None:
            self._stderr_pump()
        for pump in self.pumps:
            pump.last_chunk()

    def _stderr_pump(self) -> OutputPump:
        pump = self._stderr
        if pump is None:
            assert self.process.stderr is not None and self.owner is not None
            pump = self._stderr = OutputPump(self.owner, self.process.stderr, FrameKind.STDERR)
            if self._stderr_watch is not None:
                pump.watch(self._stderr_watch)
            self.pumps.append(pump)
        return pump

    def _stderr_readable(self) -> None:
        self._stderr_pump().readable()

    def stop(self) -> None:
        """No more reading, and what read is let go: the pumps, watches and timer hold the
        session (cycles that would keep an ended one until a collection)."""
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        for pump in self.pumps:
            pump.stop()
        if self._stderr_watch is not None:
            self._stderr_watch.close()
        self.pumps, self.tasks = [], []
        self._stderr_watch = self._stderr = self._linger_timer = self.owner = None
