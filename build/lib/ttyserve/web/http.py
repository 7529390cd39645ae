"""The HTTP front door of a `ws:` or `wss:` listener (protocol section 8), on h11.

One port answers HTTP/1.1: `GET /` is the terminal page and `/static/...` its
assets; `GET /ws` upgrades to the WebSocket carriage (subprotocol
`ttyserve.v1`) once the origin check passes, and the connection then goes to
the protocol like any other. Any other request gets its status, a text body
that names what was wrong, and the connection is closed. Request bodies are
never read: nothing here takes one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from importlib import resources

import anyio
import anyio.abc
import h11
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request
from wsproto.utilities import RemoteProtocolError as WsRemoteError

from .websocket import SUBPROTOCOL, WebSocketTransport

log = logging.getLogger("ttyserve")

MAX_LINE = 16 * 1024  # a longer request line gets 414 (section 8)
MAX_HEADERS = 16 * 1024  # a longer header section gets 431 (section 8)
READ_SIZE = 64 * 1024
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
    """414 or 431 once a request line or a header section (still arriving) is over 16 KiB."""
    line_end = head.find(b"\r\n")
    if line_end < 0:
        line_end = len(head)
        if line_end <= MAX_LINE:
            return None
    if line_end > MAX_LINE:
        return Refusal(414, f"the request line is over {MAX_LINE} bytes")
    section_end = head.find(b"\r\n\r\n", line_end)
    section = (len(head) if section_end < 0 else section_end) - line_end - 2
    if section > MAX_HEADERS:
        return Refusal(431, f"the header section is over {MAX_HEADERS} bytes")
    return None


class FrontDoor:
    """Serves one `ws:`/`wss:` connection until it upgrades, errs, or goes idle."""

    def __init__(self, allowed_origins: frozenset[str], idle_timeout: float,
                 assets: dict[str, Asset] | None = None) -> None:
        self.allowed_origins = allowed_origins
        self.idle_timeout = idle_timeout
        self.assets = load_assets() if assets is None else assets

    async def serve(self, stream: anyio.abc.ByteStream, peer: object, secure: bool,
                    ) -> WebSocketTransport | None:
        """Answer requests; the WebSocket transport once one upgrades, else None (closed).

        ``secure``: the listener is `wss:`, so the server's own origin is https.
        """
        scheme = "https" if secure else "http"
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_LINE + MAX_HEADERS + 4)
        head = bytearray()  # the raw request head while it arrives, for 414 and 431
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._refuse(conn, stream, Refusal(400, f"not an HTTP/1.1 request: {exc}"))
                return None
            if event is h11.NEED_DATA:
                with anyio.move_on_after(self.idle_timeout):
                    try:
                        data = await stream.receive(READ_SIZE)
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        return None
                    if len(head) <= MAX_LINE + MAX_HEADERS + 4:
                        head += data
                        if (refusal := head_too_long(head)) is not None:
                            log.info("%s: HTTP %d: %s", peer, refusal.status, refusal)
                            await self._refuse(conn, stream, refusal)
                            return None
                    conn.receive_data(data)
                    continue
                return None  # idle past the deadline
            if isinstance(event, h11.ConnectionClosed):
                return None
            if not isinstance(event, h11.Request):
                continue  # the end of a request we answered (bodies are not read)
            try:
                upgraded = await self._answer(conn, stream, event, scheme)
            except Refusal as refusal:
                log.info("%s: HTTP %d %s: %s", peer, refusal.status, _text(event.target),
                         refusal)
                await self._refuse(conn, stream, refusal)
                return None
            if upgraded is not None:
                return upgraded
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return None
            conn.start_next_cycle()
            head = bytearray(conn.trailing_data[0])

    async def _answer(self, conn: h11.Connection, stream: anyio.abc.ByteStream,
                      request: h11.Request, scheme: str) -> WebSocketTransport | None:
        headers = {name.lower(): value for name, value in request.headers}
        host = _text(headers.get(b"host", b""))
        if not _HOST.fullmatch(host):
            raise Refusal(400, f"the Host header {host!r} is not a host and port")
        path = _text(request.target).split("?", 1)[0]
        if path == ENDPOINT:
            return await self._upgrade(stream, conn, request, headers, f"{scheme}://{host}")
        asset = self.assets.get(path)
        if asset is None:
            raise Refusal(404, f"nothing here at {path!r}")
        if request.method != b"GET":
            raise Refusal(405, "only GET is answered here", ("Allow", "GET"))
        await _send(conn, stream, 200, asset.body, asset.content_type, host)
        return None

    async def _upgrade(self, stream: anyio.abc.ByteStream, conn: h11.Connection,
                       request: h11.Request, headers: dict[bytes, bytes],
                       own_origin: str) -> WebSocketTransport:
        if request.method != b"GET":
            raise Refusal(405, "the WebSocket endpoint takes GET", ("Allow", "GET"))
        if _text(headers.get(b"upgrade", b"")).lower() != "websocket":
            raise Refusal(400, f"{ENDPOINT} is the WebSocket endpoint: send an upgrade")
        origin = headers.get(b"origin")
        if origin is not None:
            own = own_origin.lower()
            offered = _text(origin).lower().rstrip("/")
            if offered != own and offered not in self.allowed_origins:
                raise Refusal(403, f"origin {_text(origin)!r} is not allowed here "
                                   f"(this server's own is {own!r}; see --allow-origin)")
        offered_protocols = {p.strip() for p in _text(headers.get(
            b"sec-websocket-protocol", b"")).split(",")}
        if SUBPROTOCOL not in offered_protocols:
            raise Refusal(400, f"the upgrade does not offer subprotocol {SUBPROTOCOL}")
        ws = WSConnection(ConnectionType.SERVER)
        try:
            ws.initiate_upgrade_connection(list(request.headers), request.target)
            if not any(isinstance(event, Request) for event in ws.events()):
                raise Refusal(400, "not a WebSocket upgrade")
        except WsRemoteError as exc:
            raise Refusal(400, f"not a WebSocket upgrade: {exc}") from exc
        while conn.next_event() not in (h11.PAUSED, h11.NEED_DATA):
            pass  # to the end of the upgrade request: what follows is WebSocket data
        await stream.send(ws.send(AcceptConnection(subprotocol=SUBPROTOCOL)))
        return WebSocketTransport(stream, ws, received=conn.trailing_data[0])

    async def _refuse(self, conn: h11.Connection, stream: anyio.abc.ByteStream,
                      refusal: Refusal) -> None:
        """Answer with the refusal's status if a response can still be sent, then close."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return  # h11 lets a server answer from IDLE a request that did not parse
        body = f"{refusal.status} {_REASONS[refusal.status].decode()}: {refusal}\n".encode()
        try:
            await _send(conn, stream, refusal.status, body, _TYPES[""], None,
                        [("Connection", "close"), *refusal.headers])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError,
                h11.LocalProtocolError):
            pass


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
