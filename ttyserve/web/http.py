"""The HTTP front door of a `ws:` or `wss:` listener (protocol section 8), on h11.

One port answers HTTP/1.1: `GET /` is the terminal page and `/static/...` its
assets; `GET /ws` upgrades to the WebSocket carriage (subprotocol
`ttyserve.v1`) once the origin check passes, and the connection then goes to
the protocol like any other; `/api/v1/...` is the HTTP API (section 13), answered
by the WebApi the server was given. Any other request gets its status, a text body
that names what was wrong, and the connection is closed. Each request's head must
come within the handshake timeout; an API request's answer may then take as long
as it needs (an output stream, a `wait`).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from importlib import resources

import anyio
import anyio.abc
import h11
from websockets.datastructures import Headers
from websockets.http11 import Request as WsRequest
from websockets.protocol import State
from websockets.server import ServerProtocol

from ..addresses import Address, is_loopback
from ..defaults import HTTP_RECEIVE, WEBSOCKET_MAX_MESSAGE
from ..protocol.frames import DEFAULT_MAX_FRAME, HEADER_SIZE
from ..transport.streams import close_gracefully
from .exchange import API_PREFIX, Exchange, Inner, WebApi
from .origin import loopback_name, normal_origin, origin_allowed
from .websocket import SUBPROTOCOL, WebSocketTransport

log = logging.getLogger("ttyserve")

MAX_LINE = 16 * 1024  # a longer request line gets 414 (section 8)
MAX_HEADERS = 16 * 1024  # a longer header section gets 431 (section 8)
DRAIN_TIME = 1.0  # seconds to let a refused client read its answer before the close
ENDPOINT = "/ws"
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:\d+)?|\[[0-9A-Fa-f:.]+\](:\d+)?")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".svg": "image/svg+xml", ".json": "application/json", "": "text/plain; charset=utf-8"}
_REASONS = {200: b"OK", 400: b"Bad Request", 403: b"Forbidden", 404: b"Not Found",
            405: b"Method Not Allowed", 414: b"URI Too Long",
            431: b"Request Header Fields Too Large"}


@dataclass(frozen=True, slots=True)
class Asset:
    content_type: str
    body: bytes


def load_assets() -> dict[str, Asset]:
    """The page and everything under `static/`, by the path they are served at."""
    root = resources.files(__package__) / "static"
    assets: dict[str, Asset] = {}

    def walk(folder: resources.abc.Traversable, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            elif not entry.name.startswith("."):
                suffix = entry.name[entry.name.rfind("."):] if "." in entry.name else ""
                assets[f"/static/{prefix}{entry.name}"] = Asset(
                    _TYPES.get(suffix, _TYPES[""]), entry.read_bytes())

    walk(root, "")
    assets["/"] = assets["/static/index.html"]
    return assets


class Refusal(Exception):
    """A request answered with an error status; the message says why, for people."""

    def __init__(self, status: int, message: str, *headers: tuple[str, str]) -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


def head_too_long(head: bytes | bytearray) -> Refusal | None:
    """414 or 431 once a request line or a header section (still arriving) is over 16 KiB.
    Lines may end in a bare LF: h11 accepts those too."""
    line_end = head.find(b"\n")
    if line_end < 0:
        line_end = len(head)
        if line_end <= MAX_LINE:
            return None
    if line_end > MAX_LINE:
        return Refusal(414, f"the request line is over {MAX_LINE} bytes")
    ends = [i for i in (head.find(b"\n\r\n", line_end), head.find(b"\n\n", line_end)) if i >= 0]
    section = (min(ends) if ends else len(head)) - line_end - 1
    if section > MAX_HEADERS:
        return Refusal(431, f"the header section is over {MAX_HEADERS} bytes")
    return None


class FrontDoor:
    """Serves the HTTP side of `ws:`/`wss:` connections until they upgrade, err, or go idle.

    A caller bounds the whole of it with the handshake deadline.
    """

    def __init__(self, allowed_origins: frozenset[str], assets: dict[str, Asset] | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, api: WebApi | None = None,
                 head_timeout: float = math.inf) -> None:
        self.allowed_origins = allowed_origins
        self.api = api
        self.head_timeout = head_timeout
        self.assets = load_assets() if assets is None else assets
        # The largest WebSocket frame taken (it is read whole): a batch of two whole frames.
        self.max_message = max(WEBSOCKET_MAX_MESSAGE, 2 * (max_frame + HEADER_SIZE))

    async def serve(self, stream: anyio.abc.ByteStream, peer: object, listener: Address,
                    inner: Inner | None = None,
                    ) -> WebSocketTransport | None:
        """Answer requests; the WebSocket transport once one upgrades, else None (then the
        caller closes the stream). ``inner`` opens a connection to this server for the API's
        requests. Never raises for what the client does."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_LINE + MAX_HEADERS + 4)
        try:
            return await self._serve(conn, stream, peer, listener, inner)
        except Refusal as refusal:
            log.info("%s: HTTP %d: %s", peer, refusal.status, refusal)
            await _refuse(conn, stream, refusal)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
                OSError, h11.ProtocolError) as exc:
            log.info("%s: HTTP connection ended: %s", peer, str(exc) or type(exc).__name__)
        return None

    async def _serve(self, conn: h11.Connection, stream: anyio.abc.ByteStream, peer: object,
                     listener: Address, inner: Inner | None,
                     ) -> WebSocketTransport | None:
        head = bytearray()  # the raw request head while it arrives, for 414 and 431
        while True:
            event: object = None
            with anyio.move_on_after(self.head_timeout):
                event = await _next_request(conn, stream, head)
            if not isinstance(event, h11.Request):
                return None  # the client closed or went quiet (requests are answered as
                # they arrive)
            if _text(event.target).startswith(API_PREFIX) and self.api is not None:
                host = _text(_one(event, b"host") or b"")
                if not _HOST.fullmatch(host):
                    raise Refusal(400, f"the Host header {host!r} is not a host and port")
                assert inner is not None
                await self.api.answer(Exchange(
                    conn, stream, event, getattr(peer, "host", ""), listener.encrypted, host,
                    inner, self.foreign(event, host, listener), self.head_timeout))
                upgraded = None
            else:
                with anyio.fail_after(self.head_timeout):
                    upgraded = await self._answer(conn, stream, event, listener)
            if upgraded is not None:
                return upgraded
            while conn.their_state is h11.SEND_BODY:  # a body nobody read: what has come
                if conn.next_event() is h11.NEED_DATA:  # (our EOF and a drain first: closing
                    await close_gracefully(stream, DRAIN_TIME)  # on unread bytes would reset
                    return None  # the answer away)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return None
            conn.start_next_cycle()  # keep-alive: the next request may already be here
            head = bytearray(conn.trailing_data[0])

    async def _answer(self, conn: h11.Connection, stream: anyio.abc.ByteStream,
                      request: h11.Request, listener: Address) -> WebSocketTransport | None:
        host = _text(_one(request, b"host") or b"")
        if not _HOST.fullmatch(host):
            raise Refusal(400, f"the Host header {host!r} is not a host and port")
        path = _text(request.target).split("?", 1)[0]
        if path == ENDPOINT:
            return await self._upgrade(stream, conn, request, host, listener)
        asset = self.assets.get(path)
        if asset is None:
            raise Refusal(404, f"nothing here at {path!r}")
        if request.method != b"GET":
            raise Refusal(405, "only GET is answered here", ("Allow", "GET"))
        await _send(conn, stream, 200, asset.body, asset.content_type, host)
        return None

    async def _upgrade(self, stream: anyio.abc.ByteStream, conn: h11.Connection,
                       request: h11.Request, host: str, listener: Address,
                       ) -> WebSocketTransport:
        if request.method != b"GET":
            raise Refusal(405, "the WebSocket endpoint takes GET", ("Allow", "GET"))
        if _text(_one(request, b"upgrade") or b"").lower() != "websocket":
            raise Refusal(400, f"{ENDPOINT} is the WebSocket endpoint: send an upgrade")
        if any(name.lower() in (b"content-length", b"transfer-encoding")
               for name, _ in request.headers):
            raise Refusal(400, "a WebSocket upgrade has no body")
        if (problem := self.foreign(request, host, listener)) is not None:
            raise Refusal(403, problem)
        offered = {p.strip() for name, value in request.headers
                   if name.lower() == b"sec-websocket-protocol" for p in _text(value).split(",")}
        if SUBPROTOCOL not in offered:
            raise Refusal(400, f"the upgrade does not offer subprotocol {SUBPROTOCOL}")
        handshake = ServerProtocol(subprotocols=[SUBPROTOCOL])  # h11 parsed the request
        response = handshake.accept(WsRequest(_text(request.target), Headers(
            [(_text(name), _text(value)) for name, value in request.headers])))
        if response.status_code != 101:
            raise Refusal(400, f"not a WebSocket upgrade: {handshake.handshake_exc}")
        while conn.next_event() not in (h11.PAUSED, h11.NEED_DATA):
            pass  # to the end of the upgrade request: what follows is WebSocket data
        await stream.send(response.serialize())
        ws = ServerProtocol(state=State.OPEN, max_size=self.max_message)  # frames from here
        return WebSocketTransport(stream, ws, received=conn.trailing_data[0])

    def foreign(self, request: h11.Request, host: str, listener: Address) -> str | None:
        """Why a request is not from this server's own pages (section 8), or None: a Host
        that does not name a loopback listener's machine, or an Origin not allowed."""
        if is_loopback(listener.host) and not loopback_name(host):
            return (f"Host {host!r} does not name this machine, whose listener is on "
                    "loopback (a DNS rebinding page?)")
        origin = _one(request, b"origin")
        own = f"{'https' if listener.encrypted else 'http'}://{host}"
        if origin is not None and not origin_allowed(_text(origin), own, self.allowed_origins):
            return (f"origin {_text(origin)!r} is not allowed here (this server's own is "
                    f"{normal_origin(own)!r}; see --allow-origin)")
        return None


