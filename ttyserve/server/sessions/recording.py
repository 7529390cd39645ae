"""Recordings: a PTY session's terminal as an asciicast v3 file (`serve --record DIR`).

A `Recording` observes one session. Events are encoded as they happen and
buffered; its flusher task writes them at most FLUSH_DELAY later, in a worker
thread (a slow disk must not stall the event loop), without fsync: a crash
leaves whole lines, then at most one cut line. A file that cannot be written
is logged once and the session goes on unrecorded.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import shlex
import time

import anyio
import anyio.abc
import anyio.to_thread

from ...backends.base import ProcessSpec
from ...lines import write_all
from ...protocol.frames import FrameKind
from ...protocol.messages import Exit
from ..handover import RecordingState
from .session import ServerSession

log = logging.getLogger("ttyserve")

FLUSH_DELAY = 0.5  # seconds an event may wait in memory (the contract allows one)
FLUSH_SIZE = 1 << 20  # pending bytes written at once, without waiting for the delay
MAX_PENDING = 64 << 20  # pending bytes of a disk that does not keep up: recording stops
FILE_MODE = 0o600  # a recording holds everything the session printed
DIR_MODE = 0o700


def header(spec: ProcessSpec) -> bytes:
    """The asciicast v3 header line: the terminal at spawn, the start, the command."""
    return json.dumps({
        "version": 3,
        "term": {"cols": spec.cols, "rows": spec.rows, "type": spec.term},
        "timestamp": int(time.time()),
        "command": shlex.join(spec.argv),
    }).encode() + b"\n"


def start_recording(session: ServerSession, directory: str, with_input: bool,
                    task_group: anyio.abc.TaskGroup) -> None:
    """Record a PTY session to DIRECTORY/ID.cast (pipe sessions are not recorded).

    Synchronous, so the registry can call it between spawn and start, where an await could
    be cancelled and leave the process with no owner: a mkdir, an open and one small write.
    """
    if not session.spec.pty:
        return
    path = os.path.join(directory, f"{session.id}.cast")
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)  # the last component only: a typo makes no tree
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        try:
            write_all(fd, header(session.spec))
        except OSError:
            os.close(fd)
            raise
    except OSError as exc:
        log.error("recording %s: %s; the session goes on unrecorded", path, exc)
        return
    recording = Recording(fd, path, with_input)
    session.taps.append(recording)
    if with_input:  # (input read unseen is never recorded: section 14)
        session.watch_terminal()
    task_group.start_soon(recording.run)


async def finish_recording(session: ServerSession) -> None:
    """The session is over: its exit event (if none was seen), the rest written, the file
    closed. Never raises."""
    for tap in session.taps:
        if isinstance(tap, Recording):
            await tap.aclose(session.process.status)


HIDDEN_MARKER = "input hidden"  # the marker of a run of input read unseen (section 14)


class Recording:
    """One asciicast v3 event stream, written to ``fd`` (the header is already there)."""

    def __init__(self, fd: int, path: str, with_input: bool) -> None:
        self.with_input = with_input
        self.path = path
        self._fd: int | None = fd
        utf8 = codecs.getincrementaldecoder("utf-8")
        self._output = utf8(errors="replace")  # a character split between reads comes whole
        self._input = utf8(errors="replace") if with_input else None
        self._start = time.monotonic()
        self._last_ms = 0  # the time of the last event, in ms since the start
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._wake = anyio.Event()  # something is pending, or enough to write at once
        self._lock = anyio.Lock()  # one write at a time, in the order taken
        self._flusher = anyio.CancelScope()
        self._ended = False  # after the exit event, or once the file failed: no more events
        self._failed = False
        self._hidden_run: int | None = None  # the run of unseen input last marked

    # --- the session's tap ---------------------------------------------

    def output(self, kind: FrameKind, data: bytes) -> None:
        if text := self._output.decode(data):
            self._event("o", text)

    def typed(self, data: bytes, hidden_run: int | None) -> None:
        """Input (with --record-input): what is read unseen never, one marker a run in its
        place (section 14)."""
        if self._input is None:
            return
        if hidden_run is not None:
            if hidden_run != self._hidden_run:
                self._hidden_run = hidden_run
                self._event("m", HIDDEN_MARKER)
            return
        if text := self._input.decode(data):
            self._event("i", text)

    def resized(self, rows: int, cols: int) -> None:
        self._event("r", f"{cols}x{rows}")

    def exited(self, status: Exit) -> None:
        if tail := self._output.decode(b"", final=True):
            self._event("o", tail)
        self._event("x", str(status.code))  # the wire code: -S for a death by signal S
        self._ended = True

    # --- the file -----------------------------------------------------------

    async def run(self) -> None:
        """Write what is pending at most FLUSH_DELAY after it came, until `aclose`."""
        with self._flusher:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                if self._pending_size < FLUSH_SIZE:
                    with anyio.move_on_after(FLUSH_DELAY):
                        await self._wake.wait()  # set again once FLUSH_SIZE is pending
                    self._wake = anyio.Event()
                await self._flush()

    async def aclose(self, status: Exit | None) -> None:
        """End the stream (with ``status`` as its exit, if it has none yet), write the rest
        and close the file, shielded from cancellation. Never raises."""
        if status is not None and not self._ended:
            self.exited(status)
        self._ended = True
        self._flusher.cancel()
        with anyio.CancelScope(shield=True):
            await self._flush()
            async with self._lock:
                if self._fd is not None:
                    with contextlib.suppress(OSError):  # nothing is left to lose
                        os.close(self._fd)
                    self._fd = None

    @property
    def writing(self) -> bool:
        """A write is under way (in a worker thread)."""
        return self._lock.locked()

    async def flushed(self) -> None:
        """Until what is pending is written (an upgrade hands over the file only then)."""
        await self._flush()

    def handover(self, dry: bool = False) -> RecordingState | None:
        """What new code in this process needs to go on writing (best after `flushed`), None
        when the file failed; the file is its from now on (``dry``:
        only what that would be)."""
        fd = self._fd
        if fd is None:
            return None
        if not dry:
            if self._pending:  # events since `flushed`: a few, written here and now
                with contextlib.suppress(OSError):
                    write_all(fd, b"".join(self._pending))
                self._pending.clear()
            self._fd = None
            self._ended = True
            self._flusher.cancel()
            os.set_inheritable(fd, True)
        return RecordingState(fd=fd, path=self.path, with_input=self.with_input,
                              start=self._start, last_ms=self._last_ms)

    @classmethod
    def adopted(cls, state: RecordingState) -> Recording:
        """The recording `handover` described, going on in this code."""
        recording = cls(state.fd, state.path, state.with_input)
        recording._start, recording._last_ms = state.start, state.last_ms
        os.set_inheritable(state.fd, False)
        return recording

    def _event(self, code: str, data: str) -> None:
        if self._ended:
            return
        # Intervals in ms, as the asciinema CLI writes them; each is the difference of
        # rounded times since the start, so rounding errors do not add up (the spec's advice).
        now_ms = round((time.monotonic() - self._start) * 1000)
        seconds, ms = divmod(now_ms - self._last_ms, 1000)
        self._last_ms = now_ms
        # ASCII-only JSON: every non-printable code point escaped, as the spec asks (DEL too).
        text = json.dumps(data).replace("\x7f", "\\u007f")
        line = f'[{seconds}.{ms:03d}, "{code}", {text}]\n'.encode()
        self._pending.append(line)
        self._pending_size += len(line)
        if self._pending_size > MAX_PENDING:
            self._fail("the disk does not keep up")
        elif len(self._pending) == 1 or self._pending_size >= FLUSH_SIZE:
            self._wake.set()

    async def _flush(self) -> None:
        async with self._lock:
            if not self._pending or self._fd is None:
                return
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_size = 0
            try:
                await anyio.to_thread.run_sync(write_all, self._fd, data)
            except OSError as exc:
                self._fail(str(exc))

    def _fail(self, reason: str) -> None:
        """Log once and record nothing more (the file is closed by `aclose`)."""
        if not self._failed:
            log.error("recording %s: %s; the session goes on unrecorded", self.path, reason)
        self._failed = self._ended = True
        self._pending.clear()
        self._pending_size = 0

