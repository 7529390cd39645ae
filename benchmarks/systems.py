"""The compared systems: what each does for every workload primitive.

A system starts (a server, if it has one), then answers the primitives the
workloads time: stream a command's output, echo keystrokes, run short sessions,
hold many sessions, stream through its command-line client. `raw` is the same
work with no server in between; `ttyserve` is the server measured with the
minimal blocking client (benchmarks/wire.py); `ttyserve-lib` is the same
server through the project's anyio client library, and `ttyserve-ws` that
library over the server's WebSocket listener; `pdsh` runs only the fan-out.
The SSH peers live in peers.py.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from . import procs
from .procs import Usage
from .server import (
    TtyserveServer,
    far_side_environment,
    relay_server,
    serve_flags,
    stdio_server,
    ttyserve_script,
)
from .wire import WireSession

if TYPE_CHECKING:
    from .fanout import Loopback

try:
    from ttyserve.errors import SessionDetached
except ImportError:  # an older ttyserve, measured for comparison: no detachable sessions
    SessionDetached = Exception  # type: ignore[misc,assignment]

ECHO_MARKER = b"R"  # printed by the echo command once its terminal is raw
WARMUP_ROUNDS = 10  # untimed keystrokes before the timed ones
now = time.perf_counter


class NotApplicable(Exception):
    """This system has no such measurement (printed as '-', not as a failure)."""


def _until_exit(session: WireSession, argv: list[str]) -> None:
    """Read the session to its `exit`, which must say 0."""
    session.count_until_exit()
    if session.exit is None or session.exit.get("code") != 0:
        raise RuntimeError(f"{argv[0]}: exit {session.exit}")


@dataclass
class Transfer:
    """Bytes received from one session, and the time from connect to exit."""

    nbytes: int
    seconds: float


@dataclass
class SessionRun:
    """Sequential short sessions: each one's latency and the whole run's time."""

    latencies: list[float]
    seconds: float


@dataclass
class ScaleRun:
    """Many sessions held open at once."""

    open_seconds: float
    usage: Usage | None
    latencies: list[float]


@dataclass
class ExecRun:
    """A command-line client streaming to /dev/null: wall time and its own CPU."""

    seconds: float
    client_cpu: float | None


Probe = Callable[[], Usage | None]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_subprocess(argv: list[str], env: dict[str, str] | None = None) -> ExecRun:
    """Run ``argv`` with stdout to /dev/null; wall time and the CPU of what it started."""
    before = children_cpu()
    start = now()
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, check=False, timeout=600, env=env)
    seconds = now() - start
    if result.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {result.returncode}: "
                           f"{result.stderr.decode(errors='replace').strip()[-300:]}")
    return ExecRun(seconds, children_cpu() - before)


class System:
    """Base: every primitive is NotApplicable until a system provides it."""

    name = "?"
    transports: tuple[str, ...] = ()

    def unavailable(self) -> str | None:
        """Why this system cannot run here, or None."""
        return None

    def start(self) -> None:
        """Start what the system needs (its server); called once per workload."""

    def stop(self) -> None:
        """Stop and clean up everything start() started."""

    def server_pids(self) -> list[int]:
        return []

    def cpu_pids(self) -> list[int]:
        """The processes whose own CPU time is the server's cost."""
        return self.server_pids()

    def usage(self) -> Usage | None:
        pids = self.server_pids()
        return Usage.of(pids) if pids else None

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        raise NotApplicable

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        raise NotApplicable

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        raise NotApplicable

    def sessions_one_connection(self, argv: list[str], count: int, transport: str
                                ) -> SessionRun:
        """Sequential sessions on one multiplexed connection (``transport`` "stdio": a
        `serve --stdio` child, as a carrier reaches it)."""
        raise NotApplicable

    def scale(self, argv: list[str], count: int, rounds: int, probe: Probe,
              transport: str) -> ScaleRun:
        raise NotApplicable

    def exec_command(self, argv: list[str], transport: str) -> list[str]:
        """A command line that runs ``argv`` through this system, its output on stdout."""
        raise NotApplicable

    def exec_stream(self, argv: list[str], transport: str) -> ExecRun:
        return timed_subprocess(self.exec_command(argv, transport))

    warm_starts = False  # whether its client starts warm (ttyserve/cli/warm.py) when it can

    def startup(self, transport: str) -> float:
        """Seconds from starting a client to its exit, running `true`."""
        return self.exec_stream(["true"], transport).seconds

    def warm_startup(self, transport: str, runtime: str) -> float:
        """As `startup`, the client reaching the warm server of the runtime dir ``runtime``."""
        raise NotApplicable

    def fanout(self, targets: int, parallel: int, over: str = "local", warm: bool = False
               ) -> float:
        """Seconds to run one command on ``targets`` hosts, ``parallel`` at once: simulated
        (local) or through a loopback sshd (ssh), whose far sides are warm if ``warm``."""
        raise NotApplicable

    def stdio_start(self, warm: str | None = None) -> float:
        """Seconds from starting the far side (`serve --stdio`) to the `exit` of a `true` it
        runs: what every carrier's session waits for; through the warm server of the runtime
        directory ``warm`` if given."""
        raise NotApplicable

    def relay_start(self) -> float:
        """`stdio_start` for `serve --stdio --persist` (a carrier's reconnect) with the
        user's server answering on the default socket: the relay's start."""
        raise NotApplicable

    def one_target(self, argv: list[str], loopback: Loopback) -> float:
        """Seconds to run ``argv`` on one host through the loopback sshd."""
        raise NotApplicable

    def scale_pipes(self, connections: int, per_connection: int, rounds: int,
                    probe: Probe) -> ScaleRun:
        """``connections`` x ``per_connection`` `cat` sessions in pipe mode held at once on
        multiplexed connections; line echo through the last one opened."""
        raise NotApplicable

    def reattach(self, ring: int) -> tuple[float, int]:
        """Seconds from `attach` to the last byte of a full ring of about ``ring`` bytes,
        and the bytes it replayed."""
        raise NotApplicable


