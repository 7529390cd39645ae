"""The WebSocket carriage's fast path: a message goes from the caller when the socket takes
it; one the socket takes only part of is finished before anything else goes (the next
message, a pong), and the peer (wsproto, an independent implementation) reads whole frames."""

from __future__ import annotations

import socket

import anyio
import pytest
from websockets.protocol import State
from websockets.server import ServerProtocol
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, Ping, Pong

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.transport.outbox import Outbox
from ttyserve.transport.streams import SocketByteStream
from ttyserve.web.websocket import WebSocketTransport

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]


def carriage(sock: socket.socket) -> WebSocketTransport:
    return WebSocketTransport(SocketByteStream(sock), ServerProtocol(state=State.OPEN))


async def test_a_message_the_socket_takes_goes_from_the_caller(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    outbox = Outbox(carriage(ours))
    frame = encode_frame(FrameKind.STDOUT, 1, b"echo")
    other = encode_frame(FrameKind.STDOUT, 1, b"and more")
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        outbox.push([frame[:9], frame[9:], other])
        assert outbox.idle  # sent in the call: no writer task
        peer = Connection(ConnectionType.CLIENT)
        await anyio.wait_readable(theirs)
        peer.receive_data(theirs.recv(1 << 16))
        messages = [bytes(e.data) for e in peer.events() if isinstance(e, BytesMessage)]
    assert messages == [frame, other]  # one frame a message (section 8), as the writer cuts


async def test_a_message_sent_in_part_is_finished_before_the_next_message_and_a_pong(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    transport = carriage(ours)
    outbox = Outbox(transport)
    big = encode_frame(FrameKind.STDOUT, 1, bytes(range(256)) * 4096)  # 1 MiB: in part
    small = encode_frame(FrameKind.STDOUT, 1, b"after")
    peer = Connection(ConnectionType.CLIENT)
    theirs.sendall(peer.send(Ping(b"are you there")))
    messages: list[bytes] = []
    order: list[str] = []
    async with anyio.create_task_group() as tg:
        outbox.attach(tg)
        outbox.push([big[:9], big[9:]])
        assert not outbox.idle  # the socket took part: the rest waits, in order
        outbox.push([small])
        tg.start_soon(transport.receive, 1 << 16)  # the reader: it answers the ping
        await anyio.wait_all_tasks_blocked()
        message = b""
        while len(messages) < 2:
            await anyio.wait_readable(theirs)
            peer.receive_data(theirs.recv(1 << 20))
            for event in peer.events():
                if isinstance(event, BytesMessage):
                    message += event.data
                    if event.message_finished:
                        messages.append(message)
                        order.append("message")
                        message = b""
                elif isinstance(event, Pong):
                    order.append("pong")
        tg.cancel_scope.cancel()
    assert messages == [big, small]
    assert order.index("pong") >= 1  # never inside the first message


@pytest.mark.parametrize("fast", [True, False], ids=["from-the-caller", "writer-task"])
async def test_each_length_form_of_a_message_header_reads_whole_at_the_peer(
        pair: tuple[socket.socket, socket.socket], fast: bool) -> None:
    """A server's message goes out as its header beside the payload: the 7-bit, 16-bit and
    64-bit lengths at their edges, on either path, as an independent peer reads them."""
    ours, theirs = pair
    transport = carriage(ours)
    frames = [encode_frame(FrameKind.STDOUT, 1, (bytes(range(256)) * 1200)[:size - 9])
              for size in (9, 125, 126, 127, 65535, 65536, 65537, 300000)]
    peer = Connection(ConnectionType.CLIENT)
    received: list[bytes] = []

    async def read() -> None:
        message = b""
        while len(received) < len(frames):
            await anyio.wait_readable(theirs)
            peer.receive_data(theirs.recv(1 << 20))
            for event in peer.events():
                assert isinstance(event, BytesMessage)
                message += event.data
                if event.message_finished:
                    received.append(message)
                    message = b""

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        for frame in frames:
            if not (fast and transport.try_send([frame[:9], frame[9:]])):
                await transport.send_some([frame[:9], frame[9:]])
    assert [len(message) for message in received] == [len(frame) for frame in frames]
    assert received == frames
