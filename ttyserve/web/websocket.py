"""The protocol's byte stream carried in WebSocket binary messages (protocol section 8), on
the sans-I/O core of `websockets`.

One more transport under the same core: what it receives is frame bytes, what
it is given to send goes out as binary messages that hold whole frames (a
frame never spans two messages). A text message, or a message that ends inside
a frame, is the carriage misused: `receive` raises RemoteProtocolError, and the
connection is then closed with code 1002.

`websockets` rather than wsproto: it masks in C and parses a frame with one copy of
its payload, where wsproto took 10x the time to receive a 128 KiB message and 3x
for a keystroke's (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Sequence

import anyio
import anyio.abc
from websockets.client import ClientProtocol
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import Protocol, Side, State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ..defaults import CLIENT_NAME, WEBSOCKET_MAX_MESSAGE, WEBSOCKET_RECEIVE
from ..errors import RemoteProtocolError
from ..protocol.frames import FrameTracker
from ..transport.streams import Buffer, SocketByteStream, SocketTransport, TaskNeeded, unsent

SUBPROTOCOL = Subprotocol("ttyserve.v1")
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def _broken(exc: BaseException) -> anyio.BrokenResourceError:
    error = anyio.BrokenResourceError(str(exc))
    error.__cause__ = exc
    return error


def binary_header(size: int) -> bytes:
    """The header of a final, unmasked binary message of ``size`` bytes (RFC 6455 5.2): a
    server's message, whose payload then goes out beside it, never copied into it."""
    if size < 126:
        return bytes((0x82, size))
    if size < 1 << 16:
        return struct.pack("!BBH", 0x82, 126, size)
    return struct.pack("!BBQ", 0x82, 127, size)


