"""The output pump of one stream of a session: read it as far as the session's sink can take it.

Where the event loop calls back on readiness (asyncio, a stream with a descriptor)
the pump has no task: the loop runs it when the process has written, it stops
watching when the sink can take nothing (no credit, a replay going on, a full
send queue) and the session resumes it when that changes. Elsewhere (trio, a
backend without descriptors) a small task runs the same steps and waits in
between. Either way `step` is the one place that reads, and it never reads more
than the sink takes: a slow client slows the process, never our memory.
"""

from __future__ import annotations

import enum
from typing import Protocol

import anyio
import anyio.lowlevel

from ...backends.base import OutputSource, PipeOutput
from ...protocol.frames import FrameKind
from ...transport.readiness import Watch

LAST_DRAIN = 2 << 20  # once the linger ran out, the most still read: what a full pipe (1 MiB,
# see backends/local.py) holds, with room to spare, however fast a background job writes


class Stall(enum.Enum):
    """Why a pump stopped reading."""

    READABLE = "readable"  # it waits for the process to write (or to close the stream)
    SINK = "sink"  # the sink can take nothing now: it waits to be resumed
    DONE = "done"  # end-of-file, or its last chunk after the linger went out


class PumpOwner(Protocol):
    """What a pump needs from its session."""

    def output_limit(self) -> int:
        """The bytes the sink takes now, one frame at most; 0 until it is resumed."""
        ...

    def deliver(self, kind: FrameKind, data: bytes) -> bool:
        """Hand ``data`` on (ring, observers, sink); whether the sink takes more now."""
        ...

    def splices(self) -> bool:
        """Whether output may go from its pipe to the sink unread (`deliver_from_pipe`)."""
        ...

    def deliver_from_pipe(self, kind: FrameKind, pipe: int, size: int) -> bool:
        """`deliver` of the next ``size`` bytes of ``pipe``, moved by the kernel."""
        ...

    def pump_done(self, pump: OutputPump) -> None:
        """The stream is at its end, or cut short: the pump reads nothing more."""
        ...

    def pump_failed(self, error: Exception) -> None:
        """Reading failed (not end-of-file): the session is to end as a fault."""
        ...


class OutputPump:
    """Reads one stream of a process into its session, in frames the sink can take."""

    __slots__ = (
        "_held",
        "_last",
        "_left",
        "_owner",
        "_pipe",
        "_pipe_fd",
        "_resumed",
        "_source",
        "_waiting",
        "_watch",
        "done",
        "kind",
    )

    def __init__(self, owner: PumpOwner, source: OutputSource, kind: FrameKind) -> None:
        self.kind = kind
        self.done = False
        self._owner = owner
        self._source = source
        pipe = source if isinstance(source, PipeOutput) and source.pipe is not None else None
        self._pipe = pipe  # its output may be spliced onward
        self._pipe_fd = -1 if pipe is None or pipe.pipe is None else pipe.pipe
        self._held = b""  # one byte read ahead while the sink took nothing (see `step`)
        self._last = False  # the linger ran out: what is buffered now, then done
        self._left = LAST_DRAIN  # what may still be read once it has
        self._watch: Watch | None = None
        self._resumed: anyio.Event | None = None  # made only when the pump's task must wait
        self._waiting: anyio.CancelScope | None = None  # the task's wait for output

    def step(self) -> Stall:
        """Read and deliver what may go now; why it stopped.

        Without room in the sink one byte is read ahead and held: that is how the pump
        learns of end-of-file, and lets the exit go, when the output ended exactly at the
        edge of the sink's credit. Each call delivers one chunk at most, so a flood gives
        the loop back after each (a keystroke of another session waits one chunk at most).
        """
        if self.done:
            return Stall.DONE
        source, owner = self._source, self._owner
        limit = owner.output_limit()
        if not limit:
            if not self._held:
                if self._pipe is not None and self._pipe.buffered(1):
                    return Stall.SINK  # no read ahead: those bytes may be in flight (outbox)
                self._held = source.receive_nowait(1)
                if not self._held:
                    return self._finished() if source.at_eof or self._last else Stall.READABLE
            return Stall.SINK
        if ((pipe := self._pipe) is not None and not self._held and owner.splices()
                and (size := pipe.buffered(limit))):  # 0: empty, or at its end (a read tells)
            return self._delivered(size, owner.deliver_from_pipe(self.kind, self._pipe_fd, size))
        held, self._held = self._held, b""
        data = held + source.receive_nowait(limit - len(held)) if held else (
            source.receive_nowait(limit))
        if not data:
            return self._finished() if source.at_eof or self._last else Stall.READABLE
        return self._delivered(len(data), owner.deliver(self.kind, data))

    def _delivered(self, size: int, room: bool) -> Stall:
        if self._last:
            self._left -= size
            if self._left <= 0:
                return self._finished()
        return Stall.READABLE if room else Stall.SINK

    def _finished(self) -> Stall:
        self.done = True
        if self._watch is not None:
            self._watch.stop()
        self._owner.pump_done(self)
        return Stall.DONE

    # --- driven by the loop's readiness callbacks ------------------------------------

    def watch(self, watch: Watch) -> None:
        """Be run by ``watch`` (a started watch of the stream) from now on."""
        self._watch = watch

    def readable(self) -> None:
        """The loop's callback: the stream has output (or its end)."""
        try:
            stall = self.step()
            while stall is Stall.READABLE and self._last:  # what is buffered: no wait for it
                stall = self.step()
        except Exception as exc:  # a fault: the session ends with it
            if self._watch is not None:
                self._watch.stop()
            self.done = True
            self._owner.pump_failed(exc)
            return
        if stall is Stall.SINK and self._watch is not None:
            self._watch.stop()

    def stop(self) -> None:
        """No more readiness callbacks, ever (the session is over: its streams are closed)."""
        self.done = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def resume(self) -> None:
        """The sink takes more now (credit, room, the replay ended, or it let go)."""
        if self.done:
            return
        if self._watch is not None:
            self._watch.start()
            if self._held or self._last:
                self.readable()  # nothing on the descriptor may say so: go on now
        elif self._resumed is not None:
            self._resumed.set()

    def last_chunk(self) -> None:
        """The linger ran out: send what is buffered now (as fast as the sink takes it: a
        slow client does not lose it), not wait for more, then stop."""
        if self.done:
            return
        self._last = True
        if self._waiting is not None:
            self._waiting.cancel()  # a wait for output ends: nothing more is waited for
        self.resume()

    # --- or by a task of its own, where there are no readiness callbacks -------------

    async def run(self) -> None:
        """Step, and wait in between, until done; raises what reading raises."""
        while (stall := self.step()) is not Stall.DONE:
            if stall is Stall.READABLE and self._last:
                await anyio.lowlevel.checkpoint()  # what is buffered is read with no wait
            elif stall is Stall.READABLE:
                with anyio.CancelScope() as self._waiting:
                    await self._source.wait_readable()
                self._waiting = None
                await anyio.lowlevel.checkpoint()  # a flood lets the others have a turn
            else:
                self._resumed = anyio.Event()
                await self._resumed.wait()
                self._resumed = None