# --- raw: the same work with no server in between ----------------------------


def _fd_echo(fd: int, rounds: int) -> list[float]:
    """Keystroke round trips on a descriptor that is both the input and the output."""
    latencies: list[float] = []
    write, read = os.write, os.read
    for index in range(WARMUP_ROUNDS + rounds):
        start = now()
        write(fd, b"x")
        if read(fd, 16) != b"x":
            raise RuntimeError("the echo came back wrong")
        if index >= WARMUP_ROUNDS:
            latencies.append(now() - start)
    return latencies


class RawSystem(System):
    """Blocking reads of a local pty or pipe, and bare posix_spawn: the machine's limit."""

    name = "raw"
    transports = ("local",)

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        start = now()
        if pty:
            pid, output = procs.spawn_pty(argv)
            close: Callable[[], None] = functools.partial(os.close, output)
        else:
            child = procs.spawn_pipes(argv)
            pid, output, close = child.pid, child.stdout, child.close
        try:
            nbytes = procs.read_to_eof(output)
        except BaseException:
            close()
            procs.reap_quietly(pid)
            raise
        close()
        status = procs.wait_status(pid)
        seconds = now() - start
        if status != 0:
            raise RuntimeError(f"{argv[0]} exited {status}")
        return Transfer(nbytes, seconds)

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        pid, master = procs.spawn_pty(argv)
        try:
            procs.read_until(master, ECHO_MARKER)
            return _fd_echo(master, rounds)
        finally:
            os.close(master)
            procs.reap_quietly(pid)

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        path = procs.session_env().get("PATH", os.defpath)
        executable = next((os.path.join(d, argv[0]) for d in path.split(os.pathsep)
                           if os.access(os.path.join(d, argv[0]), os.X_OK)), argv[0])
        env = procs.session_env()
        latencies: list[float] = []
        start = now()
        for _ in range(count):
            begin = now()
            pid = self._spawn(executable, argv, env)
            status = procs.wait_status(pid)
            self._reaped()
            latencies.append(now() - begin)
            if status != 0:
                raise RuntimeError(f"{argv[0]} exited {status}")
        return SessionRun(latencies, now() - start)

    def _spawn(self, executable: str, argv: list[str], env: dict[str, str]) -> int:
        return os.posix_spawn(executable, argv, env)

    def _reaped(self) -> None:
        """The child of the last `_spawn` was reaped."""

    def scale(self, argv: list[str], count: int, rounds: int, probe: Probe,
              transport: str) -> ScaleRun:
        held: list[tuple[int, int]] = []
        try:
            start = now()
            for _ in range(count):
                pid, master = procs.spawn_pty(argv)
                held.append((pid, master))
                procs.read_until(master, ECHO_MARKER)
            opened = now() - start
            latencies = _fd_echo(held[-1][1], rounds)
        finally:
            for _, master in held:
                os.close(master)
            for pid, _ in held:
                procs.reap_quietly(pid)
        return ScaleRun(opened, Usage(None, count), latencies)

    def exec_command(self, argv: list[str], transport: str) -> list[str]:
        return ["sh", "-c", shlex.join(argv) + " | cat"]

    def exec_stream(self, argv: list[str], transport: str) -> ExecRun:
        return ExecRun(timed_subprocess(self.exec_command(argv, transport)).seconds, None)

    def startup(self, transport: str) -> float:
        return timed_subprocess([sys.executable, "-c", "pass"]).seconds  # the interpreter's floor

    def stdio_start(self, warm: str | None = None) -> float:
        return self.startup("unix")

    def relay_start(self) -> float:
        return self.startup("unix")

    warm_starts = True  # (the same floor: the column the warm start is held to)

    def warm_startup(self, transport: str, runtime: str) -> float:
        return self.startup(transport)


