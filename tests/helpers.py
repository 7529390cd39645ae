"""Shared test helpers: real servers (in-process and as subprocesses), raw peers, /proc probes."""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from ttyserve.addresses import Address, parse_address
from ttyserve.backends.base import Backend
from ttyserve.client import Connection, Session, connect
from ttyserve.client.dial import open_transport
from ttyserve.protocol.frames import Frame, FrameDecoder, FrameKind, encode_frame
from ttyserve.protocol.messages import Hello, Message, encode_message, parse_object
from ttyserve.server.listener import Server
from ttyserve.server.settings import ServerSettings
from ttyserve.server.sockets import SocketLease, open_listeners
from ttyserve.transport.streams import PipeTransport, Transport, send_all

SH = "/bin/sh"


# --- in-process server -----------------------------------------------------


@contextlib.asynccontextmanager
async def running_server(
    socket_path: Path,
    *,
    backend: Backend | None = None,
    linger: float = 2.0,
    command: list[str] | None = None,
    shutdown_timeout: float = 10.0,
    **settings_given: Any,
) -> AsyncIterator[tuple[Server, str]]:
    """A real server on a Unix socket in this process; shut down gracefully on exit.
    ``settings_given`` are more of its ServerSettings."""
    settings = ServerSettings(command=command or [SH], linger=linger,
                              shutdown_timeout=shutdown_timeout, **settings_given)
    server = Server(settings, backend=backend)
    leases: list[SocketLease] = []
    listeners = open_listeners([Address("unix", path=str(socket_path))], leases)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listeners)
            try:
                yield server, f"unix:{socket_path}"
            finally:
                server.shutdown()
    finally:
        for lease in leases:
            lease.release()


@contextlib.asynccontextmanager
async def reattached(address: str, script: str, pty: bool = False) -> AsyncIterator[Session]:
    """A detachable `sh -c script`, detached and its connection closed, then attached again
    on a new connection: that session, while the new connection lasts."""
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", script], pty=pty, detachable=True)
        await session.detach()
    async with connect(address, multiplex=True) as conn:
        yield await conn.attach(session.id or "")


# --- raw protocol peers ----------------------------------------------------


def ctrl(channel: int, message: Message | dict[str, object] | bytes) -> bytes:
    """A CTRL_IN frame carrying ``message`` (a struct, a dict, or raw payload bytes)."""
    if isinstance(message, Message):
        payload = encode_message(message)
    elif isinstance(message, dict):
        import json

        payload = json.dumps(message).encode()
    else:
        payload = message
    return encode_frame(FrameKind.CTRL_IN, channel, payload)


HELLO = ctrl(0, Hello(protocol=1))


def control_of(frame: Frame) -> dict[str, object]:
    assert frame.kind is FrameKind.CTRL_OUT, frame
    return parse_object(frame.payload)[1]


