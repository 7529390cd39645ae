"""The small interface between the session adapter and whatever runs processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..protocol.messages import Exit


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """What to run and how: the validated members of an `open`."""

    argv: list[str]
    pty: bool = True
    rows: int = 24
    cols: int = 80
    term: str = "xterm-256color"
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


class OutputSource(Protocol):
    """One output stream of a process (stdout, or stderr in pipe mode)."""

    @property
    def at_eof(self) -> bool:
        """Whether end-of-file was read."""
        ...

    async def wait_readable(self) -> None:
        """Until output (or end-of-file) can be read without waiting."""
        ...

    def receive_nowait(self, limit: int) -> bytes:
        """Up to ``limit`` bytes that can be read now; ``b""`` if none (see `at_eof`)."""
        ...


class ProcessHandle(Protocol):
    """A started process. The session adapter owns it and must call `aclose`."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> OutputSource: ...

    @property
    def stderr(self) -> OutputSource | None: ...

    @property
    def status(self) -> Exit | None:
        """How the process ended, once it was reaped."""
        ...

    def write_nowait(self, data: bytes) -> int:
        """Write what the process's input takes now; the number of bytes written.

        Raises anyio.BrokenResourceError when the input is closed for good.
        """
        ...

    async def send_stdin(self, data: bytes) -> None:
        """Write to the process's stdin or terminal; raises anyio.BrokenResourceError if gone."""
        ...

    async def send_eof(self) -> None:
        """Pipe: close stdin. PTY: type the terminal's end-of-file character."""
        ...

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's window size (PTY only; pipes ignore it)."""
        ...

    def send_signal(self, signum: int) -> None:
        """PTY: to the terminal's foreground process group; pipe: to the process group."""
        ...

    def hang_up(self) -> None:
        """SIGHUP (then SIGCONT) to the session's process group: a graceful shutdown's request."""
        ...

    async def wait(self) -> Exit:
        """Reap the process and return its status as the wire `exit` (never raises)."""
        ...

    async def aclose(self) -> None:
        """The cancel path when not reaped yet (SIGHUP to the group, SIGKILL after a grace,
        reap), then release every descriptor. Idempotent; never cancelled half-way."""
        ...


class Backend(Protocol):
    """Starts processes for sessions."""

    async def spawn(self, spec: ProcessSpec) -> ProcessHandle:
        """Start ``spec``; raises errors.SpawnError with an errno on failure."""
        ...