# --- ttyserve ------------------------------------------------------------------


def _wire_echo(session: WireSession, rounds: int) -> list[float]:
    latencies: list[float] = []
    for index in range(WARMUP_ROUNDS + rounds):
        start = now()
        session.send(b"x")
        if session.read_data() != b"x":
            raise RuntimeError("the echo came back wrong")
        if index >= WARMUP_ROUNDS:
            latencies.append(now() - start)
    return latencies


class TtyserveSystem(System):
    """A `ttyserve serve` subprocess, driven by the minimal blocking client."""

    name = "ttyserve"
    transports = ("unix", "tcp")
    serve_extra: tuple[str, ...] = ()  # more flags for `serve`

    def __init__(self, workdir: str) -> None:
        self.server = TtyserveServer(workdir, self.serve_extra)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def server_pids(self) -> list[int]:
        """The server's processes: with workers, the supervisor and every worker."""
        return [self.server.pid, *(pid for pid in procs.children(self.server.pid)
                                   if procs.is_server(pid))]

    def _session(self, transport: str) -> WireSession:
        return WireSession(self.server.address(transport), self.server.token)

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        start = now()
        with self._session(transport) as session:
            session.start(argv, pty=pty)
            nbytes = session.count_until_exit()
            status = session.exit
        seconds = now() - start
        if status is None or status.get("code") != 0:
            raise RuntimeError(f"{argv[0]}: exit {status}")
        return Transfer(nbytes, seconds)

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        with self._session(transport) as session:
            session.start(argv, pty=True)
            session.read_until(ECHO_MARKER)
            return _wire_echo(session, rounds)

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        latencies: list[float] = []
        start = now()
        for _ in range(count):
            begin = now()
            with self._session(transport) as session:
                session.start(argv, pty=False)
                _until_exit(session, argv)
                latencies.append(now() - begin)
        return SessionRun(latencies, now() - start)

    def stdio_start(self, warm: str | None = None) -> float:
        return self._far_side_start(lambda sock: stdio_server(sock, self.server.workdir, warm))

    def relay_start(self) -> float:
        server = self.server  # its Unix socket is the default one of its directory
        return self._far_side_start(lambda sock: relay_server(sock, server.workdir, server.dir))

    def _far_side_start(self, start_far_side: Callable[[socket.socket],
                                                       subprocess.Popen[bytes] | None]) -> float:
        ours, theirs = socket.socketpair()
        start = now()
        with theirs:
            child = start_far_side(theirs)
        if child is None:
            ours.close()
            raise NotApplicable
        try:
            with WireSession(sock=ours) as session:
                session.start(["true"], pty=False)
                _until_exit(session, ["true"])
                return now() - start
        finally:
            child.wait()

    def one_target(self, argv: list[str], loopback: Loopback) -> float:
        script = ttyserve_script()  # both the client and the far side's --remote-command
        if script is None:
            raise NotApplicable
        return timed_subprocess(
            [script, "exec", "--connect", f"via:ssh -F {loopback.config} host001",
             "--remote-command", script, "--", *argv],
            {**os.environ, **far_side_environment(loopback.runtime)}).seconds

    def sessions_one_connection(self, argv: list[str], count: int, transport: str
                                ) -> SessionRun:
        child: subprocess.Popen[bytes] | None = None
        if transport == "stdio":
            ours, theirs = socket.socketpair()
            with theirs:
                try:
                    child = stdio_server(theirs, self.server.workdir)
                except BaseException:
                    ours.close()
                    raise
            if child is None:
                ours.close()
                raise NotApplicable
            session = WireSession(sock=ours)
        else:
            session = self._session(transport)
        try:
            session.start(argv, pty=False, multiplex=True)
            _until_exit(session, argv)  # untimed: the first waits for the start-up
            latencies: list[float] = []
            start = now()
            for _ in range(count):
                begin = now()
                session.open_next(argv, pty=False)
                _until_exit(session, argv)
                latencies.append(now() - begin)
            return SessionRun(latencies, now() - start)
        finally:
            session.close()
            if child is not None:
                try:
                    child.wait(timeout=20)  # our end closed: its EOF ends it
                finally:
                    if child.poll() is None:
                        child.kill()
                        child.wait()

    def scale(self, argv: list[str], count: int, rounds: int, probe: Probe,
              transport: str) -> ScaleRun:
        held: list[WireSession] = []
        try:
            start = now()
            for _ in range(count):
                session = self._session(transport)
                held.append(session)
                session.start(argv, pty=True)
                session.read_until(ECHO_MARKER)
            opened = now() - start
            usage = probe()
            latencies = _wire_echo(held[-1], rounds)
        finally:
            for session in held:
                session.close()
        return ScaleRun(opened, usage, latencies)

    def exec_command(self, argv: list[str], transport: str) -> list[str]:
        return self.server.exec_command(transport, argv)

    warm_starts = True

    def warm_startup(self, transport: str, runtime: str) -> float:
        return timed_subprocess(self.exec_command(["true"], transport),
                                {**os.environ, **far_side_environment(runtime)}).seconds

    def fanout(self, targets: int, parallel: int, over: str = "local", warm: bool = False
               ) -> float:
        from .fanout import run_once

        return run_once("ttyserve", targets, parallel, self.server.workdir, over=over,
                        warm=warm)


