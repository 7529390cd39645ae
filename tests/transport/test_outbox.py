"""The outbox, a connection's one writer: order, the bound on what waits, and the tellings
of room and breakage, over a real socket pair."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import anyio
import pytest

from ttyserve.transport.outbox import Outbox
from ttyserve.transport.splice import CAN_SPLICE, buffered
from ttyserve.transport.streams import SocketTransport

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


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


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    try:
        yield read, write
    finally:
        os.close(read)
        os.close(write)


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not CAN_SPLICE, reason="splice(2) is Linux's")
async def test_a_frame_the_socket_cannot_take_stays_in_its_pipe_until_it_is_spliced(
        pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]) -> None:
    """The socket is full: the header waits, the payload stays in the pipe (not read by us),
    no room is counted meanwhile, and all of it goes out in order once the reader reads."""
    ours, theirs = pair
    read, write = pipe
    rooms: list[bool] = []
    outbox = Outbox(SocketTransport(ours), on_room=lambda: rooms.append(outbox.has_room))
    fill(ours)
    payload = bytes(range(256)) * 200
    os.write(write, payload + b"next")
    descriptors = open_descriptors()
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        outbox.push_from_pipe([b"HEADER"], read, len(payload))
        assert buffered(read) == len(payload) + 4  # in flight: still in the pipe
        assert not outbox.has_room and not rooms  # its pump must not read the pipe now
        assert open_descriptors() == descriptors + 1  # the pipe's, held by the queue
        received = await read_all_until(theirs, b"HEADER" + payload)
        outbox.close()
        await outbox.wait_done()
    assert received.endswith(b"HEADER" + payload)
    assert received.strip(b"f") == b"HEADER" + payload  # nothing between, nothing lost
    assert rooms == [True]  # told once the pipe's bytes went
    assert os.read(read, 100) == b"next"  # not one byte of what follows was taken
    assert open_descriptors() == descriptors


@pytest.mark.skipif(not CAN_SPLICE, reason="splice(2) is Linux's")
async def test_a_frame_the_socket_takes_goes_whole_by_splice(
        pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]) -> None:
    ours, theirs = pair
    read, write = pipe
    outbox = Outbox(SocketTransport(ours))
    os.write(write, b"p" * 30_000 + b"next")
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        outbox.push_from_pipe([b"HEADER"], read, 30_000)
        assert outbox.idle and outbox.has_room  # nothing queued
        assert await read_all(theirs, 30_006) == b"HEADER" + b"p" * 30_000
        outbox.close()
    assert os.read(read, 100) == b"next"


@pytest.mark.skipif(not CAN_SPLICE, reason="splice(2) is Linux's")
async def test_a_broken_connection_takes_its_frames_bytes_out_of_the_pipe(
        pair: tuple[socket.socket, socket.socket], pipe: tuple[int, int]) -> None:
    """In flight when the connection breaks: dropped from the pipe (never framed again by
    its pump as new output), and the queue's descriptor closed."""
    ours, theirs = pair
    read, write = pipe
    outbox = Outbox(SocketTransport(ours))
    filled = fill(ours)
    os.write(write, b"p" * 10_000 + b"next")
    descriptors = open_descriptors()
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        outbox.push_from_pipe([b"HEADER"], read, 10_000)
        assert buffered(read) == 10_004
        outbox.abort()
        assert os.read(read, 100) == b"next"
        # The writer task, woken as the socket drains, sends nothing of the dropped frame.
        assert await read_all(theirs, filled) == b"f" * filled
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(BlockingIOError):
            theirs.recv(1)
    assert open_descriptors() == descriptors
    with pytest.raises(anyio.BrokenResourceError):
        outbox.push_from_pipe([b"HEADER"], read, 0)


async def read_all_until(sock: socket.socket, tail: bytes) -> bytes:
    data = b""
    while not data.endswith(tail):
        await anyio.wait_readable(sock)
        data += sock.recv(1 << 20)
    return data


def fill(sock: socket.socket) -> int:
    """Send until the socket takes no more; how much it took."""
    sent = 0
    while True:
        try:
            sent += sock.send(b"f" * 4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return sent
