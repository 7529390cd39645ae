"""Bind the listen addresses: Unix sockets private to this user, TCP on any port."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterator

from ..addresses import Address
from ..errors import ListenError
from ..runtime import default_socket_path
from ..transport.streams import keep_alive
from .lease import SocketLease

BACKLOG = 1024


def _clear_stale_socket(path: str) -> None:
    """Remove what a dead server left at ``path``; the caller holds the socket's lease."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenError(f"{path} exists and is not a socket")
    os.unlink(path)


def _private_directory(directory: str) -> None:
    """Create the default socket's directory 0700, or check that ours is."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ListenError(
                f"{directory} must be a directory owned by uid {os.getuid()} with mode 0700"
            ) from None
    except OSError as exc:
        raise ListenError(f"cannot create {directory}: {exc.strerror}") from exc


def bind_unix(path: str, leases: list[SocketLease]) -> socket.socket:
    directory = os.path.dirname(path)
    if path == default_socket_path() or not os.path.isdir(directory):
        _private_directory(directory)
    try:
        leases.append(SocketLease(path))
    except OSError as exc:
        raise ListenError(f"cannot lock {path}.lock: {exc.strerror}") from exc
    _clear_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket is born 0600: no window where others can connect
    try:
        sock.bind(path)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on unix:{path}: {exc.strerror}") from exc
    finally:
        os.umask(old_umask)
    return sock


def bind_tcp(host: str, port: int, named: str = "") -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to; ListenError names the
    address as given (``named``: `ws:HOST:PORT` say, else `tcp:HOST:PORT`)."""
    named = named or f"tcp:{host}:{port}"
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot resolve {host!r}: {exc.strerror}") from exc
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # one port for every family of this address
                sockaddr = (sockaddr[0], sockets[0].getsockname()[1], *sockaddr[2:])
            sock.bind(sockaddr)
            sock.listen(BACKLOG)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)  # (every accepted connection inherits it)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ListenError(f"cannot listen on {named}: {exc.strerror}") from exc
    return sockets


def bound_address(sock: socket.socket, address: Address) -> Address:
    """The address as bound: the real port when 0 was asked for."""
    if address.scheme == "unix":
        return address
    host, port = sock.getsockname()[:2]
    return Address(address.scheme, host=host, port=port)


def open_listeners(
    addresses: list[Address], leases: list[SocketLease] | None = None,
) -> list[tuple[Address, socket.socket]]:
    """Bind every address (all or none); the sockets are non-blocking and listening.

    Unix sockets are leased first (LeaseError names a live holder); the leases
    are appended to ``leases`` and must be released when serving ends.
    """
    held = leases if leases is not None else []
    bound: list[tuple[Address, socket.socket]] = []
    try:
        for address in addresses:
            if address.scheme == "unix":
                bound.append((address, bind_unix(address.path, held)))
            else:
                bound.extend((address, s) for s in bind_tcp(address.host, address.port,
                                                            str(address)))
    except BaseException:
        for _, sock in bound:
            sock.close()
        if leases is None:
            for lease in held:
                lease.release()
        raise
    for _, sock in bound:
        sock.setblocking(False)
    return [(bound_address(sock, address), sock) for address, sock in bound]


def remove_socket_file(address: Address) -> None:
    if address.scheme == "unix":
        with contextlib.suppress(OSError):
            os.unlink(address.path)


@contextlib.contextmanager
def listening(addresses: list[Address]) -> Iterator[list[tuple[Address, socket.socket]]]:
    """`open_listeners` for a program that serves in process: on the way out the sockets
    are closed, the Unix ones' files removed and their leases released, as `serve` does."""
    leases: list[SocketLease] = []
    listeners = open_listeners(addresses, leases)
    try:
        yield listeners
    finally:
        for address, sock in listeners:
            sock.close()
            remove_socket_file(address)
        for lease in leases:
            lease.release()


__all__ = ["SocketLease", "listening", "open_listeners", "remove_socket_file"]