async def _library_echo(session: Any, data: bytes, rounds: int) -> list[float]:
    """Round trips of ``data`` through a session that echoes it (the library's client)."""
    latencies: list[float] = []
    for index in range(WARMUP_ROUNDS + rounds):
        start = now()
        await session.send(data)
        chunk = await session.receive()
        if chunk is None or chunk.data != data:
            raise RuntimeError("the echo came back wrong")
        if index >= WARMUP_ROUNDS:
            latencies.append(now() - start)
    return latencies


class TtyserveLibSystem(TtyserveSystem):
    """The same server through the project's client library (anyio on asyncio)."""

    name = "ttyserve-lib"
    spawn_options: dict[str, Any] = {}  # noqa: RUF012  # (read only)

    def _connect(self, transport: str, **kwargs: Any) -> Any:
        from ttyserve.client import connect

        if self.server.token is not None and "token" in inspect.signature(connect).parameters:
            kwargs["token"] = self.server.token
        return connect(self.server.address(transport), **kwargs)

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        import anyio

        async def main() -> Transfer:
            start = now()
            nbytes = 0
            async with self._connect(transport) as conn:
                session = await conn.spawn(argv, pty=pty, **self.spawn_options)
                async for chunk in session:
                    nbytes += len(chunk.data)
                status = session.status
            seconds = now() - start
            if status is None or status.code != 0:
                raise RuntimeError(f"{argv[0]}: exit {status}")
            return Transfer(nbytes, seconds)

        result: Transfer = anyio.run(main, backend="asyncio")
        return result

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        import anyio

        async def main() -> list[float]:
            async with self._connect(transport) as conn:
                session = await conn.spawn(argv, pty=True, **self.echo_options)
                seen = b""
                while ECHO_MARKER not in seen:
                    chunk = await session.receive()
                    if chunk is None:
                        raise RuntimeError("the echo command exited")
                    seen += chunk.data
                with self._watched(session.id, transport):
                    latencies = await _library_echo(session, b"x", rounds)
                await session.cancel()
            return latencies

        result: list[float] = anyio.run(main, backend="asyncio")
        return result

    @property
    def echo_options(self) -> dict[str, Any]:
        return self.spawn_options

    def _watched(self, session_id: str | None, transport: str) -> Any:
        """What watches the echo (the observers' systems): nothing here."""
        return contextlib.nullcontext()

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        import anyio

        async def main() -> SessionRun:
            latencies: list[float] = []
            start = now()
            for _ in range(count):
                begin = now()
                async with self._connect(transport) as conn:
                    session = await conn.spawn(argv, pty=False)
                    status = await session.wait()
                    latencies.append(now() - begin)
                if status.code != 0:
                    raise RuntimeError(f"{argv[0]}: exit {status}")
            return SessionRun(latencies, now() - start)

        result: SessionRun = anyio.run(main, backend="asyncio")
        return result

    def scale(self, argv: list[str], count: int, rounds: int, probe: Probe,
              transport: str) -> ScaleRun:
        raise NotApplicable

    def exec_command(self, argv: list[str], transport: str) -> list[str]:
        raise NotApplicable

    warm_starts = False  # the library in a running program: nothing to start

    def fanout(self, targets: int, parallel: int, over: str = "local", warm: bool = False
               ) -> float:
        raise NotApplicable

    def sessions_one_connection(self, argv: list[str], count: int, transport: str
                                ) -> SessionRun:
        raise NotApplicable  # the ttyserve column measures it with the wire client

    def startup(self, transport: str) -> float:
        """The library in a running program: connect, run `true`, learn its exit."""
        import anyio

        async def main() -> float:
            start = now()
            async with self._connect(transport) as conn:
                status = await (await conn.spawn(["true"], pty=False)).wait()
            if status.code != 0:
                raise RuntimeError(f"true: exit {status}")
            return now() - start

        seconds: float = anyio.run(main, backend="asyncio")
        return seconds

    def reattach(self, ring: int) -> tuple[float, int]:
        import anyio

        async def main() -> tuple[float, int]:
            async with self._connect("unix", multiplex=True) as conn:
                # twice the ring, then quiet: the ring holds its newest `ring` bytes
                session = await conn.spawn(["sh", "-c", f"head -c {2 * ring} /dev/zero; "
                                            "echo; exec sleep 60"], pty=False, detachable=True)
                got = 0
                async for chunk in session:
                    got += len(chunk.data)
                    if got >= 2 * ring + 1:
                        break
                assert session.id is not None
                await session.detach()
                with contextlib.suppress(SessionDetached):
                    async for _ in session:
                        pass
                start = now()
                again = await conn.attach(session.id)
                # Less than the ring's size: each chunk also counts a fixed cost toward it.
                replayed, held = 0, got - again.dropped
                if held < ring * 0.9:
                    raise RuntimeError(f"the ring held {held} bytes, not about {ring}")
                while replayed < held:
                    chunk = await again.receive()
                    if chunk is None:
                        raise RuntimeError("the session ended during the replay")
                    replayed += len(chunk.data)
                seconds = now() - start
                await again.cancel()
            return seconds, replayed

        result: tuple[float, int] = anyio.run(main, backend="asyncio")
        return result


    def scale_pipes(self, connections: int, per_connection: int, rounds: int,
                    probe: Probe) -> ScaleRun:
        import anyio

        async def main() -> ScaleRun:
            async with contextlib.AsyncExitStack() as stack:
                start = now()
                sessions = []
                for _ in range(connections):
                    conn = await stack.enter_async_context(
                        self._connect("unix", multiplex=True))
                    for _ in range(per_connection):
                        sessions.append(await conn.spawn(["cat"], pty=False))
                opened = now() - start
                usage = probe()
                latencies = await _library_echo(sessions[-1], b"x\n", rounds)
                for session in sessions:
                    await session.cancel()
            return ScaleRun(opened, usage, latencies)

        result: ScaleRun = anyio.run(main, backend="asyncio")
        return result