class RawPeer:
    """A client that speaks frames by hand, to see exactly what the server sends."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.decoder = FrameDecoder(64 << 20)
        self.pending: list[Frame] = []
        self.seen: list[Frame] = []  # frames a test passed over, kept for a later look

    async def send(self, data: bytes) -> None:
        await send_all(self.transport, data)

    async def next_frame(self) -> Frame | None:
        """The next frame, or None at EOF."""
        while not self.pending:
            try:
                data = await self.transport.receive(1 << 20)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return None
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    async def frames_until_eof(self) -> list[Frame]:
        frames = []
        while (frame := await self.next_frame()) is not None:
            frames.append(frame)
        return frames

    async def next_control(self) -> dict[str, object]:
        while True:
            frame = await self.next_frame()
            assert frame is not None, "connection closed before a control message"
            if frame.kind is FrameKind.CTRL_OUT:
                return control_of(frame)


@contextlib.asynccontextmanager
async def raw_peer(address: str) -> AsyncIterator[RawPeer]:
    """A raw peer on ``address`` (unix:PATH, or a bare path, or tcp:HOST:PORT)."""
    transport = await open_transport(
        parse_address(address) if address.startswith("tcp:")
        else Address("unix", path=address.removeprefix("unix:")))
    try:
        yield RawPeer(transport)
    finally:
        await transport.aclose()


def split_output(frames: list[Frame], channel: int = 1,
                 ) -> tuple[bytes, bytes, list[dict[str, object]]]:
    """(stdout, stderr, control messages) of one channel, in order."""
    out, err, controls = b"", b"", []
    for frame in frames:
        if frame.channel != channel:
            continue
        if frame.kind is FrameKind.STDOUT:
            out += frame.payload
        elif frame.kind is FrameKind.STDERR:
            err += frame.payload
        else:
            controls.append(control_of(frame))
    return out, err, controls


# --- server subprocess -----------------------------------------------------


@dataclass
class ServerProcess:
    """`ttyserve serve` as a real subprocess; stderr is kept for failure reports."""

    proc: subprocess.Popen[bytes]
    addresses: list[str] = field(default_factory=list)
    stderr_path: Path | None = None
    browse: list[str] = field(default_factory=list)  # `browse URL` lines (web listeners)

    @property
    def pid(self) -> int:
        """The server's pid: its supervisor's with workers (the one for signals)."""
        return self.proc.pid

    def pids(self) -> list[int]:
        """Every process of the server: the supervisor and its workers, or the one."""
        workers = self.worker_pids()
        return workers if workers == [self.proc.pid] else [self.proc.pid, *workers]

    def session_children(self) -> list[int]:
        """The children of the processes that run sessions (sessions, and nothing else)."""
        return [pid for worker in self.worker_pids() for pid in children_of(worker)]

    def open_fds(self) -> int:
        return sum(open_fds(pid) for pid in self.pids())

    def rss_kib(self) -> int:
        return sum(rss_kib(pid) for pid in self.pids())

    def worker_pids(self) -> list[int]:
        """The processes that run sessions: the workers, or the server itself."""
        workers = [pid for pid in children_of(self.proc.pid) if _is_worker(pid)]
        return workers or [self.proc.pid]

    def stderr_tail(self) -> str:
        if self.stderr_path is None or not self.stderr_path.exists():
            return ""
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def wait(self, timeout: float = 15) -> int:
        """The exit code, once the server exits by itself."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not exit; stderr:\n{self.stderr_tail()}") from None
        finally:
            if self.proc.stdout is not None and self.proc.returncode is not None:
                self.proc.stdout.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Signal the server (unless it already exited) and return its exit code. Workers
        its death left (SIGKILL: they die with it, our children by then, as subreaper) are
        reaped here: no zombie outlives the test."""
        workers = [] if self.proc.poll() is not None else [
            pid for pid in self.worker_pids() if pid != self.proc.pid]
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.wait(timeout)
        deadline = time.monotonic() + timeout
        for pid in workers:
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG) != (0, 0):
                        break
                except ChildProcessError:  # reaped by the supervisor, or not ours
                    if not os.path.exists(f"/proc/{pid}"):
                        break
                time.sleep(0.01)
        return code


def _is_worker(pid: int) -> bool:
    try:
        return b"TTYSERVE_WORKER=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def ttyserve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ttyserve", *args]


class StdioServer:
    def __init__(self, process: subprocess.Popen[bytes], peer: RawPeer) -> None:
        self.process = process
        self.peer = peer

    async def exit_code(self, timeout: float = 10) -> int:
        with anyio.fail_after(timeout):
            return await anyio.to_thread.run_sync(self.process.wait)

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read().decode()


@contextlib.asynccontextmanager
async def stdio_server(*args: str, env: dict[str, str] | None = None, **popen: Any,
                       ) -> AsyncIterator[StdioServer]:
    """`serve --stdio` as a child whose stdin and stdout are our transport (``popen``: more
    of subprocess.Popen's arguments, such as cwd and umask)."""
    argv = ttyserve_command("serve", "--stdio", "--command", SH, *args)
    async with far_side_process(argv, env, **popen) as server:
        yield server


@contextlib.asynccontextmanager
async def far_side_process(argv: list[str], env: dict[str, str] | None = None, **popen: Any,
                   ) -> AsyncIterator[StdioServer]:
    """``argv`` (what a carrier runs on the far side) as a child whose stdin and stdout are
    our transport, its stderr kept for `StdioServer.stderr`."""
    to_server, from_us = os.pipe()
    from_server, to_us = os.pipe()
    process = subprocess.Popen(
        argv, stdin=to_server, stdout=to_us, stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})}, **popen)
    os.close(to_server)
    os.close(to_us)
    transport = PipeTransport(from_server, from_us)
    try:
        yield StdioServer(process, RawPeer(transport))
    finally:
        await transport.aclose()
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()


