"""Byte transports under the protocol: a raw non-blocking socket, a pair of pipes (`serve
--stdio` and the carriers that reach it), or an anyio stream (TLS).

The socket transport writes with sendmsg(), so a frame's header and payload
go out in one system call without being joined first, and lets a caller try a
send without waiting (the fast path of `Outbox`). Cancelling a wait here never
loses or splits data: bytes are either in the kernel or still the caller's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import anyio
import anyio.abc

from ..defaults import (
    DRAIN_RECEIVE,
    TCP_KEEPALIVE_COUNT,
    TCP_KEEPALIVE_IDLE,
    TCP_KEEPALIVE_INTERVAL,
)
from ..errors import RemoteProtocolError
from .readiness import ReadableService
from .splice import CAN_SPLICE, splice_some

Buffer = bytes | bytearray | memoryview
MAX_IOVECS = 512  # buffers per sendmsg(), well under IOV_MAX (1024)


class TaskNeeded(Exception):
    """`receive_nowait` cannot go on without waiting (a WebSocket's pong to send, its end):
    the reader task is to call `receive`."""


class ReadsNowait(Protocol):
    """A transport the server reads from the loop's readiness callback (one whose
    `reads_nowait` is true)."""

    @property
    def pending(self) -> bool:
        """Whether `receive_nowait` has something without the descriptor saying so (bytes
        received and parsed already): the socket's readiness would not tell."""
        ...

    def fileno(self) -> int: ...

    def receive_nowait(self, max_bytes: int) -> bytes | None:
        """What has arrived, up to ``max_bytes``; None when nothing has. Raises as `receive`,
        or TaskNeeded."""
        ...


class Transport(Protocol):
    """What a connection needs from the bytes underneath it."""

    async def receive(self, max_bytes: int) -> bytes:
        """Raises anyio.EndOfStream at the peer's EOF, anyio.BrokenResourceError on errors,
        RemoteProtocolError when the peer misused the carriage itself (a WebSocket text
        message, say)."""
        ...

    def try_send(self, buffers: Sequence[Buffer]) -> int:
        """Send what fits now without waiting; the number of bytes sent (maybe 0)."""
        ...

    async def send_some(self, buffers: Sequence[Buffer]) -> int:
        """Wait until at least one byte was sent; the number of bytes sent."""
        ...

    async def send_eof(self, protocol_error: bool = False) -> None:
        """Half-close (a WebSocket says 1002 when ``protocol_error``); raises
        NotImplementedError where the transport cannot (TLS)."""
        ...

    async def aclose(self) -> None:
        """Release the connection; never cancelled half-way."""
        ...

    def fileno(self) -> int:
        """The descriptor the peer's bytes arrive on (under TLS and WebSocket too), -1 when
        there is none: a poll of it tells a peer we stopped reading from a silent one."""
        ...


def unsent(buffers: Sequence[Buffer], sent: int) -> list[Buffer]:
    """What is left of ``buffers`` after their first ``sent`` bytes went out."""
    rest: list[Buffer] = []
    for buffer in buffers:
        size = len(buffer)
        if sent >= size:
            sent -= size
        elif sent:
            rest.append(memoryview(buffer)[sent:])
            sent = 0
        else:
            rest.append(buffer)
    return rest


def _broken(exc: OSError) -> anyio.BrokenResourceError:
    error = anyio.BrokenResourceError(str(exc))
    error.__cause__ = exc
    return error


def _read_nowait(read: Callable[..., bytes], *args: int) -> bytes | None:
    """What ``read(*args)`` returns now; None when nothing has arrived. Raises as
    `receive`."""
    try:
        data = read(*args)
    except BlockingIOError:
        return None
    except OSError as exc:
        raise _broken(exc) from exc
    if not data:
        raise anyio.EndOfStream
    return data


