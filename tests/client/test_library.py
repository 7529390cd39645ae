"""The client library, under asyncio and under trio (anyio's pytest plugin runs each test twice).

Against a real `ttyserve serve` subprocess, and, for a server that misbehaves,
against a scripted peer on a real Unix socket.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest
from helpers import SH, ServerProcess, echo_through_cat

from ttyserve import (
    ConnectionLost,
    RemoteProtocolError,
    RequestError,
    SessionCancelled,
    connect,
    run,
)
from ttyserve.client import Connection
from ttyserve.errors import ErrorCode
from ttyserve.protocol.frames import FrameDecoder, FrameKind, encode_frame
from ttyserve.protocol.messages import (
    Attached,
    Exit,
    Opened,
    SessionInfo,
    Welcome,
    encode_message,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


async def test_pipe_session_streams_and_status(server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        argv = [SH, "-c", "echo out; echo err >&2; exit 5"]
        session = await conn.spawn(argv, pty=False)
        assert isinstance(session.pid, int) and session.argv == argv  # as the server ran it
        chunks = [(c.stream, c.data) async for c in session]
    assert sorted(chunks) == [("stderr", b"err\n"), ("stdout", b"out\n")]
    assert session.status == Exit(code=5)


async def test_run_feeds_input_and_captures_both_streams(server_process: ServerProcess) -> None:
    payload = os.urandom(200_000)
    result = await run([SH, "-c", "cat; printf e >&2; exit 2"], input=payload,
                       address=server_process.addresses[0])
    assert (result.returncode, result.stdout, result.stderr) == (2, payload, b"e")


async def test_pty_session_keys_resize_and_eof(server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", "read line; stty size; echo got:$line"],
                                   pty=True, rows=30, cols=90)
        await session.resize(40, 100)
        await session.send(b"hello\n")
        out = b"".join([c.data async for c in session])
    assert b"40 100" in out and b"got:hello" in out
    assert session.status is not None and session.status.code == 0


async def test_signal_death_is_minus_the_signal(server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", "echo ready; exec sleep 30"], pty=False)
        assert (await session.receive()) is not None
        await session.signal("TERM")
        status = await session.wait()
    assert (status.code, status.signal) == (-15, "TERM")


async def test_a_refused_spawn_raises_request_error(server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        with pytest.raises(RequestError) as info:
            await conn.spawn(["no-such-command-x"], pty=False)
    assert info.value.code == ErrorCode.SPAWN_FAILED
    assert info.value.errno == errno.ENOENT and info.value.retriable is False


async def test_a_cancelled_session_is_not_a_lost_connection(
        server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0], multiplex=True) as conn:
        session = await conn.spawn(["sleep", "30"], pty=False)
        await session.cancel()
        with pytest.raises(SessionCancelled):
            await session.receive()
        other = await conn.spawn(["true"], pty=False)  # the connection goes on
        assert (await other.wait()).code == 0


async def sessions_once(conn: Connection, done: Callable[[list[SessionInfo]], bool],
                        ) -> list[SessionInfo]:
    """The listing, polled until ``done`` says so (the server's state has no event here)."""
    with anyio.fail_after(5):
        while not done(listed := await conn.list_sessions()):
            await anyio.sleep(0.02)
    return listed


async def test_a_spawn_or_attach_given_up_before_its_answer_leaves_nothing_behind(
        server_process: ServerProcess) -> None:
    """A caller that stops waiting right after asking (a timeout, a cancel): the process it
    had opened is cancelled, not left running unseen; the session it was attaching is let
    go again (detached, still running), not held."""
    async with connect(server_process.addresses[0], multiplex=True) as conn:
        with anyio.CancelScope() as scope:
            scope.cancel()  # the `open` is sent; the wait for `opened` is cancelled
            await conn.spawn(["sleep", "30"], pty=False, detachable=True)
        await sessions_once(conn, lambda listed: listed == [])
        session = await conn.spawn(["sleep", "30"], pty=False, detachable=True)
        await session.detach()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await conn.attach(session.id or "")
        (info,) = await sessions_once(conn, lambda listed: not listed[0].attached)
        assert info.session == session.id and info.exit is None
        again = await conn.attach(session.id or "")  # free: no session_in_use
        await again.cancel()


async def test_multiplexed_sessions_with_windows_both_ways(server_process: ServerProcess) -> None:
    payload = os.urandom(3 << 20)
    async with connect(server_process.addresses[0], multiplex=True, window=128 * 1024) as conn:
        results = await echo_through_cat(conn, 4, payload)
    assert results == [payload] * 4


# --- servers that misbehave -------------------------------------------------


def server_frame(channel: int, message: object) -> bytes:
    return encode_frame(FrameKind.CTRL_OUT, channel, encode_message(message))  # type: ignore[arg-type]


@asynccontextmanager
async def scripted_server(path: Path, script: Callable[[anyio.abc.SocketStream],
                                                       Awaitable[None]]) -> AsyncIterator[str]:
    """A peer on a real Unix socket that reads `hello` and `open`, then runs ``script``."""
    listener = await anyio.create_unix_listener(path)

    async def serve_one() -> None:
        stream = await listener.accept()
        async with stream:
            decoder = FrameDecoder()
            frames = []
            while len(frames) < 2:
                frames += decoder.feed(await stream.receive())
            await script(stream)

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(serve_one)
        yield f"unix:{path}"
        tg.cancel_scope.cancel()


WELCOME = server_frame(0, Welcome(protocol=1, server="scripted", max_frame=1 << 20))


async def test_a_server_that_closes_mid_session_is_a_lost_connection(short_dir: Path) -> None:
    async def script(stream: anyio.abc.SocketStream) -> None:
        await stream.send(WELCOME + server_frame(1, Opened(pid=1)))

    async with scripted_server(short_dir / "s.sock", script) as address, connect(
            address) as conn:
        session = await conn.spawn(["anything"], pty=False)
        with pytest.raises(ConnectionLost):
            await session.wait()


async def test_a_server_that_overdraws_credit_is_a_protocol_error(short_dir: Path) -> None:
    async def script(stream: anyio.abc.SocketStream) -> None:
        await stream.send(WELCOME + server_frame(1, Opened(pid=1))
                          + encode_frame(FrameKind.STDOUT, 1, b"x" * 1001))
        await anyio.sleep_forever()

    async with scripted_server(short_dir / "s.sock", script) as address, connect(
            address, window=1000) as conn:
        session = await conn.spawn(["anything"], pty=False)
        with pytest.raises(RemoteProtocolError, match="credit"):
            await session.wait()


async def test_a_server_that_sends_after_exit_is_a_protocol_error(short_dir: Path) -> None:
    async def script(stream: anyio.abc.SocketStream) -> None:
        await stream.send(WELCOME + server_frame(1, Opened(pid=1)))
        await stream.send(server_frame(1, Exit(code=0))
                          + encode_frame(FrameKind.STDOUT, 1, b"late"))
        await anyio.sleep_forever()

    async with scripted_server(short_dir / "s.sock", script) as address, connect(
            address, multiplex=True) as conn:
        session = await conn.spawn(["anything"], pty=False)
        assert (await session.wait()).code == 0  # the exit came first, and counts
        with pytest.raises(RemoteProtocolError, match="after its last frame"):
            await conn.spawn(["more"], pty=False)  # then the connection is broken


async def test_leaving_connect_with_unread_output_does_not_hang(
        server_process: ServerProcess) -> None:
    with anyio.fail_after(10):
        async with connect(server_process.addresses[0]) as conn:
            session = await conn.spawn(["yes"], pty=False)
            assert await session.receive() is not None  # then nobody reads any more


async def test_a_session_nobody_reads_does_not_stall_the_others(
        server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0], multiplex=True, window=1 << 20) as conn:
        # Many small chunks: far more than a queue of chunks would hold, within the window.
        unread = await conn.spawn([SH, "-c", "while :; do echo x; done"], pty=False)
        other = await conn.spawn([SH, "-c", "sleep 0.5; seq 1 3000"], pty=False)
        out = b"".join([c.data async for c in other])
        assert out == b"".join(b"%d\n" % n for n in range(1, 3001))
        await unread.cancel()


async def test_an_observer_attached_as_writer_by_an_old_server_is_refused_and_detached(
        short_dir: Path) -> None:
    """A server that does not know section 11 ignores `role` and attaches a writer (its
    `attached` says no role): the library never acts as a writer for a client that asked
    to watch; it raises, and detaches the channel at once."""
    detached = anyio.Event()

    async def script(stream: anyio.abc.SocketStream) -> None:
        await stream.send(WELCOME + server_frame(1, Attached(session="s1", pid=1, pty=True,
                                                             dropped=0)))
        decoder = FrameDecoder()
        while not detached.is_set():
            for frame in decoder.feed(await stream.receive()):
                if frame.channel == 1 and b'"detach"' in frame.payload:
                    detached.set()

    async with scripted_server(short_dir / "s.sock", script) as address, connect(
            address, multiplex=True) as conn:
        with pytest.raises(RequestError) as refused:
            await conn.attach("s1", role="observer")
        assert "does not serve observers" in refused.value.message
        with anyio.fail_after(5):
            await detached.wait()