def tls_files(directory: Path) -> None:
    """cert.pem and key.pem for 127.0.0.1, and ca.pem that signed them (trustme)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    cert.private_key_pem.write_to_path(str(directory / "key.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))


def token_file(directory: Path, token: str) -> Path:
    """A token file as `serve` and `exec` take one: its owner's alone."""
    path = directory / "token"
    path.write_text(token)
    path.chmod(0o600)
    return path


WORKERS: int | None = None  # what the `workers` fixture asks of every server a test starts


def start_server(tmp_path: Path, *args: str, listen: list[str] | None = None,
                 expect_lines: int | None = None, env: dict[str, str] | None = None,
                 expect_browse: int = 0, cwd: Path | None = None, prefix: tuple[str, ...] = (),
                 **popen: Any) -> ServerProcess:
    """Start `ttyserve serve --workers N` (N from the `workers` fixture, which every test
    that starts a server takes) and wait for its `listening` lines. ``prefix`` runs it (a
    wrapper that execs it), ``popen``: more of subprocess.Popen's arguments."""
    if WORKERS is None and not any(a.startswith("--workers") for a in args):
        raise AssertionError("a test that starts a server runs with each worker count: it "
                             "takes the `workers` fixture (pytest.mark.usefixtures)")
    listen = listen if listen is not None else [f"unix:{tmp_path / 's.sock'}"]
    count = [] if any(a.startswith("--workers") for a in args) else [f"--workers={WORKERS}"]
    argv = [*prefix, *ttyserve_command("serve", *[f"--listen={a}" for a in listen], *count,
                                       *args)]
    stderr_path = tmp_path / f"server-{time.monotonic_ns()}.stderr"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                cwd=cwd, **popen)
    server = ServerProcess(proc, stderr_path=stderr_path)
    assert proc.stdout is not None
    wanted = expect_lines if expect_lines is not None else len(listen)
    deadline = time.monotonic() + 15
    fd = proc.stdout.fileno()
    pending = b""
    while len(server.addresses) < wanted or len(server.browse) < expect_browse:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(remaining, 0))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            server.stop(signal.SIGKILL)
            raise AssertionError(f"server did not start; stderr:\n{server.stderr_tail()}")
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            word, _, value = line.decode().partition(" ")
            assert word in ("listening", "browse"), line
            (server.addresses if word == "listening" else server.browse).append(value.strip())
    return server


# --- /proc probes ----------------------------------------------------------


def _stat_fields(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from `state` on


def _processes() -> Iterator[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgid) of every process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(entry)) is not None:
            yield int(entry), fields[0], int(fields[1]), int(fields[2])


def processes_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    return [pid for pid, state, _, group in _processes() if group == pgid and state != "Z"]


def parent_of(pid: int) -> int:
    fields = _stat_fields(str(pid))
    assert fields is not None, f"process {pid} is gone"
    return int(fields[1])


def children_of(ppid: int) -> list[int]:
    return [pid for pid, _, parent, _ in _processes() if parent == ppid]


def zombie_children(ppid: int) -> list[int]:
    return [pid for pid, state, parent, _ in _processes() if parent == ppid and state == "Z"]


