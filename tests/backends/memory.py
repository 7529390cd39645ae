"""An in-memory Backend: each "process" is a small async Python program chosen by argv[0].

No OS process and no descriptor: the handle is built only on the stream-shaped
helpers of ttyserve.backends.base (`StreamSource` over memory object streams,
`StreamInput`), so the conformance suite shows that a backend without
descriptors can serve. It is also a seam for fault injection: a program can
lose its status, die by a signal, ignore its input or sleep until signalled,
and `open_memory_backend(programs=...)` takes programs of a test's own.

A PTY here has no line discipline: no echo, no CR before LF, and end-of-input
closes the program's stdin as in pipe mode; stderr shares the terminal.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ttyserve.backends.base import ProcessSpec, StreamInput, StreamSource, Uncontained
from ttyserve.defaults import KILL_GRACE
from ttyserve.errors import SpawnError
from ttyserve.exitcodes import exit_from_wait_error, exit_from_wait_status
from ttyserve.protocol.messages import Exit
from ttyserve.transport.readiness import Watch

# Pids above Linux's PID_MAX_LIMIT (2**22): no real process or group has one, so
# nothing that records them (the journal) can ever signal a real process by mistake.
_PIDS = itertools.count((1 << 22) + 1)
_BUFFER = 16  # chunks a stream holds before its writer waits, as a full pipe blocks
_IGNORED_BY_DEFAULT = frozenset({signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH})


def exited(code: int) -> Exit:
    """The status of a normal exit with ``code``, through the one exit table."""
    return exit_from_wait_status((code & 0xFF) << 8)


def killed(signum: int) -> Exit:
    """The status of a death by ``signum`` with no core dump, through the one exit table."""
    return exit_from_wait_status(signum)


class ProgramIO:
    """What a program sees: argv, env, cwd, its terminal, stdio as memory streams."""

    def __init__(self, spec: ProcessSpec, env: dict[str, str], cwd: str,
                 stdin: MemoryObjectReceiveStream[bytes], stdout: MemoryObjectSendStream[bytes],
                 stderr: MemoryObjectSendStream[bytes]) -> None:
        self.argv = list(spec.argv)
        self.env = env
        self.cwd = cwd
        self.pty = spec.pty
        self.rows, self.cols = spec.rows, spec.cols
        self.ignored: set[int] = set()  # signals the program ignores
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._resized = anyio.Event()

    async def read(self) -> bytes:
        """The next input; b"" at its end."""
        try:
            return await self._stdin.receive()
        except anyio.EndOfStream:
            return b""

    async def write(self, data: bytes | str) -> None:
        """To stdout; anyio.BrokenResourceError once nobody reads (the program dies of SIGPIPE)."""
        await self._stdout.send(data.encode() if isinstance(data, str) else data)

    async def write_err(self, data: bytes | str) -> None:
        """To stderr, which is the terminal under a PTY."""
        await self._stderr.send(data.encode() if isinstance(data, str) else data)

    async def next_resize(self) -> tuple[int, int]:
        """The terminal's size after its next resize (never comes in pipe mode)."""
        await self._resized.wait()
        return self.rows, self.cols

    def resized(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self._resized.set()
        self._resized = anyio.Event()

    def close(self) -> None:
        """What exit does to stdio: readers see end-of-file, writers a broken pipe."""
        self._stdout.close()
        self._stderr.close()
        self._stdin.close()


Program = Callable[[ProgramIO], Awaitable["int | Exit"]]


class MemoryProcess(Uncontained):
    """One running program; a `ProcessHandle` with no OS process under it."""

    def __init__(self, spec: ProcessSpec, env: dict[str, str], cwd: str, grace: float) -> None:
        self.pid = next(_PIDS)
        stdin_send, stdin_receive = anyio.create_memory_object_stream[bytes](_BUFFER)
        out_send, out_receive = anyio.create_memory_object_stream[bytes](_BUFFER)
        if spec.pty:
            err_send, err_receive = out_send.clone(), None  # one terminal for both
        else:
            err_send, err_receive = anyio.create_memory_object_stream[bytes](_BUFFER)
        self._receivers = [r for r in (out_receive, err_receive) if r is not None]
        self.stdout = StreamSource(out_receive)
        self.stderr = StreamSource(err_receive) if err_receive is not None else None
        self.io = ProgramIO(spec, env, cwd, stdin_receive, out_send, err_send)
        self._input = StreamInput(stdin_send)
        self._grace = grace
        self._status: Exit | None = None
        self._ended = anyio.Event()
        self._scope = anyio.CancelScope()
        self._closed = False

    async def run(self, program: Program) -> None:
        """The program's life: started by the backend in its task group."""
        try:
            with self._scope:
                result = await program(self.io)
                self._end(result if isinstance(result, Exit) else exited(result))
        except anyio.BrokenResourceError:
            self._end(killed(signal.SIGPIPE))  # wrote to output nobody reads
        finally:
            self._end(killed(signal.SIGKILL))  # cancelled with its backend
            self.io.close()

    def _end(self, status: Exit) -> None:
        if self._status is None:
            self._status = status
            self._ended.set()

    def _kill(self, signum: int) -> None:
        self._end(killed(signum))
        self._scope.cancel()

    @property
    def status(self) -> Exit | None:
        return self._status

    def write_nowait(self, data: bytes) -> int:
        return self._input.write_nowait(data)

    async def send_stdin(self, data: bytes) -> None:
        await self._input.send_stdin(data)

    async def send_eof(self) -> None:
        await self._input.send_eof()

    def resize(self, rows: int, cols: int) -> None:
        if self.io.pty:
            self.io.resized(rows, cols)

    def send_signal(self, signum: int) -> None:
        if self._status is None and signum not in self.io.ignored | _IGNORED_BY_DEFAULT:
            self._kill(signum)

    def hang_up(self) -> bool:
        running = self._status is None
        self.send_signal(signal.SIGHUP)
        self.send_signal(signal.SIGCONT)
        return running

    def kill(self) -> None:
        if self._status is None:  # (no process ignores it)
            self._kill(signal.SIGKILL)

    def watch_exit(self, reaped: Callable[[Exit], None]) -> Watch | None:
        return None  # no descriptor: the session awaits `wait`

    async def wait(self) -> Exit:
        await self._ended.wait()
        assert self._status is not None
        return self._status

    def release(self) -> None:
        raise AssertionError("never on callbacks alone: the session awaits aclose")

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._closed:
                return
            self._closed = True
            if self._status is None:
                self.hang_up()
                with anyio.move_on_after(self._grace):
                    await self._ended.wait()
                self.send_signal(signal.SIGKILL)
            await self._input.send_eof()
            for receiver in self._receivers:
                receiver.close()


class MemoryBackend:
    """Starts the programs of ``programs`` by argv[0]; get one from `open_memory_backend`."""

    def __init__(self, task_group: anyio.abc.TaskGroup, programs: Mapping[str, Program],
                 default_cwd: str, grace: float) -> None:
        self._task_group = task_group
        self.programs = programs
        self.default_cwd = default_cwd
        self.grace = grace

    async def spawn(self, spec: ProcessSpec) -> MemoryProcess:
        """Raises SpawnError(ENOENT) for a program it does not know, as exec would."""
        name = spec.argv[0] if spec.argv else ""
        program = self.programs.get(name)
        if program is None:
            raise SpawnError(errno.ENOENT, f"{name}: command not found")
        env = dict(spec.env)
        if spec.pty:
            env.setdefault("TERM", spec.term)
        process = MemoryProcess(spec, env, spec.cwd or self.default_cwd, self.grace)
        self._task_group.start_soon(process.run, program)
        return process


@contextlib.asynccontextmanager
async def open_memory_backend(programs: Mapping[str, Program] | None = None, *,
                              default_cwd: str = "/", grace: float = KILL_GRACE,
                              ) -> AsyncIterator[MemoryBackend]:
    """A MemoryBackend whose programs run in a task group of its own; those still running
    when the block ends are killed (SIGKILL)."""
    async with anyio.create_task_group() as task_group:
        yield MemoryBackend(task_group, PROGRAMS if programs is None else programs,
                            default_cwd, grace)
        task_group.cancel_scope.cancel()


# --- the programs -----------------------------------------------------------


async def true(io: ProgramIO) -> int:
    return 0


async def false(io: ProgramIO) -> int:
    return 1


async def cat(io: ProgramIO) -> int:
    """Copies its input to stdout until end-of-input."""
    while data := await io.read():
        await io.write(data)
    return 0


async def emit(io: ProgramIO) -> int:
    """`emit [STDOUT [STDERR [CODE]]]`: writes both, then exits with CODE (0)."""
    out, err, code = [*io.argv[1:], "", "", ""][:3]
    await io.write(out)
    await io.write_err(err)
    return int(code or 0)


async def die(io: ProgramIO) -> Exit:
    """`die SIGNAL`: dies by SIGNAL (a name such as KILL), dumping no core."""
    return killed(signal.Signals["SIG" + io.argv[1]])


async def lost_status(io: ProgramIO) -> Exit:
    """`lost-status [TEXT...]`: writes TEXT, exits; its status cannot be learned (ECHILD)."""
    await io.write(" ".join(io.argv[1:]))
    return exit_from_wait_error(ChildProcessError(errno.ECHILD, os.strerror(errno.ECHILD)))


async def sleep(io: ProgramIO) -> int:
    """`sleep [SIGNAL...]`: never reads its input; ignores the SIGNALs (then writes
    "ready"), and sleeps until another signal kills it."""
    io.ignored.update(signal.Signals["SIG" + name] for name in io.argv[1:])
    if io.ignored:
        await io.write("ready\n")
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def env(io: ProgramIO) -> int:
    """Writes its environment, a `KEY=VALUE` line each, sorted."""
    await io.write("".join(f"{k}={v}\n" for k, v in sorted(io.env.items())))
    return 0


async def env_cwd(io: ProgramIO) -> int:
    """`env-cwd NAME`: writes "$NAME:cwd"."""
    await io.write(f"{io.env.get(io.argv[1], '')}:{io.cwd}\n")
    return 0


async def size(io: ProgramIO) -> int:
    """Writes its terminal's "ROWS COLS", then $TERM, a line each."""
    await io.write(f"{io.rows} {io.cols}\n{io.env.get('TERM', '')}\n")
    return 0


async def winch(io: ProgramIO) -> int:
    """Writes "ready", then, on the first resize (PTY only), the new "ROWS COLS"; exits 0."""
    await io.write("ready\n")
    rows, cols = await io.next_resize()
    await io.write(f"{rows} {cols}\n")
    return 0


def counted(start: int, lines: int) -> bytes:
    """What `count` writes from line ``start`` on: "START\\nSTART+1\\n..."."""
    return "".join(f"{n}\n" for n in range(start, start + lines)).encode()


async def count(io: ProgramIO) -> int:
    """Writes 0, 1, 2, ... a line each, 100 lines a write, until it is killed: output that is
    always there to read, and whose every byte says where it belongs."""
    for block in itertools.count(0, 100):
        await io.write(counted(block, 100))
    raise AssertionError("unreachable")


PROGRAMS: dict[str, Program] = {
    "true": true, "false": false, "cat": cat, "emit": emit, "die": die,
    "lost-status": lost_status, "sleep": sleep, "env": env, "env-cwd": env_cwd,
    "count": count,
    "size": size, "winch": winch,
}
