"""Reaching a server: an address becomes a connected transport (Unix, TCP, TLS, WebSocket)."""

from __future__ import annotations

import os
import socket
import ssl

import anyio
import anyio.abc

from ..addresses import Address
from ..transport.streams import (
    SocketByteStream,
    SocketTransport,
    StreamTransport,
    Transport,
    keep_alive,
)


async def _connect_socket(family: int, sockaddr: object) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        try:
            sock.connect(sockaddr)  # type: ignore[arg-type]
        except BlockingIOError:
            await anyio.wait_writable(sock)
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error)) from None
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)
        return sock
    except BaseException:
        sock.close()
        raise


async def open_transport(address: Address, tls: ssl.SSLContext | None = None) -> Transport:
    """Connect to ``address``; `tls:` and `wss:` servers are verified with ``tls`` (or the
    system's CAs), `ws:` and `wss:` ones reached through a WebSocket upgrade at /ws."""
    if address.scheme == "unix":
        return SocketTransport(await _connect_socket(socket.AF_UNIX, address.path))
    if address.encrypted or address.web:
        stream: anyio.abc.ByteStream
        try:
            if address.encrypted:
                stream = await anyio.connect_tcp(
                    address.host, address.port, tls=True,
                    ssl_context=tls or ssl.create_default_context(),
                    tls_standard_compatible=False)
            else:
                stream = SocketByteStream(await _connect_tcp(address.host, address.port))
        except (anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise ConnectionResetError(f"the TLS handshake was cut off: {exc}") from exc
        if not address.web:
            return StreamTransport(stream)
        try:
            from ..web.websocket import open_client  # h11 and websockets only for ws: and wss:

            return await open_client(stream, address.netloc)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            raise
    return SocketTransport(await _connect_tcp(address.host, address.port))


async def _connect_tcp(host: str, port: int) -> socket.socket:
    """The first of ``host``'s addresses that takes a connection."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, _type, _proto, _name, sockaddr in infos:
        try:
            return await _connect_socket(family, sockaddr)
        except OSError as exc:
            error = exc
    raise error or OSError(f"cannot resolve {host}")
