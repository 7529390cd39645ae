"""`Connection` in process, resume included, with no server process: each link is a socket
pair the test cuts under the client, and the far side is a scripted double speaking frames.
A resume dials through the connection's own seam, the `redial` that `connect` hands it."""

from __future__ import annotations

import contextlib
import errno
import math
import socket
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from helpers import RawPeer

from ttyserve.backends.carrier import Carrier
from ttyserve.client import Connection
from ttyserve.client.session import Lost, Resumed, ResumeEvent, Session
from ttyserve.errors import ConnectionLost
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import (
    Attached,
    Error,
    Exit,
    Hello,
    Message,
    Offsets,
    Opened,
    Welcome,
    encode_message,
    parse_object,
)
from ttyserve.transport.background import beside
from ttyserve.transport.streams import SocketTransport, Transport, send_all

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
OUT, ERR = FrameKind.STDOUT, FrameKind.STDERR


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


class FarSide:
    """The server's end of every link the connection dials: a peer the test scripts."""

    def __init__(self) -> None:
        self._links, self._accepted = anyio.create_memory_object_stream[RawPeer](math.inf)
        self.peers: list[RawPeer] = []
        self.dials = 0
        self.refuse = False  # the server cannot be reached

    async def dial(self, stack: contextlib.AsyncExitStack,
                   within: float = math.inf) -> tuple[Transport, Carrier | None]:
        self.dials += 1
        if self.refuse:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "refused by the test")
        ours, theirs = socket.socketpair()
        near = SocketTransport(ours)
        stack.push_async_callback(near.aclose)
        self.peers.append(RawPeer(SocketTransport(theirs)))
        self._links.send_nowait(self.peers[-1])
        return near, None

    async def aclose(self) -> None:
        self._links.close()
        self._accepted.close()
        for peer in self.peers:
            await peer.transport.aclose()

    async def accept(self) -> RawPeer:
        """The next link dialled, its `welcome` sent: with the request that came first."""
        with anyio.fail_after(10):
            peer = await self._accepted.receive()
        assert (await request(peer))[1]["type"] == "hello"
        await peer.send(to_client(0, Welcome(protocol=1, server="far", max_frame=1 << 20)))
        return peer


async def request(peer: RawPeer) -> tuple[int, dict[str, Any]]:
    """The client's next control message (pings aside): its channel and members."""
    while True:
        with anyio.fail_after(10):
            frame = await peer.next_frame()
        assert frame is not None and frame.kind is FrameKind.CTRL_IN, frame
        message = parse_object(frame.payload)[1]
        if message["type"] != "ping":
            return frame.channel, message


def to_client(channel: int, message: Message) -> bytes:
    return encode_frame(FrameKind.CTRL_OUT, channel, encode_message(message))


class Produced:
    """What the far side's process wrote, in order: any attach is served from its offsets."""

    def __init__(self, chunks: list[tuple[FrameKind, bytes]]) -> None:
        self.chunks = chunks
        self.stdout = b"".join(data for kind, data in chunks if kind is OUT)
        self.stderr = b"".join(data for kind, data in chunks if kind is ERR)

    def frames(self, channel: int, since: Offsets) -> list[bytes]:
        """A frame per chunk (or what is left of it) past ``since``."""
        frames, at = [], {OUT: 0, ERR: 0}
        for kind, data in self.chunks:
            held = since.stdout if kind is OUT else since.stderr
            rest = data[max(0, held - at[kind]):]
            at[kind] += len(data)
            if rest:
                frames.append(encode_frame(kind, channel, rest))
        return frames


@contextlib.asynccontextmanager
async def connected(far: FarSide, **hello: Any) -> AsyncIterator[
        tuple[Connection, list[ResumeEvent]]]:
    """A connection on the far side's first link, as `connect` makes it; with what
    `on_resume` heard."""
    events: list[ResumeEvent] = []
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(far.aclose)
        transport, carrier = await far.dial(stack)
        connection = Connection(transport, Hello(protocol=1, **hello), carrier,
                                redial=far.dial, on_resume=events.append)
        await send_all(transport, connection.greeting())
        async with beside() as tasks:
            connection.start(tasks)
            yield connection, events


async def opened(far: FarSide, pty: bool = False) -> tuple[RawPeer, int]:
    """The first link's `open`, answered: a detachable session "s1" with a resume window."""
    peer = await far.accept()
    channel, asked = await request(peer)
    assert asked["type"] == "open" and asked["detachable"] and asked["detached_timeout"]
    await peer.send(to_client(channel, Opened(pid=7, session="s1", argv=["job"], pty=pty)))
    return peer, channel