class TtyserveObservedSystem(TtyserveLibSystem):
    """The library's detachable sessions with ``observers`` observers attached (section 11),
    reading everything in a process of their own; with 0, the same path with nobody
    watching, so the two differ only in the observers."""

    name = "ttyserve-observed"
    observers = 10
    stall = False  # the observers never read (their credit is never given back)

    @contextlib.contextmanager
    def _watched(self, session_id: str | None, transport: str) -> Any:
        """The observers' process, once all of them are attached."""
        if not self.observers:
            yield
            return
        assert session_id is not None
        argv = [sys.executable, "-m", "benchmarks.observers", self.server.address(transport),
                session_id, str(self.observers), "stall" if self.stall else "read",
                *([self.server.token] if self.server.token else [])]
        watchers = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert watchers.stdout is not None
            if watchers.stdout.readline() != b"ready\n":
                raise RuntimeError(f"the observers did not attach (exit {watchers.wait()})")
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(watchers.pid, 9)
            watchers.wait()
            if watchers.stdout is not None:
                watchers.stdout.close()

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        import anyio

        async def main() -> Transfer:
            async with self._connect(transport, multiplex=True) as conn:
                session = await conn.spawn(["sh", "-c", 'read go; exec "$@"', "sh", *argv],
                                           pty=pty, detachable=True)
                with self._watched(session.id, transport):
                    start = now()
                    await session.send(b"go\n")
                    nbytes = 0
                    async for chunk in session:
                        nbytes += len(chunk.data)
                    seconds = now() - start
                    status = session.status
            if status is None or status.code != 0:
                raise RuntimeError(f"{argv[0]}: exit {status}")
            return Transfer(nbytes, seconds)

        result: Transfer = anyio.run(main, backend="asyncio")
        return result

    @property
    def echo_options(self) -> dict[str, Any]:
        return {"detachable": True}


