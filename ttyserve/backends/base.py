"""The small interface between the session adapter and whatever runs processes.

Bytes move on two paths. The descriptor fast path: `OutputSource.wait_readable`
then `receive_nowait`, and `ProcessHandle.write_nowait`, so a backend over
non-blocking descriptors hands over what the kernel holds with no buffer of its
own and no task per write. The stream-shaped path: `ProcessHandle.send_stdin`,
awaited until the input took everything. A backend with no descriptors (a
remote host, a test double) builds the fast path from streams with the helpers
at the end of this module: `StreamSource` reads a stream ahead into the
`receive_nowait` shape, and `StreamInput` takes nothing in `write_nowait`, so
all input goes through `send_stdin`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import anyio
import msgspec

from ..protocol.messages import DEFAULT_COLS, DEFAULT_ROWS, DEFAULT_TERM, Exit
from ..transport.readiness import Watch


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """What to run and how: the validated members of an `open`."""

    argv: list[str]
    pty: bool = True
    rows: int = DEFAULT_ROWS
    cols: int = DEFAULT_COLS
    term: str = DEFAULT_TERM
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    name: str | None = None  # the session's id: what its cgroup is called
    target: str | None = None  # section 15: the target it runs on (None: this host)
    detachable: bool = False  # it outlives its connection (a target's far side keeps it so)
    detached_timeout: float | None = None  # seconds it waits detached, for a target's resume


class ChildState(msgspec.Struct, kw_only=True):
    """A child handed to new code in this same process (an upgrade in place): our child
    still, unreaped unless ``status`` says how it ended; its descriptors survive the execve."""

    pid: int
    pty: bool
    output: int  # stdout, or the terminal's master
    stderr: int | None = None
    stdin: int | None = None  # pipes only (a terminal's input is its master)
    status: Exit | None = None
    cgroup: str | None = None


class OutputSource(Protocol):
    """One output stream of a process (stdout, or stderr in pipe mode)."""

    @property
    def at_eof(self) -> bool:
        """Whether end-of-file was read (and nothing read is left to hand out)."""
        ...

    async def wait_readable(self) -> None:
        """Until output (or end-of-file) can be read without waiting.

        Raises anyio.ClosedResourceError if the process was closed meanwhile.
        """
        ...

    def receive_nowait(self, limit: int) -> bytes:
        """Up to ``limit`` bytes that can be read now; ``b""`` if none (see `at_eof`).

        Raises OSError when reading fails for a reason other than end-of-file.
        """
        ...

    def watch(self, callback: Callable[[], None]) -> Watch | None:
        """Have the event loop run ``callback`` whenever output (or end-of-file) may be read,
        from now until the watch is stopped (readiness.py); None where it cannot: wait with
        `wait_readable` then."""
        ...


@runtime_checkable
class PipeOutput(Protocol):
    """An output stream read from a pipe, whose bytes may go on without being read (splice)."""

    @property
    def pipe(self) -> int | None:
        """The pipe's descriptor; None where the stream is no pipe (a terminal)."""
        ...

    def buffered(self, limit: int) -> int:
        """How many bytes the pipe holds now, ``limit`` at most."""
        ...


