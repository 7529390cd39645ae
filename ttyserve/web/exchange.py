"""One request to the HTTP API on a front-door connection (protocol section 13): its head,
its body read in pieces or whole up to a limit, and its answer (a whole body, or a stream
sent as it comes). What the API means lives above, in ttyserve/api/; this is h11 and
bytes, and the way to the server's own protocol (``inner``)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qsl, unquote

import anyio
import anyio.abc
import h11

from ..defaults import HTTP_RECEIVE
from ..transport.direct import OutputReader
from ..transport.streams import Buffer, SocketByteStream, Transport, unsent

API_PREFIX = "/api/v1/"
# Opens a protocol-v1 connection to this server for one request; given a reader, its
# channels' output is handed to that reader in this process (transport/direct.py).
Inner = Callable[[OutputReader | None], Awaitable[Transport]]
REASONS = {200: b"OK", 201: b"Created", 204: b"No Content", 400: b"Bad Request",
           401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found",
           405: b"Method Not Allowed", 409: b"Conflict", 413: b"Content Too Large",
           414: b"URI Too Long", 422: b"Unprocessable Content",
           429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
           500: b"Internal Server Error", 503: b"Service Unavailable"}


class TooLarge(Exception):
    """A request body over the limit its kind has (the API answers 413)."""


@dataclass
class Exchange:
    """One API request and its answer. ``inner`` opens a protocol-v1 connection to this
    server, whose peer is this request's (``http:ADDR``)."""

    conn: h11.Connection
    stream: anyio.abc.ByteStream
    request: h11.Request
    peer_host: str
    encrypted: bool
    host: str
    inner: Inner
    foreign: str | None  # why it is not from this server's own pages (Host, Origin), or None
    piece_timeout: float = math.inf  # seconds each piece of a body may take to come
    _body_done: bool = field(default=False, init=False)
    _chunked: bool = field(default=False, init=False)  # the streamed answer's framing

    @property
    def method(self) -> str:
        return self.request.method.decode("latin-1")

    @property
    def path(self) -> str:
        return unquote(self.request.target.decode("latin-1").split("?", 1)[0])

    @property
    def query(self) -> dict[str, str]:
        target = self.request.target.decode("latin-1")
        return dict(parse_qsl(target.split("?", 1)[1])) if "?" in target else {}

    def header(self, name: str) -> str | None:
        """The last value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower().encode()
        values = [v for k, v in self.request.headers if k.lower() == wanted]
        return values[-1].decode("latin-1") if values else None

    async def body_pieces(self) -> AsyncIterator[bytes]:
        """The request body as it arrives (nothing more once it has all come)."""
        while not self._body_done:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                with anyio.fail_after(self.piece_timeout):  # (TimeoutError: the connection
                    data = await self.stream.receive(HTTP_RECEIVE)  # ends, as a broken one)
                self.conn.receive_data(data)
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._body_done = True
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} in a body")

    async def body(self, limit: int) -> bytes:
        """The whole request body; TooLarge once it is over ``limit`` bytes (a declared
        Content-Length over it is refused before anything is read)."""
        declared = self.header("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise TooLarge(f"the body is {declared} bytes, over the limit of {limit}")
        parts: list[bytes] = []
        size = 0
        async for piece in self.body_pieces():
            size += len(piece)
            if size > limit:
                raise TooLarge(f"the body is over the limit of {limit} bytes")
            parts.append(piece)
        return b"".join(parts)

    def _no_body(self) -> None:
        """A request that came with no body (a GET): its end is read, so the connection
        may serve the next request."""
        if not self._body_done and self.conn.their_state is h11.SEND_BODY and isinstance(
                self.conn.next_event(), h11.EndOfMessage):
            self._body_done = True

    async def answer(self, status: int, body: bytes = b"",
                     content_type: str = "application/json",
                     headers: list[tuple[str, str]] | None = None) -> None:
        """A whole answer (no body for 204)."""
        extra = list(headers or [])
        self._no_body()
        if not self._body_done:
            extra.append(("Connection", "close"))  # the rest of the body is not read
        if status != 204:
            extra = [("Content-Type", content_type), ("Content-Length", str(len(body))),
                     *extra]
        data = self.conn.send(_response(status, extra)) or b""
        if body:
            data += self.conn.send(h11.Data(data=body)) or b""
        data += self.conn.send(h11.EndOfMessage()) or b""
        await self.stream.send(data)

    async def begin_stream(self, content_type: str,
                           headers: list[tuple[str, str]] | None = None) -> None:
        """The head of an answer whose body follows in pieces (chunked)."""
        extra = [("Content-Type", content_type), ("Cache-Control", "no-cache"),
                 *(headers or [])]
        self._no_body()
        if not self._body_done:
            extra.append(("Connection", "close"))
        head = self.conn.send(_response(200, extra)) or b""
        # h11 chose the body's framing: chunks, or (an HTTP/1.0 client) until the close
        self._chunked = b"transfer-encoding: chunked" in head.lower()
        await self.stream.send(head)

    async def send(self, *parts: Buffer) -> None:
        """A piece of a streamed answer, made of ``parts``: one chunk, framed here and sent
        without copying them where the stream is a plain socket (h11 would join them)."""
        size = sum(len(part) for part in parts)
        if not size:
            return
        buffers: list[Buffer] = (
            [b"%x\r\n" % size, *parts, b"\r\n"] if self._chunked else list(parts))
        if isinstance(self.stream, SocketByteStream):
            transport = self.stream.transport
            while buffers:
                buffers = unsent(buffers, await transport.send_some(buffers))
        else:
            await self.stream.send(b"".join(buffers))

    async def end_stream(self) -> None:
        await self.stream.send(self.conn.send(h11.EndOfMessage()) or b"")

    async def until_gone(self) -> None:
        """Return once the client has closed its side (what it sends meanwhile, a next
        request, waits in h11's buffer). For a stream that may be silent a long while."""
        while True:
            try:
                data = await self.stream.receive(HTTP_RECEIVE)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError,
                    OSError):
                return
            self.conn.receive_data(data)
            if len(self.conn.trailing_data[0]) > HTTP_RECEIVE:  # no request waits so long:
                return  # a client sending all along is treated as gone (bounded memory)


def _response(status: int, headers: list[tuple[str, str]]) -> h11.Response:
    return h11.Response(status_code=status, reason=REASONS.get(status, b""),
                        headers=[("X-Content-Type-Options", "nosniff"), *headers])


class WebApi(Protocol):
    """What answers the requests under API_PREFIX (ttyserve/api/, given to the server)."""

    async def answer(self, exchange: Exchange) -> None: ...