class TtyserveUnobservedSystem(TtyserveObservedSystem):
    name = "ttyserve-unobserved"
    observers = 0


class TtyserveStalledSystem(TtyserveObservedSystem):
    """Ten observers that never read once attached: they must cost the writer nothing (they
    are skipped forward, never waited for)."""

    name = "ttyserve-stalled"
    stall = True


class TtyserveModesSystem(TtyserveLibSystem):
    """The library's sessions that ask for the terminal's state (section 14): the server
    reads the PTY's flags after every read of output and before every write of input."""

    name = "ttyserve-modes"
    spawn_options: dict[str, Any] = {"modes": True}  # noqa: RUF012


RESUME_WINDOW = 60  # seconds: `spawn(resume=...)` of the resume system


class TtyserveResumeSystem(TtyserveLibSystem):
    """The library's sessions spawned with `resume`: detachable, with a ring, per-stream
    offsets, the terminal mode tracker and a heartbeat (section 10), on the same server."""

    name = "ttyserve-resume"
    spawn_options: dict[str, Any] = {"resume": RESUME_WINDOW}  # noqa: RUF012

    def _connect(self, transport: str, **kwargs: Any) -> Any:
        return super()._connect(transport, heartbeat=5, **kwargs)

    def resume_after_cut(self, total: int, cut_after: int) -> tuple[float, float, int, int]:
        """A stream of ``total`` bytes, its connection cut once ``cut_after`` arrived: seconds
        from the cut to the first byte after it and to the last, the bytes that came after
        the resume (the ring's replay, as the process had written all of it by then), and
        the bytes lost."""
        import socket as sockets

        import anyio

        from ttyserve.client.session import Resumed

        async def main() -> tuple[float, float, int, int]:
            resumed: list[Resumed] = []
            async with self._connect("unix", multiplex=True,
                                     on_resume=lambda e: resumed.append(e)  # type: ignore[arg-type]
                                     if isinstance(e, Resumed) else None) as conn:
                session = await conn.spawn(["sh", "-c", f"head -c {total} /dev/zero; exec cat"],
                                           pty=False, resume=RESUME_WINDOW)
                received = at_cut = 0
                cut = first = 0.0
                async for chunk in session:
                    received += len(chunk.data)
                    if not cut and received >= cut_after:
                        at_cut, cut = received, now()
                        # The cut: the socket shut down under the connection, as a reset does
                        # (the library's own transport: a benchmark may look inside).
                        conn._link.transport.sock.shutdown(sockets.SHUT_RDWR)
                    elif cut and resumed and not first:
                        first = now()
                    if received + session.lost_bytes >= total:
                        break
                last = now()
                await session.cancel()
            if not first:
                raise RuntimeError("no byte came after the resume")
            return first - cut, last - cut, received - at_cut, session.lost_bytes

        result: tuple[float, float, int, int] = anyio.run(main, backend="asyncio")
        return result


