"""The outbox, a connection's one writer: order, the bound on what waits, and the tellings
of room and breakage, over a real socket pair."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import anyio
import pytest

from ttyserve.transport.outbox import Outbox
from ttyserve.transport.streams import SocketTransport

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


async def read_all(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        await anyio.wait_readable(sock)
        data += sock.recv(1 << 20)
    return data


async def test_what_the_socket_does_not_take_waits_in_order_and_room_is_told(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    rooms: list[bool] = []
    outbox = Outbox(SocketTransport(ours), on_room=lambda: rooms.append(outbox.has_room),
                    limit=64 * 1024)
    chunks = [bytes([i]) * 100_000 for i in range(20)]  # 2 MB: far more than the socket
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        for chunk in chunks:
            outbox.push([chunk])  # never waits
        assert not outbox.has_room and not rooms
        received = await read_all(theirs, sum(map(len, chunks)))
        outbox.close()
        await outbox.wait_done()
    assert received == b"".join(chunks)
    assert rooms == [True]  # once, when the queue fell back to the limit


async def test_a_producer_that_waits_for_room_goes_on_as_the_reader_reads(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    outbox = Outbox(SocketTransport(ours), limit=1024)
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        outbox.push([b"x" * 1_000_000])
        assert not outbox.has_room  # nobody reads: a producer would wait
        tg.start_soon(read_all, theirs, 1_000_000)
        await outbox.wait_for_room()
        outbox.close()
        await outbox.wait_done()


async def test_a_broken_connection_is_told_once_and_refuses_more(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    broken: list[bool] = []
    outbox = Outbox(SocketTransport(ours), on_broken=lambda: broken.append(True))
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        theirs.close()
        with pytest.raises(anyio.BrokenResourceError):
            for _ in range(100):
                outbox.push([b"y" * 100_000])
                await anyio.sleep(0)
        with pytest.raises(anyio.BrokenResourceError):
            outbox.push([b"z"])
        await outbox.wait_done()  # done at once: nothing more goes anywhere
        assert outbox.has_room  # so no producer waits on it
    assert broken == [True]