def keep_alive(sock: socket.socket) -> None:
    """TCP keepalive: the kernel probes a silent peer, so a connection a NAT or a sleeping
    laptop dropped is found dead within minutes, not hours (section 10). Accepted sockets
    inherit it from their listener."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)
    for option, value in ((idle, TCP_KEEPALIVE_IDLE),
                          (getattr(socket, "TCP_KEEPINTVL", None), TCP_KEEPALIVE_INTERVAL),
                          (getattr(socket, "TCP_KEEPCNT", None), TCP_KEEPALIVE_COUNT)):
        if option is not None:  # (macOS names the first TCP_KEEPALIVE; others may lack some)
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class SocketTransport:
    """A connected, non-blocking stream socket (Unix or TCP)."""

    reads_nowait = True  # (ReadsNowait)
    pending = False  # (nothing is received ahead)

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        # A pipe's bytes may be spliced in (splice.py): on Unix sockets only, where it
        # measured faster than a read and a send; over TCP it measured slower.
        self.splices = CAN_SPLICE and sock.family == socket.AF_UNIX
        self._closed = False
        self._drained = False  # the last receive emptied the socket buffer
        self._waits = 0  # tasks waiting on the socket now (its close must tell them)

    async def receive(self, max_bytes: int) -> bytes:
        self._waits += 1
        try:
            if self._drained:  # don't ask for what is not there: wait first, spare the EAGAIN
                await anyio.wait_readable(self.sock)
            while (data := self.receive_nowait(max_bytes)) is None:
                await anyio.wait_readable(self.sock)
        finally:
            self._waits -= 1
        self._drained = len(data) < max_bytes
        return data

    def receive_nowait(self, max_bytes: int) -> bytes | None:
        """What has arrived, up to ``max_bytes``; None when nothing has. Raises as `receive`."""
        return _read_nowait(self.sock.recv, max_bytes)

    def fileno(self) -> int:
        """The descriptor to watch for readiness (readiness.py); -1 once closed."""
        return -1 if self._closed else self.sock.fileno()

    def try_send(self, buffers: Sequence[Buffer]) -> int:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            return self.sock.sendmsg(buffers[:MAX_IOVECS])
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise _broken(exc) from exc

    def try_splice(self, pipe: int, size: int) -> int:
        """Move up to ``size`` bytes of ``pipe`` (all in it now) into the socket without
        waiting (only where `splices`); how many it took."""
        if self._closed:
            raise anyio.ClosedResourceError
        return splice_some(pipe, self.sock.fileno(), size)

    async def wait_writable(self) -> None:
        """Until the socket may take more (for `try_splice`)."""
        self._waits += 1
        try:
            await anyio.wait_writable(self.sock)
        finally:
            self._waits -= 1

    async def send_some(self, buffers: Sequence[Buffer]) -> int:
        while not (sent := self.try_send(buffers)):
            self._waits += 1
            try:
                await anyio.wait_writable(self.sock)
            finally:
                self._waits -= 1
        return sent

    async def send_eof(self, protocol_error: bool = False) -> None:
        self.send_eof_nowait()

    def send_eof_nowait(self) -> None:
        """`send_eof`, which waits for nothing here."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise _broken(exc) from exc

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._waits:  # a task waits on the socket: it is told it closed
                anyio.notify_closing(self.sock)
            self.sock.close()


class PipeTransport:
    """Bytes in on one descriptor, out on another: pipes, a terminal, or a socket on both.

    Two distinct descriptors, owned and closed by the transport. Both are made
    non-blocking, and put back as they were when closed: their files may be shared
    (the stdin and stdout of `serve --stdio`).
    """

    reads_nowait = True  # (ReadsNowait)
    pending = False  # (nothing is received ahead)

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd: int | None = read_fd
        self.write_fd: int | None = write_fd
        self._blocking = {fd: os.get_blocking(fd) for fd in (read_fd, write_fd)}
        # One socket or terminal on both: its blocking mode is shared, so it is put back
        # only when the second descriptor is closed (else the other side would block).
        self._one_file = os.path.samestat(os.fstat(read_fd), os.fstat(write_fd))
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)

    async def receive(self, max_bytes: int) -> bytes:
        while (data := self.receive_nowait(max_bytes)) is None:
            assert self.read_fd is not None
            await anyio.wait_readable(self.read_fd)
        return data

    def receive_nowait(self, max_bytes: int) -> bytes | None:
        """What has arrived, up to ``max_bytes``; None when nothing has. Raises as `receive`."""
        fd = self.read_fd
        if fd is None:
            raise anyio.ClosedResourceError
        return _read_nowait(os.read, fd, max_bytes)

    def fileno(self) -> int:
        """The read side's descriptor, to watch for readiness; -1 once closed."""
        return -1 if self.read_fd is None else self.read_fd

    def try_send(self, buffers: Sequence[Buffer]) -> int:
        if self.write_fd is None:
            raise anyio.ClosedResourceError
        try:
            return os.writev(self.write_fd, buffers[:MAX_IOVECS])
        except BlockingIOError:
            return 0
        except OSError as exc:  # EPIPE: the reader is gone
            raise _broken(exc) from exc

    async def send_some(self, buffers: Sequence[Buffer]) -> int:
        while not (sent := self.try_send(buffers)):
            assert self.write_fd is not None
            await anyio.wait_writable(self.write_fd)
        return sent

    async def send_eof(self, protocol_error: bool = False) -> None:
        self.send_eof_nowait()

    def send_eof_nowait(self) -> None:
        """`send_eof`, which waits for nothing here."""
        fd, self.write_fd = self.write_fd, None
        if fd is None:
            return
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):  # the read side may share the socket
                with socket.socket(fileno=os.dup(fd)) as sock:
                    sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise _broken(exc) from exc
        finally:
            self._release(fd, self.read_fd)

    def _release(self, fd: int, other: int | None) -> None:
        anyio.notify_closing(fd)
        if not (self._one_file and other is not None):
            with contextlib.suppress(OSError):
                os.set_blocking(fd, self._blocking[fd])
        os.close(fd)

    async def aclose(self) -> None:
        read_fd, write_fd = self.read_fd, self.write_fd
        self.read_fd = self.write_fd = None
        if read_fd is not None:
            self._release(read_fd, write_fd)
        if write_fd is not None:
            self._release(write_fd, None)