class TtyserveWsSystem(TtyserveLibSystem):
    """The library over the server's `ws:` listener: the browser's carriage."""

    name = "ttyserve-ws"

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        return super().stream(argv, pty, "ws")

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        return super().echo(argv, rounds, "ws")

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        raise NotApplicable

    def startup(self, transport: str) -> float:
        raise NotApplicable

    def reattach(self, ring: int) -> tuple[float, int]:
        raise NotApplicable

    def unavailable(self) -> str | None:
        if "--allow-origin" not in serve_flags():
            return "this ttyserve has no ws: listener"
        return None


class RawCgroupSystem(RawSystem):
    """raw's bare posix_spawn, entered into a cgroup of its own as the server does it (a
    mkdir, the spawner moved in and back out around the spawn; an rmdir once reaped): the
    cost of containment at the machine's limit."""

    name = "raw-cgroup"

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self._containment: Any = None
        self._cgroup: Any = None  # the last child's
        self._names = itertools.count()

    def unavailable(self) -> str | None:
        try:
            from ttyserve.backends.cgroups import own_cgroup
        except ImportError:
            return "this ttyserve has no containment"
        own = own_cgroup()
        if own is None or not os.access(own, os.W_OK):
            return "no writable cgroup v2 here (containment needs root or a delegated cgroup)"
        return None

    def start(self) -> None:
        from ttyserve.backends.cgroups import Limits, open_containment

        self._containment = open_containment("auto", Limits())

    def stop(self) -> None:
        if self._containment is not None:
            self._containment.close()
            self._containment = None

    def _spawn(self, executable: str, argv: list[str], env: dict[str, str]) -> int:
        self._cgroup = self._containment.create(str(next(self._names)))
        with self._containment.entered(self._cgroup):
            return os.posix_spawn(executable, argv, env)

    def _reaped(self) -> None:
        self._cgroup.removed()


class TtyserveOneWorkerSystem(TtyserveSystem):
    """The same server as one process (`--workers 1`), beside `ttyserve`'s default (`auto`:
    a supervisor and a worker per CPU)."""

    name = "ttyserve-w1"
    serve_extra = ("--workers", "1")

    def unavailable(self) -> str | None:
        return None if "--workers" in serve_flags() else "this ttyserve has no --workers"


class TtyserveNoCgroupSystem(TtyserveSystem):
    """The same server with containment off (`--cgroup off`): what containment costs."""

    name = "ttyserve-nocg"
    serve_extra = ("--cgroup", "off")

    def unavailable(self) -> str | None:
        return None if "--cgroup" in serve_flags() else "this ttyserve has no --cgroup"