class WebSocketTransport:
    """A `Transport` over an established WebSocket (either side): whole frames per message."""

    def __init__(self, stream: anyio.abc.ByteStream, ws: Protocol, received: bytes = b"",
                 frames: Sequence[Frame] = ()) -> None:
        self._stream = stream
        self._ws = ws
        # plain ws: on our own socket, so a message may go from the caller (`try_send`)
        self._socket = stream.transport if isinstance(stream, SocketByteStream) else None
        # A server's messages are unmasked and we negotiate no extension: on its own socket
        # a message goes out as its header beside the payload (`binary_header`), uncopied.
        self._beside: SocketTransport | None = self._socket if ws.side is Side.SERVER else None
        self._unsent: list[Buffer] = []  # the rest of a message `try_send` began
        self._answers: list[bytes] = []  # pongs and the like `receive_nowait` left to send
        self._covered = 0  # bytes given to `try_send` that message holds (see there)
        self._send_lock = anyio.Lock()  # the reader answers pings while the writer sends
        self._incoming = FrameTracker()
        self._outgoing = FrameTracker()
        self._tail = bytearray()  # what was given to send past the last whole frame
        self._ready: list[bytes] = []
        self._ended = False
        self._misuse: RemoteProtocolError | None = None
        self._closing: bytes | None = None  # the framing broke: the close the library chose,
        # held back so that the core's `protocol_error` goes out before it
        # What came with the handshake (frames after its answer, bytes after its request)
        # is taken now: it is `pending`, which the socket's readiness will not tell.
        if received:
            ws.receive_data(received)
        self._handle_events(frames)
        self._answers += ws.data_to_send()

    def fileno(self) -> int:
        """The socket under the WebSocket (whose unread bytes show a peer is alive); -1
        when there is none."""
        inner = getattr(self._stream, "transport", None)  # a SocketByteStream: plain ws:
        if inner is not None:
            return int(inner.fileno())
        raw = self._stream.extra(anyio.abc.SocketAttribute.raw_socket, None)  # wss:
        return raw.fileno() if raw is not None else -1

    async def receive(self, max_bytes: int) -> bytes:
        """Frame bytes from the next binary messages.

        Raises anyio.EndOfStream once the peer closed the WebSocket,
        anyio.BrokenResourceError when the connection broke, and
        RemoteProtocolError for a text message or a message that ends inside a frame.
        """
        while not self._ready:
            if self._answers:  # what `receive_nowait` met: a pong, the answer to a close
                await self._flush()
            if self._misuse is not None:
                misuse, self._misuse = self._misuse, None
                raise misuse  # once; after it, the stream has ended
            if self._ended:
                raise anyio.EndOfStream
            await self._take_events()
            if not self._ready and not self._ended:
                try:
                    data = await self._stream.receive(WEBSOCKET_RECEIVE)
                except anyio.EndOfStream:
                    self._ws.receive_eof()  # it learns of the end (not a clean close)
                    self._ended = True
                    continue
                except _GONE as exc:
                    raise _broken(exc) from exc
                self._ws.receive_data(data)
        return self._take_ready(max_bytes)

    @property
    def pending(self) -> bool:
        """Whether `receive_nowait` has something the socket's readiness would not tell."""
        return bool(self._ready or self._answers or self._ended)

    @property
    def reads_nowait(self) -> bool:
        """Whether `receive_nowait` can read (plain ws:; under TLS, bytes may wait in the
        TLS layer with nothing on the socket to say so)."""
        return self._socket is not None

    def receive_nowait(self, max_bytes: int) -> bytes | None:
        """`receive` without waiting, from the loop's readiness callback: frame bytes, or
        None when none have arrived. Raises TaskNeeded where only `receive` can go on:
        something is to be sent (a pong, a close), or the stream ended or was misused."""
        sock = self._socket
        while not self._ready:
            if sock is None or self._misuse is not None or self._ended or self._answers:
                raise TaskNeeded
            try:
                data = sock.receive_nowait(WEBSOCKET_RECEIVE)
            except anyio.EndOfStream:
                self._ws.receive_eof()
                self._ended = True
                raise TaskNeeded from None
            if data is None:
                return None
            self._ws.receive_data(data)
            self._handle_events()
            self._answers += self._ws.data_to_send()
        return self._take_ready(max_bytes)

    def _take_ready(self, max_bytes: int) -> bytes:
        data = self._ready.pop(0)
        if len(data) > max_bytes:
            self._ready.insert(0, data[max_bytes:])
            data = data[:max_bytes]
        return data

    async def _take_events(self) -> None:
        self._handle_events()
        await self._flush()  # pongs, the answer to a close, the close after broken framing

    def _handle_events(self, frames: Sequence[Frame] = ()) -> None:
        """What was received (and ``frames``): frame bytes to hand out, a close, or the
        carriage misused."""
        for event in [*frames, *self._ws.events_received()]:
            if self._misuse is not None:
                break  # nothing after the misuse is handed out
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.TEXT:  # (its continuations are never looked at: see above)
                self._misused("a text WebSocket message (frames go in binary ones)")
            elif opcode is Opcode.BINARY or opcode is Opcode.CONT:
                self._incoming.feed(event.data)
                if event.data:
                    self._ready.append(bytes(event.data))
                if event.fin and not self._incoming.at_boundary:
                    self._misused("a WebSocket message ended inside a frame")
            elif opcode is Opcode.CLOSE:
                self._ended = True  # (answered by the library, sent below)
        if self._ws.parser_exc is not None and self._closing is None:
            self._closing = b"".join(self._ws.data_to_send())
            self._misused(f"broken WebSocket framing: {self._ws.parser_exc}")

    def _misused(self, what: str) -> None:
        """Raised once what came before it was handed out: the core's own rules go first."""
        self._misuse = self._misuse or RemoteProtocolError(what)
        self._ended = True

    async def _flush(self) -> None:
        """Send what the protocol has queued, in its order (an empty write is its end: the
        close does it). With nothing queued, no lock is taken (taking one yields to the loop:
        a turn of it on every receive)."""
        answers, self._answers = self._answers, []
        data = b"".join([*answers, *self._ws.data_to_send()])
        if data:
            async with self._send_lock:
                await self._send_locked(data)

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            await self._send_locked(data)

    async def _send_locked(self, data: bytes, beside: Sequence[Buffer] = ()) -> None:
        """``data`` (and ``beside``, on our own socket) after the rest of a message
        `try_send` began: nothing may go between."""
        rest, self._unsent = self._unsent, []
        buffers = [*rest, data, *beside] if data else [*rest, *beside]
        try:
            if self._socket is not None:
                await self._send_buffers(self._socket, buffers, begun=bool(rest))
            elif buffers:
                await self._stream.send(b"".join(buffers))
        except _GONE as exc:
            raise _broken(exc) from exc

    @staticmethod
    async def _send_buffers(sock: SocketTransport, buffers: list[Buffer],
                            begun: bool = False) -> None:
        """All of ``buffers``, in order, without joining them. Cut short after part of a
        message went out (here, or ``begun`` before), the socket is shut down (as
        `SocketByteStream.send` does): a peer must never read half a message."""
        started = begun
        try:
            while buffers:
                sent = await sock.send_some(buffers)
                started = True
                buffers = unsent(buffers, sent)
        except BaseException:
            if started and buffers:
                with contextlib.suppress(OSError):
                    sock.sock.shutdown(socket.SHUT_RDWR)
            raise

    def try_send(self, buffers: Sequence[Buffer]) -> int:
        """Whole frames as one message, sent from the caller when nothing else is being
        sent (plain ws: only), as `SocketTransport` does: no hop to the writer task.

        What of the message the socket did not take now is kept and goes out before
        anything else; the bytes it holds are reported unsent (0), so the outbox hands
        them to `send_some`, which then only counts them (``_covered``).
        """
        sock = self._socket
        if (sock is None or self._covered or self._tail or self._closing is not None
                or self._send_lock.locked() or self._ws.state is not State.OPEN):
            return 0
        scan = FrameTracker()  # (the outgoing one is at a frame's edge: no tail)
        messages: list[list[Buffer]] = []  # as `send_some` cuts them: one per buffer ending
        pieces: list[Buffer] = []  # a frame
        size = 0
        for buffer in buffers:
            size += len(buffer)
            end = scan.feed(buffer)
            if end is None:
                pieces.append(buffer)
                continue
            messages.append([*pieces, memoryview(buffer)[:end]])
            pieces = [memoryview(buffer)[end:]] if end < len(buffer) else []
        if not messages or pieces:
            return 0
        out = self._framed(messages)
        sent = sock.try_send(out)
        total = sum(len(buffer) for buffer in out)
        if sent == total:
            return size
        self._unsent = unsent(out, sent)
        self._covered = size
        return 0

    def _framed(self, messages: list[list[Buffer]]) -> list[Buffer]:
        """``messages`` as what goes on the wire, after what the protocol has queued: on our
        own socket as a server, each header beside its pieces; else each joined and framed
        by the library (which masks a client's)."""
        if self._beside is None:
            for message in messages:
                self._ws.send_binary(b"".join(message) if len(message) > 1 else message[0])
            return [b"".join(self._ws.data_to_send())]
        out: list[Buffer] = [*self._ws.data_to_send()]  # (pings' pongs: whole frames)
        for message in messages:
            out.append(binary_header(sum(len(piece) for piece in message)))
            out += message
        return out

    async def send_some(self, buffers: Sequence[Buffer]) -> int:
        """Take all of ``buffers``; send the whole frames among what was taken so far."""
        if self._covered:  # what `try_send` framed already: its message's rest, then count
            async with self._send_lock:
                await self._send_locked(b"")
            taken = min(self._covered, sum(len(buffer) for buffer in buffers))
            self._covered -= taken
            return taken
        size = 0
        for buffer in buffers:
            size += len(buffer)
            end = self._outgoing.feed(buffer)
            if end is None:
                self._tail += buffer
                continue
            message: list[Buffer] = [memoryview(buffer)[:end]]
            if self._tail:
                message.insert(0, bytes(self._tail))
            self._tail[:] = memoryview(buffer)[end:]
            async with self._send_lock:  # framed and sent in the order framed
                if self._closing == b"":
                    raise anyio.BrokenResourceError("the WebSocket was closed")
                if self._closing is not None:  # the last words before the held-back close
                    await self._send_locked(Frame(Opcode.BINARY, b"".join(message)).serialize(
                        mask=self._ws.side is Side.CLIENT))
                    continue
                if self._ws.state is not State.OPEN:  # closing or closed: nothing more goes
                    raise anyio.BrokenResourceError(f"the WebSocket is {self._ws.state.name}")
                await self._send_locked(b"", self._framed([message]))
        return size

    async def send_eof(self, protocol_error: bool = False) -> None:
        """Begin the closing handshake: 1000, or 1002 after a protocol error."""
        if self._closing is not None:
            closing, self._closing = self._closing, b""
            if closing:
                await self._send(closing)
        elif self._ws.state is State.OPEN:
            self._ws.send_close(CloseCode.PROTOCOL_ERROR if protocol_error
                                else CloseCode.NORMAL_CLOSURE)
            await self._flush()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):  # never cut short half-way
            await self._stream.aclose()