async def reattached(far: FarSide, begins: Offsets, *,
                     pty: bool = False) -> tuple[RawPeer, int, Offsets]:
    """The next link's `attach`, answered as the ring allows (from ``begins``, or from what
    the client holds where the ring still has it): with the offsets the client asked for."""
    peer = await far.accept()
    channel, asked = await request(peer)
    assert asked["type"] == "attach" and asked["session"] == "s1" and asked["steal"] is True
    held = Offsets(**asked.get("offsets", {}))
    since = Offsets(stdout=max(held.stdout, begins.stdout),
                    stderr=max(held.stderr, begins.stderr))
    await peer.send(to_client(channel, Attached(session="s1", pid=7, pty=pty, dropped=0,
                                                offsets=since, role="writer")))
    return peer, channel, held


async def cut(peer: RawPeer, last: bytes = b"") -> None:
    """Send ``last`` and close the link under the client (no goodbye)."""
    if last:
        await peer.send(last)
    await peer.transport.aclose()


async def read_all(session: Session) -> tuple[bytes, bytes]:
    out: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    with anyio.fail_after(10):
        async for chunk in session:
            out[chunk.stream].append(chunk.data)
    return b"".join(out["stdout"]), b"".join(out["stderr"])


def half(frame: bytes) -> bytes:
    return frame[:len(frame) // 2]


async def test_output_resumes_at_its_exact_offsets_after_a_cut_mid_frame(
        anyio_backend: str) -> None:
    """The link is cut half-way through a frame: the client attaches again at the bytes it
    holds, so what the far side sends from there makes each stream whole, no byte twice."""
    produced = Produced([(OUT, b"one\n"), (ERR, b"err one\n"), (OUT, b"two\n" * 5000),
                         (ERR, b"err two\n"), (OUT, b"three\n")])
    far = FarSide()

    async def far_side() -> None:
        peer, channel = await opened(far)
        frames = produced.frames(channel, Offsets())
        await cut(peer, b"".join(frames[:2]) + half(frames[2]))
        peer, channel, held = await reattached(far, Offsets())
        assert held == Offsets(stdout=4, stderr=8)  # what it had whole, nothing of the half
        await peer.send(b"".join(produced.frames(channel, held))
                        + to_client(channel, Exit(code=3)))
        assert (await request(peer))[1] == {"type": "release", "session": "s1"}

    async with connected(far) as (conn, events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.spawn(["job"], pty=False, resume=30)
        stdout, stderr = await read_all(session)
    assert (stdout, stderr) == (produced.stdout, produced.stderr)
    assert session.status == Exit(code=3)
    assert session.offsets == Offsets(stdout=len(produced.stdout), stderr=len(produced.stderr))
    assert [type(e) for e in events] == [Lost, Resumed] and far.dials == 2
    assert isinstance(events[1], Resumed) and events[1].lost_bytes == 0
    assert session.lost_bytes == 0 and session.channel == 2


async def test_an_exit_cut_off_comes_once_on_the_next_link_and_ends_the_resume(
        anyio_backend: str) -> None:
    """Half an `exit`, then the cut: the exit comes whole on the next link, after the rest
    of the output, once; it is released there, and the link's loss then dials no more."""
    far = FarSide()

    async def far_side() -> None:
        peer, channel = await opened(far)
        await cut(peer, encode_frame(OUT, channel, b"all of it\n")
                  + half(to_client(channel, Exit(code=0))))
        peer, channel, held = await reattached(far, Offsets())
        assert held == Offsets(stdout=10)
        await peer.send(to_client(channel, Exit(code=0)))
        assert (await request(peer))[1] == {"type": "release", "session": "s1"}
        await cut(peer)

    async with connected(far) as (conn, events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.spawn(["job"], pty=False, resume=30)
        assert await read_all(session) == (b"all of it\n", b"")
        assert session.status == Exit(code=0)
        with pytest.raises(ConnectionLost):
            await conn.list_sessions()  # the connection ended with its link: nothing resumes
        assert await session.receive() is None and await session.wait() == Exit(code=0)
    assert [type(e) for e in events] == [Lost, Resumed] and far.dials == 2


async def test_output_the_ring_dropped_is_counted_in_lost_bytes(anyio_backend: str) -> None:
    """The far side's ring no longer holds what the client lacks: `attached.offsets` is past
    the client's, and the difference, on both streams, is what was lost."""
    produced = Produced([(OUT, b"a" * 100), (ERR, b"e" * 40), (OUT, b"b" * 400),
                         (ERR, b"f" * 60), (OUT, b"c" * 50)])
    ring_starts = Offsets(stdout=100 + 250, stderr=40 + 50)
    far = FarSide()

    async def far_side() -> None:
        peer, channel = await opened(far)
        await cut(peer, b"".join(produced.frames(channel, Offsets())[:2]))
        peer, channel, held = await reattached(far, ring_starts)
        assert held == Offsets(stdout=100, stderr=40)
        await peer.send(b"".join(produced.frames(channel, ring_starts))
                        + to_client(channel, Exit(code=0)))

    async with connected(far) as (conn, events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.spawn(["job"], pty=False, resume=30)
        stdout, stderr = await read_all(session)
    assert stdout == b"a" * 100 + b"b" * 150 + b"c" * 50
    assert stderr == b"e" * 40 + b"f" * 10
    assert session.lost_bytes == 300
    assert isinstance(events[-1], Resumed) and events[-1].lost_bytes == 300
    assert session.offsets == Offsets(stdout=550, stderr=100)


async def test_a_session_the_server_no_longer_has_ends_saying_so(anyio_backend: str) -> None:
    far = FarSide()

    async def far_side() -> None:
        peer, channel = await opened(far)
        await cut(peer, encode_frame(OUT, channel, b"before\n"))
        peer = await far.accept()
        channel, asked = await request(peer)
        assert asked["type"] == "attach"
        await peer.send(to_client(channel, Error(code="no_such_session", message="gone",
                                                 retriable=False)))

    async with connected(far) as (conn, events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.spawn(["job"], pty=False, resume=30)
        assert await session.receive() is not None
        with pytest.raises(ConnectionLost, match="could not resume: the server answered "
                                                 "no_such_session: gone"):
            await read_all(session)
    assert [type(e) for e in events] == [Lost]


async def test_a_session_whose_window_passes_ends_saying_so(anyio_backend: str) -> None:
    """The server cannot be reached again: the connection dials, backing off, until the
    session's window is over; then the session ends with why."""
    far = FarSide()

    async def far_side() -> None:
        peer, _channel = await opened(far)
        far.refuse = True
        await cut(peer)

    async with connected(far) as (conn, events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.spawn(["job"], pty=False, resume=1)
        started = anyio.current_time()
        with pytest.raises(ConnectionLost, match=r"could not resume within 1 s: .*refused"):
            await read_all(session)
        assert anyio.current_time() - started >= 0.9
    assert [type(e) for e in events] == [Lost] and far.dials >= 3


async def test_a_session_without_resume_ends_at_the_loss_and_one_with_resume_goes_on(
        anyio_backend: str) -> None:
    far = FarSide()

    async def far_side() -> None:
        peer = await far.accept()
        for session_id in ("plain", "s1"):
            channel, _asked = await request(peer)
            await peer.send(to_client(channel, Opened(pid=channel, session=session_id)))
        await cut(peer)
        peer, channel, _held = await reattached(far, Offsets())
        await peer.send(encode_frame(OUT, channel, b"on\n") + to_client(channel, Exit(code=0)))

    async with connected(far, multiplex=True) as (conn, events), anyio.create_task_group(
            ) as tg:
        tg.start_soon(far_side)
        plain = await conn.spawn(["job"], pty=False, detachable=True)
        resumed = await conn.spawn(["job"], pty=False, resume=30)
        with pytest.raises(ConnectionLost, match="the server closed the connection"):
            await read_all(plain)
        assert await read_all(resumed) == (b"on\n", b"")
    assert [(type(e), e.session) for e in events] == [(Lost, resumed), (Resumed, resumed)]


@pytest.mark.parametrize("pty", [False, True])
async def test_a_pipe_sessions_eof_is_said_again_on_the_next_link(anyio_backend: str,
                                                                  pty: bool) -> None:
    """It may have been lost with the link; a PTY's is not (a second end-of-file character
    could end its shell)."""
    far = FarSide()
    said_again: list[dict[str, Any]] = []

    async def far_side() -> None:
        peer, channel = await opened(far, pty=pty)
        assert await request(peer) == (channel, {"type": "eof"})
        await cut(peer)
        peer, channel, _held = await reattached(far, Offsets(), pty=pty)
        await peer.send(to_client(channel, Exit(code=0)))
        while (message := await request(peer))[1]["type"] != "release":
            said_again.append(message[1])

    async with connected(far) as (conn, _events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.spawn(["job"], pty=pty, resume=30)
        await session.eof()
        assert await session.wait() == Exit(code=0)
    assert said_again == ([] if pty else [{"type": "eof"}])


async def test_an_observer_resumes_as_an_observer_without_steal(anyio_backend: str) -> None:
    far = FarSide()

    async def far_side() -> None:
        for link, since in enumerate((Offsets(), Offsets(stdout=6))):
            peer = await far.accept()
            channel, asked = await request(peer)
            assert asked["type"] == "attach" and asked["role"] == "observer"
            held = Offsets(**(asked.get("offsets") or {}))
            assert asked.get("steal", False) is False and held == since
            await peer.send(to_client(channel, Attached(session="s1", pid=7, pty=True,
                                                        dropped=0, offsets=since,
                                                        role="observer")))
            if link == 0:
                await cut(peer, encode_frame(OUT, channel, b"first\n"))
        await peer.send(encode_frame(OUT, channel, b"then\n") + to_client(channel, Exit(code=0)))

    async with connected(far) as (conn, events), anyio.create_task_group() as tg:
        tg.start_soon(far_side)
        session = await conn.attach("s1", role="observer", resume=30)
        assert await read_all(session) == (b"first\nthen\n", b"")
    assert [type(e) for e in events] == [Lost, Resumed] and session.role == "observer"