class ProcessHandle(Protocol):
    """A started process. The session adapter owns it and must call `aclose`."""

    @property
    def pid(self) -> int:
        """The process id, for `opened` and the journal (a backend without OS processes
        uses ids no process can have)."""
        ...

    @property
    def stdout(self) -> OutputSource:
        """Standard output; under a PTY the terminal, which carries stderr too."""
        ...

    @property
    def stderr(self) -> OutputSource | None:
        """Standard error in pipe mode; None under a PTY."""
        ...

    @property
    def status(self) -> Exit | None:
        """How the process ended, once it was reaped."""
        ...

    def write_nowait(self, data: bytes) -> int:
        """Fast path: write what the process's input takes now; the number of bytes written.

        May be 0 with room later (a backend without descriptors always returns 0:
        the caller then awaits `send_stdin` with the rest). Raises
        anyio.BrokenResourceError when the input is closed for good.
        """
        ...

    async def send_stdin(self, data: bytes) -> None:
        """Write all of ``data`` to stdin or the terminal, waiting for room.

        Raises anyio.BrokenResourceError when the input is closed for good.
        """
        ...

    async def send_eof(self) -> None:
        """Pipe: close stdin. PTY: type the terminal's end-of-file character.

        Raises anyio.BrokenResourceError when the terminal's input is gone.
        """
        ...

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's window size (PTY only; pipes ignore it). Raises nothing
        before `aclose`."""
        ...

    def terminal_flags(self) -> tuple[bool, bool] | None:
        """A PTY's ECHO and ICANON flags now, as the program set them (section 14); None for
        pipes, or once they cannot be read. Raises nothing."""
        ...

    def send_signal(self, signum: int) -> None:
        """PTY: to the terminal's foreground process group; pipe: to the process group.

        A process or group that is gone is not an error: raises nothing.
        """
        ...

    def hang_up(self) -> bool:
        """SIGHUP (then SIGCONT) to the session's process group: a graceful shutdown's
        request. False when the process had already exited by itself (what is left of its
        group is hung up all the same). Raises nothing."""
        ...

    def kill(self) -> None:
        """SIGKILL to the session's whole tree: its cgroup where it has one (what left the
        group too), else its process group; what a hang-up did not end is ended (a graceful
        shutdown, after the kill grace). The session ends as its process does. Raises
        nothing."""
        ...

    @property
    def cgroup_path(self) -> str | None:
        """The directory of the cgroup its tree runs in; None where the backend does not
        contain trees."""
        ...

    @property
    def leftovers(self) -> int | None:
        """Processes of its tree killed after it ended (`settle`); None where the backend
        does not contain trees (no cgroup)."""
        ...

    @property
    def oom(self) -> bool | None:
        """Whether its cgroup's memory limit killed a process of its tree; None where the
        backend does not contain trees (no cgroup)."""
        ...

    def settle_nowait(self, kill: bool) -> bool:
        """The process ended by itself and its output is over: what is left of its tree is
        killed (``kill``) or left running. True when that is done now; False: await
        `settle`. Raises nothing."""
        ...

    async def settle(self, kill: bool = True) -> None:
        """`settle_nowait`, waiting until what was killed is gone. Raises nothing."""
        ...

    def handover(self, dry: bool = False) -> ChildState:
        """What new code in this same process needs to go on with the process (an upgrade in
        place): from now on its descriptors are that code's (``dry``: only what that would
        be). Raises NotImplementedError where the backend cannot hand it over."""
        ...

    def watch_exit(self, reaped: Callable[[Exit], None]) -> Watch | None:
        """Have the event loop reap the process the moment it exits and call ``reaped`` with
        its status, from now until the watch is stopped; None where it cannot (then await
        `wait`)."""
        ...

    async def wait(self) -> Exit:
        """Reap the process and return its status as the wire `exit`.

        Never raises (but cancellation): a status that cannot be learned is
        `Exit(code=-1, error=...)`.
        """
        ...

    async def aclose(self) -> None:
        """The cancel path when not reaped yet (SIGHUP to the group, SIGKILL after a grace,
        reap), then release every descriptor or stream. Idempotent, never cancelled
        half-way; raises nothing."""
        ...

    def release(self) -> None:
        """`aclose` of a process that was reaped already: nothing to wait for (a session
        ended from a readiness callback). Idempotent."""
        ...


class Backend(Protocol):
    """Starts processes for sessions."""

    async def spawn(self, spec: ProcessSpec) -> ProcessHandle:
        """Start ``spec``; raises errors.SpawnError with an errno on failure."""
        ...


@runtime_checkable
class SpawnsAtOnce(Protocol):
    """A backend whose spawn waits for nothing (posix_spawn returns once the child runs): an
    `open` can then be answered from where nothing can wait (a readiness callback)."""

    def spawn_nowait(self, spec: ProcessSpec) -> ProcessHandle:
        """`spawn`, at once."""
        ...


# --- helpers for backends without descriptors -------------------------------


class ByteReceiver(Protocol):
    """What `StreamSource` reads: anyio byte streams, memory object streams of bytes."""

    async def receive(self) -> bytes:
        """The next bytes; raises anyio.EndOfStream at the end."""
        ...


class ByteSender(Protocol):
    """What `StreamInput` writes to: anyio byte streams, memory object streams of bytes."""

    async def send(self, item: bytes, /) -> None:
        """Raises anyio.BrokenResourceError (or ClosedResourceError) when it cannot take more."""
        ...

    async def aclose(self) -> None:
        """Close the sending side: the reader sees end-of-file."""
        ...


_END = (anyio.EndOfStream, anyio.BrokenResourceError)


class StreamSource:
    """An `OutputSource` over a stream: `wait_readable` receives one chunk ahead.

    anyio.EndOfStream ends the output, and so does anyio.BrokenResourceError (a
    transport gone: the process's status tells what happened). A stream with
    `receive_nowait` (memory object streams) is also drained without waiting,
    so what it holds is handed out when the session's linger runs out.
    """

    def __init__(self, stream: ByteReceiver) -> None:
        self._stream = stream
        self._nowait = getattr(stream, "receive_nowait", None)
        self._pending = b""  # received ahead, not handed out yet
        self._eof = False

    @property
    def at_eof(self) -> bool:
        return self._eof and not self._pending

    async def wait_readable(self) -> None:
        """Raises anyio.ClosedResourceError if the stream was closed on this side."""
        while not self._pending and not self._eof:
            try:
                self._pending = await self._stream.receive()
            except _END:
                self._eof = True

    def receive_nowait(self, limit: int) -> bytes:
        """Raises anyio.ClosedResourceError if the stream was closed on this side."""
        chunks = [self._pending] if self._pending else []
        size = len(self._pending)
        while size < limit and not self._eof and self._nowait is not None:
            try:
                chunk: bytes = self._nowait()
            except anyio.WouldBlock:
                break
            except _END:
                self._eof = True
                break
            chunks.append(chunk)
            size += len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._pending = data[limit:]
        return data[:limit]

    def watch(self, callback: Callable[[], None]) -> Watch | None:
        return None  # a stream has no descriptor to watch


class Uncontained:
    """The containment and hand-over members of a `ProcessHandle` whose backend has no
    cgroups and cannot hand its processes to new code (a remote host, a test double)."""

    def terminal_flags(self) -> tuple[bool, bool] | None:
        return None  # (a process whose terminal cannot be read here)

    cgroup_path: str | None = None
    leftovers: int | None = None
    oom: bool | None = None

    def settle_nowait(self, kill: bool) -> bool:
        return True

    async def settle(self, kill: bool = True) -> None:
        return None

    def handover(self, dry: bool = False) -> ChildState:
        raise NotImplementedError("this process cannot be handed over")


class StreamInput:
    """The input side of a process over a stream: the awaited path only.

    `write_nowait` takes nothing (it returns 0), so every write goes through
    `send_stdin`; `send_eof` closes the stream (the reader sees end-of-file).
    Every failure to write is anyio.BrokenResourceError, as the interface says.
    """

    def __init__(self, stream: ByteSender) -> None:
        self._stream: ByteSender | None = stream

    def write_nowait(self, data: bytes) -> int:
        """0, or anyio.BrokenResourceError once the input is closed."""
        if self._stream is None:
            raise anyio.BrokenResourceError("stdin is closed")
        return 0

    async def send_stdin(self, data: bytes) -> None:
        """Raises anyio.BrokenResourceError when the input is closed or its reader gone."""
        if self._stream is None:
            raise anyio.BrokenResourceError("stdin is closed")
        try:
            await self._stream.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise anyio.BrokenResourceError("stdin is closed") from exc

    async def send_eof(self) -> None:
        """Close the stream (idempotent)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.aclose()