def open_fds(pid: int | str = "self") -> int:
    if pid == "self":
        gc.collect()  # descriptors of objects other tests dropped must not move the count
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def wait_until(predicate: object, timeout: float, interval: float = 0.02) -> bool:
    """Poll a /proc condition (the kernel offers no event for another process's group)."""
    assert callable(predicate)
    with anyio.move_on_after(timeout):
        while not predicate():
            await anyio.sleep(interval)
        return True
    return bool(predicate())


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def blocking_unix_socket(path: str, timeout: float = 10) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        yield sock
    finally:
        sock.close()


async def echo_through_cat(conn: Connection, copies: int, payload: bytes) -> list[bytes]:
    """``copies`` `cat` sessions at once on ``conn``, each fed ``payload`` while it is read
    back: what each returned, in order (windows are exercised both ways)."""
    results: dict[int, bytes] = {}

    async def echo(index: int) -> None:
        session = await conn.spawn(["cat"], pty=False)
        received = bytearray()
        async with anyio.create_task_group() as tg:

            async def feed() -> None:
                await session.send(payload)
                await session.eof()

            tg.start_soon(feed)
            async for chunk in session:
                received += chunk.data
        results[index] = bytes(received)

    async with anyio.create_task_group() as tg:
        for index in range(copies):
            tg.start_soon(echo, index)
    return [results[index] for index in range(copies)]


def wait_for_line(proc: subprocess.Popen[bytes], timeout: float = 10) -> bytes:
    """The next line ``proc`` writes to its stdout, failing if none comes in ``timeout``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no output in time"
    return proc.stdout.readline()


def server_pid(path: Path) -> int | None:
    """The pid of the server answering on ``path`` (SO_PEERCRED), if one does."""
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return None
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return pid


def wait_until_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # (ours: we are the subreaper)
                return True
        if not os.path.exists(f"/proc/{pid}"):
            return True
        time.sleep(0.05)
    return False


def stop_warm_servers(runtime: Path) -> int:
    """End the warm far sides (cli/warm.py) serving in ``runtime``: those a test's `serve
    --stdio` started are ours (we are their subreaper). How many there were."""
    stopped = 0
    for path in runtime.glob("ttyserve-warm-*.sock"):
        pid = server_pid(path)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            assert wait_until_gone(pid), f"the warm server {pid} did not end"
            stopped += 1
    return stopped


def warm_runtime(directory: Path, monkeypatch: Any) -> Path:
    """A runtime directory ``directory``/rt (made if need be), the test's commands to look for
    a warm server there (TTYSERVE_WARM=1)."""
    runtime = directory / "rt"
    runtime.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("TTYSERVE_WARM", "1")
    return runtime


@contextlib.contextmanager
def start_warm_server(directory: Path, monkeypatch: Any, idle: float = 120
                      ) -> Iterator[subprocess.Popen[bytes]]:
    """A warm far side (cli/warm.py) in a runtime directory of its own under ``directory``,
    which the test's `serve --stdio` (TTYSERVE_WARM=1) reaches; stopped after the test."""
    from ttyserve.cli.warm import warm_socket_path

    warm_runtime(directory, monkeypatch)
    path = warm_socket_path()
    process = subprocess.Popen([sys.executable, "-m", "ttyserve.cli.warm", path, str(idle)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert wait_for_line(process) == f"listening {path}\n".encode()
        yield process
    finally:
        killed = process.poll() is not None and process.returncode < 0  # by the test
        if not killed:
            process.terminate()
            assert process.wait(10) == 0
        assert process.stdout is not None
        process.stdout.close()
        assert killed or not os.path.exists(path), "the warm server left its socket behind"


async def worker_of(conn: Connection) -> int:
    """The pid of the worker (or the one server process) serving ``conn``: a session run on
    this host says its parent."""
    probe = await conn.spawn(["sh", "-c", "echo $PPID"], pty=False)
    said = b"".join([chunk.data async for chunk in probe])
    await probe.wait()
    return int(said)