class SocketByteStream(anyio.abc.ByteStream):
    """An anyio byte stream straight on a non-blocking socket (our SocketTransport): what
    the WebSocket carriage and h11 run on for plain `ws:`. Unlike anyio's asyncio stream,
    it does not stop at 64 KiB of write buffer and wait for it to drain, once per message."""

    def __init__(self, sock: socket.socket) -> None:
        self.transport = SocketTransport(sock)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.transport.receive(max_bytes)

    async def send(self, item: bytes) -> None:
        """All of ``item``. Cut short (cancelled) after part of it went out, the stream is
        shut down: a peer must never read half a message followed by the next one."""
        view = memoryview(item)
        try:
            while view:
                view = view[await self.transport.send_some([view]):]
        except BaseException:
            if 0 < len(view) < len(item):
                with contextlib.suppress(OSError):
                    self.transport.sock.shutdown(socket.SHUT_RDWR)
            raise

    async def send_eof(self) -> None:
        await self.transport.send_eof()

    async def aclose(self) -> None:
        await self.transport.aclose()


class StreamTransport:
    """Any anyio byte stream (used for TLS): no fast path, no half-close."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self.stream = stream

    def fileno(self) -> int:
        """The socket under the stream (whose unread bytes show a peer is alive); -1 when
        there is none."""
        raw = self.stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        return raw.fileno() if raw is not None else -1

    async def receive(self, max_bytes: int) -> bytes:
        return await self.stream.receive(max_bytes)

    def try_send(self, buffers: Sequence[Buffer]) -> int:
        return 0

    async def send_some(self, buffers: Sequence[Buffer]) -> int:
        data = b"".join(buffers)
        try:
            await self.stream.send(data)
        except anyio.EndOfStream:  # TLS that the peer closed: the send is broken
            raise anyio.BrokenResourceError("the peer closed the connection") from None
        return len(data)

    async def send_eof(self, protocol_error: bool = False) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):  # never cut short half-way
            await self.stream.aclose()


class Closable(Protocol):
    """What a graceful close needs: a half-close and reads (a Transport, an anyio stream)."""

    async def send_eof(self) -> None: ...

    async def receive(self, max_bytes: int) -> bytes: ...


_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError,
         RemoteProtocolError)


async def close_gracefully(stream: Closable, timeout: float,
                           send_eof: Callable[[], Awaitable[None]] | None = None) -> None:
    """Our EOF (``send_eof``, else the stream's), then the peer's bytes read and dropped until
    its EOF, for ``timeout`` seconds at most: closing on unread bytes would reset the
    connection and could destroy what the peer has not read yet. (TLS cannot half-close:
    there we only drain.) A socket or pipe is drained from the loop's readiness callback.
    Raises nothing."""
    try:
        try:
            await (send_eof or stream.send_eof)()
        except NotImplementedError:
            pass
        if isinstance(stream, SocketTransport | PipeTransport) and await ReadableService(
                ).serve(stream.fileno(), functools.partial(_discard, stream),
                        anyio.current_time() + timeout):
            return
        with anyio.move_on_after(timeout):
            while True:
                await stream.receive(DRAIN_RECEIVE)
    except _GONE:
        pass


def _discard(stream: SocketTransport | PipeTransport) -> bool:
    """Read and drop what arrived; False at the peer's EOF (or an error)."""
    try:
        stream.receive_nowait(DRAIN_RECEIVE)
    except _GONE:
        return False
    return True


async def send_all(transport: Transport, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[await transport.send_some([view]):]
