"""What an upgrade in place hands to the new code (section 12): a versioned state, and the
descriptors it names, inherited across execve.

The state is msgpack in a memfd whose descriptor the new process finds in
HANDOVER_ENV. It names every descriptor that survives the execve (listening sockets, the
leases, the journal, each kept session's terminal or pipes and recording) and everything
else a kept session is: its ring and offsets, terminal modes, owner, timers, status and
cgroup. A new version reads the versions in READABLE; the dry run reads the very state
the old one would hand over, so one it cannot read refuses the upgrade before anything
changes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import anyio
import msgspec

from ..backends.base import ChildState, Uncontained
from ..protocol.messages import Exit
from ..transport.readiness import Watch

HANDOVER_VERSION = 2  # what this code writes (2: with the open grants of section 11)
READABLE = frozenset({1, 2})  # what this code reads
HANDOVER_ENV = "TTYSERVE_HANDOVER"  # the descriptor of the state, in the new process
CHECK_ENV = "TTYSERVE_UPGRADE_CHECK"  # the same, for the dry run: check, then exit
MEMFD_NAME = "ttyserve-handover"


class RingState(msgspec.Struct, kw_only=True):
    size: int
    dropped: int
    start: tuple[int, int]  # stdout, stderr: the offset of the oldest byte held
    end: tuple[int, int]  # ...and of the next byte produced
    chunks: list[tuple[int, bytes]]  # (frame kind, data), in production order


class ModesState(msgspec.Struct, kw_only=True):
    modes: dict[int, bool]
    keypad: bool
    title: bytes | None


class RecordingState(msgspec.Struct, kw_only=True):
    fd: int
    path: str
    with_input: bool
    start: float  # time.monotonic() of its first event (the clock survives the execve)
    last_ms: int


class SessionState(msgspec.Struct, kw_only=True):
    """A detachable session, detached (every connection closed before the hand-over)."""

    id: str
    pid: int
    owner: str
    peer: str
    started: str
    argv: list[str]
    pty: bool
    target: str | None = None  # section 15: the target it ran on (ended: none runs there)
    rows: int
    cols: int
    term: str
    env: dict[str, str]
    cwd: str | None
    detached_at: float | None  # time.monotonic()
    detached_timeout: float
    final: Exit | None
    delivered_at: float | None
    recorded: bool
    bytes_in: int
    bytes_out: int
    tree_settled: bool
    ring: RingState
    modes: ModesState | None
    process: ChildState | None  # None: over, its descriptors released (its exit waits)
    recording: RecordingState | None
    key: str | None = None  # its `open`'s idempotency_key (section 13)


class GrantState(msgspec.Struct, kw_only=True):
    """An open grant (section 11): its hash, never the grant itself."""

    id: str
    digest: bytes
    session: str
    role: str
    owner: str
    expires: float  # time.time()


class ListenerState(msgspec.Struct, kw_only=True):
    requested: str  # as configured
    address: str  # as bound (the real port)
    fd: int
    activated: bool = False  # handed to the server by its service manager: kept whatever
    # the configuration says


class LeaseState(msgspec.Struct, kw_only=True):
    socket_path: str
    fd: int


class ContainmentState(msgspec.Struct, kw_only=True):
    root: str
    home: str
    memory_max: int | None
    pids_max: int | None
    cpu_max: float | None
    left: list[str]


class HandoverState(msgspec.Struct, kw_only=True):
    version: int
    from_version: str
    listeners: list[ListenerState]
    leases: list[LeaseState]
    journal_fd: int | None
    journal_path: str | None
    token: str | None  # a web token the old server made itself (pages hold it)
    blocked: list[int]  # the signal mask before the hand-over blocked what it holds
    containment: ContainmentState | None
    sessions: list[SessionState]
    grants: list[GrantState] = []  # version 2; a version 1 state has none

    def descriptors(self) -> list[int]:
        """Every descriptor the state names: what must survive the execve."""
        fds = [lst.fd for lst in self.listeners] + [lease.fd for lease in self.leases]
        if self.journal_fd is not None:
            fds.append(self.journal_fd)
        for session in self.sessions:
            if (process := session.process) is not None:
                fds += [fd for fd in (process.output, process.stderr, process.stdin)
                        if fd is not None]
            if session.recording is not None:
                fds.append(session.recording.fd)
        return fds


class _Version(msgspec.Struct):
    version: int


class UnreadableState(ValueError):
    """A state this code cannot read: the dry run refuses the upgrade."""


def encode(state: HandoverState) -> bytes:
    return msgspec.msgpack.encode(state)


def decode(data: bytes) -> HandoverState:
    """The state; UnreadableState when its version or its shape is not what this reads."""
    try:
        version = msgspec.msgpack.decode(data, type=_Version).version
    except msgspec.DecodeError as exc:
        raise UnreadableState(f"the hand-over state does not parse: {exc}") from None
    if version not in READABLE:
        raise UnreadableState(f"the hand-over state is version {version}; this version "
                              f"reads {', '.join(map(str, sorted(READABLE)))}")
    try:
        return msgspec.msgpack.decode(data, type=HandoverState)
    except msgspec.DecodeError as exc:
        raise UnreadableState(f"the hand-over state of version {version}: {exc}") from None


def write(data: bytes) -> int:
    """``data`` in an anonymous file, rewound (its descriptor closed at exec: whoever hands
    it on says so)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(MEMFD_NAME)
    else:
        fd, path = tempfile.mkstemp(prefix="ttyserve-handover-")
        os.unlink(path)
    written = 0
    while written < len(data):
        written += os.write(fd, data[written:])
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read(fd: int) -> bytes:
    """What `write` wrote at ``fd``; the descriptor is closed."""
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def take(variable: str = HANDOVER_ENV) -> HandoverState | None:
    """The state handed to this process, if it was started by an upgrade (the variable is
    removed, so sessions never see it). Raises UnreadableState."""
    value = os.environ.pop(variable, None)
    if value is None:
        return None
    return decode(read(int(value)))



class _Over:
    """The output of a process that is over: at its end."""

    at_eof = True

    async def wait_readable(self) -> None:
        return None

    def receive_nowait(self, limit: int) -> bytes:
        return b""

    def watch(self, callback: Callable[[], None]) -> Watch | None:
        return None


class ExitedProcess(Uncontained):
    """The process of a session handed over once it was over (its exit waits for a client):
    reaped, its descriptors closed; every request is a no-op."""

    stderr = None

    def __init__(self, pid: int, status: Exit) -> None:
        self.pid = pid
        self.status = status
        self.stdout = _Over()

    def write_nowait(self, data: bytes) -> int:
        raise anyio.BrokenResourceError("the process is over")

    async def send_stdin(self, data: bytes) -> None:
        raise anyio.BrokenResourceError("the process is over")

    async def send_eof(self) -> None:
        raise anyio.BrokenResourceError("the process is over")

    def resize(self, rows: int, cols: int) -> None:
        return None

    def send_signal(self, signum: int) -> None:
        return None

    def hang_up(self) -> bool:
        return False

    def kill(self) -> None:
        return None

    def watch_exit(self, reaped: Callable[[Exit], None]) -> Watch | None:
        return None

    async def wait(self) -> Exit:
        return self.status

    async def aclose(self) -> None:
        return None

    def release(self) -> None:
        return None