class PdshSystem(System):
    """Debian's pdsh, its `exec` module running the command locally per host."""

    name = "pdsh"

    def unavailable(self) -> str | None:
        if shutil.which("pdsh") is None:
            return "pdsh is not installed (apt-get install pdsh)"
        return None

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    def fanout(self, targets: int, parallel: int, over: str = "local", warm: bool = False
               ) -> float:
        from .fanout import run_once

        return run_once("pdsh", targets, parallel, self.workdir, over=over)


class _HttpEvent(msgspec.Struct):
    """The members of an output stream's event that the benchmark reads."""

    type: str
    data: str = ""
    code: int | None = None


class TtyserveHttpSystem(TtyserveWsSystem):
    """The same server's HTTP API (protocol section 13) on its `ws:` listener, driven with
    the standard library's http.client: `POST /api/v1/sessions`, then its output stream
    (NDJSON, base64) to the `exit` event."""

    name = "ttyserve-http"

    def _connect(self) -> Any:
        import http.client

        host, port = self.server.address("ws").removeprefix("ws:").rsplit(":", 1)
        return http.client.HTTPConnection(host, int(port), timeout=60)

    def _request(self, conn: Any, method: str, path: str, body: bytes | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.server.token}"} if self.server.token else {}
        conn.request(method, f"/api/v1{path}", body=body, headers=headers)
        return conn.getresponse()

    def _run(self, argv: list[str], pty: bool, gate: str | None = None) -> tuple[int, int]:
        """Start ``argv``, read its stream to the exit: (bytes of output, exit code). With
        ``gate`` (a FIFO), the command waits for a line there, written once the stream is
        attached: what it prints before then would go to its scrollback alone. Both
        requests go on one connection, kept alive as HTTP client libraries keep it."""
        if gate is not None:
            argv = ["sh", "-c", f"read go < {gate}; exec {shlex.join(argv)}"]
        conn = self._connect()
        answer = self._request(conn, "POST", "/sessions", msgspec.json.encode(
            {"argv": argv, "pty": pty}))
        created = msgspec.json.decode(answer.read())
        if answer.status != 201:
            conn.close()
            raise RuntimeError(f"POST /sessions: {answer.status} {created}")
        answer = self._request(conn, "GET", f"/sessions/{created['session']}/output")
        decode = msgspec.json.Decoder(_HttpEvent).decode
        nbytes, code = 0, None
        buffer = bytearray()  # what has come and is not a whole line yet
        try:  # (each event decoded whole, as a coordinator would, its base64 read as text)
            while block := answer.read1(1 << 20):
                buffer += block
                view, start = memoryview(buffer), 0
                while (end := buffer.find(b"\n", start)) >= 0:
                    event = decode(view[start:end])
                    start = end + 1
                    if event.type == "attached" and gate is not None:
                        with open(gate, "w") as fifo:
                            fifo.write("go\n")
                    elif event.type == "output":
                        nbytes += len(event.data) * 3 // 4 - event.data[-2:].count("=")
                    elif event.type == "exit":
                        code = event.code
                view.release()
                del buffer[:start]
        finally:
            conn.close()
        if code is None:
            raise RuntimeError("the output stream ended before the exit")
        return nbytes, code

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        gate = os.path.join(self.server.workdir, f"gate-{time.monotonic_ns()}")
        os.mkfifo(gate)
        try:
            start = now()
            nbytes, code = self._run(argv, pty, gate)
        finally:
            os.unlink(gate)
        if code != 0:
            raise RuntimeError(f"{argv[0]}: exit {code}")
        return Transfer(nbytes, now() - start)

    def startup(self, transport: str) -> float:
        """From `POST /api/v1/sessions` of `true` to its `exit` event."""
        start = now()
        _, code = self._run(["true"], False)
        if code != 0:
            raise RuntimeError(f"true: exit {code}")
        return now() - start

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        raise NotApplicable

    def unavailable(self) -> str | None:
        import importlib.util

        if importlib.util.find_spec("ttyserve.api") is None:
            return "this ttyserve has no HTTP API"
        return super().unavailable()