async def _next_request(conn: h11.Connection, stream: anyio.abc.ByteStream,
                        head: bytearray) -> object:
    """The next request's head (or what ended the connection instead)."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise Refusal(400, f"not an HTTP/1.1 request: {exc}") from exc
        if event is not h11.NEED_DATA:
            return event
        data = await stream.receive(HTTP_RECEIVE)
        if len(head) <= MAX_LINE + MAX_HEADERS + 4:
            head += data
            if (refusal := head_too_long(head)) is not None:
                raise refusal
        conn.receive_data(data)


def _one(request: h11.Request, name: bytes) -> bytes | None:
    """The value of a header that may appear once; a second one is refused."""
    values = [value for key, value in request.headers if key.lower() == name]
    if len(values) > 1:
        raise Refusal(400, f"{_text(name)} is given {len(values)} times")
    return values[0] if values else None


async def _refuse(conn: h11.Connection, stream: anyio.abc.ByteStream, refusal: Refusal) -> None:
    """Answer with the refusal's status if a response can still be sent; then our EOF and a
    short drain, so that closing on unread bytes does not reset the answer away."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return  # h11 lets a server answer from IDLE a request that did not parse
    body = f"{refusal.status} {_REASONS[refusal.status].decode()}: {refusal}\n".encode()
    with anyio.move_on_after(DRAIN_TIME):
        try:
            await _send(conn, stream, refusal.status, body, _TYPES[""], None,
                        [("Connection", "close"), *refusal.headers])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError,
                h11.LocalProtocolError):
            return
    await close_gracefully(stream, DRAIN_TIME)


def content_security_policy(host: str | None) -> str:
    """Only the server's own scripts, styles, images and WebSocket (section 8)."""
    sockets = f" ws://{host} wss://{host}" if host else ""
    return ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            f"img-src 'self'; font-src 'self'; connect-src 'self'{sockets}; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


async def _send(conn: h11.Connection, stream: anyio.abc.ByteStream, status: int, body: bytes,
                content_type: str, host: str | None,
                extra: list[tuple[str, str]] | None = None) -> None:
    headers = [
        ("Content-Type", content_type), ("Content-Length", str(len(body))),
        ("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
        ("Content-Security-Policy", content_security_policy(host)), *(extra or []),
    ]
    data = conn.send(h11.Response(status_code=status, headers=headers, reason=_REASONS[status]))
    data += conn.send(h11.Data(data=body)) or b""
    data += conn.send(h11.EndOfMessage()) or b""
    await stream.send(data)


def _text(value: bytes) -> str:
    return value.decode("latin-1")
