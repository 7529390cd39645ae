"""The transports' contract at their edge: a peer that is gone is `BrokenResourceError` on
send, whatever carries the bytes (here TLS, over a real socket pair); TCP has keepalive."""

from __future__ import annotations

import socket
import ssl

import anyio
import anyio.abc
import pytest
import trustme
from anyio.streams.tls import TLSStream

from ttyserve.defaults import TCP_KEEPALIVE_IDLE
from ttyserve.server.sockets import bind_tcp
from ttyserve.transport.streams import StreamTransport

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]


async def test_a_send_to_a_tls_peer_that_closed_is_broken() -> None:
    """A TLS send to a peer that has gone fails with anyio's EndOfStream where the stream
    takes a close without close_notify as an end (as our client's does); for the writers
    (the outbox) a peer that is gone is BrokenResourceError, always."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    ours, theirs = socket.socketpair()
    async with anyio.create_task_group() as tg:
        wrapped: list[TLSStream] = []

        async def wrap_ours() -> None:
            wrapped.append(await TLSStream.wrap(  # as the client dials (dial.py)
                await anyio.abc.SocketStream.from_socket(ours), hostname="localhost",
                ssl_context=client_context, standard_compatible=False))

        tg.start_soon(wrap_ours)
        peer = await TLSStream.wrap(await anyio.abc.SocketStream.from_socket(theirs),
                                    server_side=True, ssl_context=server_context)
    transport = StreamTransport(wrapped[0])
    await peer.transport_stream.aclose()  # gone, with no close_notify (a server killed)
    with pytest.raises(anyio.EndOfStream):
        await transport.receive(1024)
    with pytest.raises(anyio.BrokenResourceError):
        await transport.send_some([b"after the end"])
    await transport.aclose()


async def test_tcp_connections_have_keepalive() -> None:
    """Accepted connections inherit keepalive from the listener, as the server's do."""
    (listener,) = bind_tcp("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()[:2]):
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert accepted.getsockopt(socket.IPPROTO_TCP,
                                       socket.TCP_KEEPIDLE) == TCP_KEEPALIVE_IDLE
