"""The protocol's byte stream carried in WebSocket binary messages (protocol section 8), on wsproto.

One more transport under the same core: what it receives is frame bytes, what
it is given to send goes out as binary messages that hold whole frames (a
frame never spans two messages). A text message, or a message that ends inside
a frame, is the carriage misused: `receive` raises RemoteProtocolError, and the
connection is then closed with code 1002.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.abc
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError as WsLocalError

from ..defaults import WEBSOCKET_RECEIVE
from ..errors import RemoteProtocolError
from ..protocol.frames import FrameTracker
from ..transport.streams import Buffer

SUBPROTOCOL = "ttyserve.v1"
_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


def _broken(exc: BaseException) -> anyio.BrokenResourceError:
    error = anyio.BrokenResourceError(str(exc))
    error.__cause__ = exc
    return error


class WebSocketTransport:
    """A `Transport` over an established WebSocket (either side): whole frames per message."""

    def __init__(self, stream: anyio.abc.ByteStream, ws: WSConnection,
                 received: bytes = b"") -> None:
        self._stream = stream
        self._ws = ws
        self._send_lock = anyio.Lock()  # the reader answers pings while the writer sends
        self._incoming = FrameTracker()
        self._outgoing = FrameTracker()
        self._tail = bytearray()  # what was given to send past the last whole frame
        self._ready: list[bytes] = []
        self._ended = False
        self._misuse: RemoteProtocolError | None = None
        if received:
            ws.receive_data(received)

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
                    data = None  # wsproto learns of the end (and says it was not clean)
                except _GONE as exc:
                    raise _broken(exc) from exc
                self._ws.receive_data(data)
        data = self._ready.pop(0)
        if len(data) > max_bytes:
            self._ready.insert(0, data[max_bytes:])
            data = data[:max_bytes]
        return data

    async def _take_events(self) -> None:
        for event in self._ws.events():
            if self._misuse is not None:
                break  # nothing after the misuse is handed out
            if isinstance(event, BytesMessage):
                self._incoming.feed(event.data)
                if event.data:
                    self._ready.append(bytes(event.data))
                if event.message_finished and not self._incoming.at_boundary:
                    self._misused("a WebSocket message ended inside a frame")
            elif isinstance(event, TextMessage):
                self._misused("a text WebSocket message (frames go in binary ones)")
            elif isinstance(event, Ping):
                await self._send_event(event.response())
            elif isinstance(event, CloseConnection):
                if self._ws.state is ConnectionState.OPEN:  # wsproto found the framing broken
                    self._misused(f"broken WebSocket framing: {event.reason}")
                    break
                if self._ws.state is ConnectionState.REMOTE_CLOSING:
                    await self._send_event(event.response())
                self._ended = True

    def _misused(self, what: str) -> None:
        """Raised once what came before it was handed out: the core's own rules go first."""
        self._misuse = self._misuse or RemoteProtocolError(what)
        self._ended = True

    async def _send_event(self, event: Event) -> None:
        async with self._send_lock:
            try:
                data = self._ws.send(event)
            except WsLocalError as exc:  # closing or closed: nothing more can be sent
                raise anyio.BrokenResourceError(str(exc)) from exc
            try:
                await self._stream.send(data)
            except _GONE as exc:
                raise _broken(exc) from exc

    def try_send(self, buffers: Sequence[Buffer]) -> int:
        return 0  # every message goes through the writer task (no fast path here)

    async def send_some(self, buffers: Sequence[Buffer]) -> int:
        """Take all of ``buffers``; send the whole frames among what was taken so far."""
        size = 0
        for buffer in buffers:
            size += len(buffer)
            end = self._outgoing.feed(buffer)
            if end is None:
                self._tail += buffer
                continue
            message = bytes(self._tail) + memoryview(buffer)[:end]  # one copy of the payload
            self._tail[:] = memoryview(buffer)[end:]
            await self._send_event(BytesMessage(data=message))
        return size

    async def send_eof(self, protocol_error: bool = False) -> None:
        """Begin the closing handshake: 1000, or 1002 after a protocol error."""
        code = CloseReason.PROTOCOL_ERROR if protocol_error else CloseReason.NORMAL_CLOSURE
        if self._ws.state is ConnectionState.OPEN:
            await self._send_event(CloseConnection(code=code))

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):  # never cut short half-way
            await self._stream.aclose()


async def open_client(stream: anyio.abc.ByteStream, host: str, path: str = "/ws",
                      ) -> WebSocketTransport:
    """Upgrade ``stream`` to a WebSocket with subprotocol ttyserve.v1 (the client side).

    Raises ConnectionRefusedError when the server refuses the upgrade (its status said).
    """
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send(ws.send(Request(host=host, target=path, subprotocols=[SUBPROTOCOL])))
    while True:
        try:
            data = await stream.receive(WEBSOCKET_RECEIVE)
        except anyio.EndOfStream:
            raise ConnectionResetError("the server closed during the WebSocket upgrade") from None
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                if event.subprotocol != SUBPROTOCOL:
                    raise ConnectionRefusedError(
                        f"the server did not select subprotocol {SUBPROTOCOL}")
                return WebSocketTransport(stream, ws)
            if isinstance(event, RejectConnection):
                raise ConnectionRefusedError(
                    f"the server refused the WebSocket upgrade: HTTP {event.status_code}")