async def open_client(stream: anyio.abc.ByteStream, host: str, path: str = "/ws",
                      ) -> WebSocketTransport:
    """Upgrade ``stream`` to a WebSocket with subprotocol ttyserve.v1 (the client side).

    Raises ConnectionRefusedError when the server refuses the upgrade (its status said).
    """
    ws = ClientProtocol(parse_uri(f"ws://{host}{path}"), subprotocols=[SUBPROTOCOL],
                        max_size=WEBSOCKET_MAX_MESSAGE)
    request = ws.connect()
    request.headers["User-Agent"] = CLIENT_NAME
    ws.send_request(request)
    await stream.send(b"".join(ws.data_to_send()))
    while True:
        try:
            data = await stream.receive(WEBSOCKET_RECEIVE)
        except anyio.EndOfStream:
            raise ConnectionResetError("the server closed during the WebSocket upgrade") from None
        ws.receive_data(data)
        events = ws.events_received()
        for index, event in enumerate(events):
            if not isinstance(event, Response):
                continue
            if event.status_code != 101:
                raise ConnectionRefusedError(
                    f"the server refused the WebSocket upgrade: HTTP {event.status_code}")
            if ws.subprotocol != SUBPROTOCOL:
                raise ConnectionRefusedError(
                    f"the server did not select subprotocol {SUBPROTOCOL}")
            if ws.handshake_exc is not None:
                raise ConnectionRefusedError(f"the WebSocket upgrade failed: {ws.handshake_exc}")
            return WebSocketTransport(stream, ws, frames=[
                frame for frame in events[index + 1:] if isinstance(frame, Frame)])
