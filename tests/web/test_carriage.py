"""Protocol section 8 on the wire: the HTTP front door and the WebSocket carriage of a real
`ttyserve serve`, driven by raw HTTP requests and by real WebSocket clients (wsproto, and the
client library over `ws:` and `wss:`)."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import SH, ServerProcess, echo_through_cat, start_server, tls_files, wait_until
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import generate_accept_token

from ttyserve.client import client_tls_context, connect, run
from ttyserve.errors import RequestError
from ttyserve.exitcodes import ServeExit
from ttyserve.protocol.frames import FrameDecoder, FrameKind, encode_frame
from ttyserve.protocol.messages import Hello, Open, encode_message, parse_object

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "web-token-for-tests"


@pytest.fixture
def web_server(short_dir: Path) -> Iterator[ServerProcess]:
    """A `ws:` listener that made its own token (so it printed the `browse` line)."""
    # Written as people do, with its default port: allowed all the same as browsers send it.
    server = start_server(short_dir, "--command", SH, "--allow-origin", "HTTPS://trusted.example:443/",
                          "--handshake-timeout", "2", listen=["ws:127.0.0.1:0"],
                          expect_browse=1)
    try:
        yield server
    finally:
        server.stop()


def host_port(server: ServerProcess) -> tuple[str, int]:
    host, port = server.addresses[0].split(":", 1)[1].rsplit(":", 1)
    return host, int(port)


def token_of(server: ServerProcess) -> str:
    return server.browse[0].split("#token=", 1)[1]


def http(server: ServerProcess, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the whole response (the server closes, or says its length)."""
    with socket.create_connection(host_port(server), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            data += chunk
        if not data:
            return 0, {}, b""  # closed without an answer
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", "0")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split()[1]), headers, body


def get(server: ServerProcess, path: str, *headers: str) -> tuple[int, dict[str, str], bytes]:
    host = server.addresses[0].split(":", 1)[1]
    extra = "".join(f"{h}\r\n" for h in headers)
    return http(server, f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode())


def upgrade_headers(server: ServerProcess, *extra: str, protocol: str | None = "ttyserve.v1",
                    ) -> list[str]:
    lines = ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", *extra]
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    return lines


def test_the_page_and_its_assets_with_the_security_headers(web_server: ServerProcess) -> None:
    status, headers, body = get(web_server, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'<script type="module" src="/static/page.js">' in body
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    for path, kind in (("/static/ttyserve.js", "text/javascript"),
                       ("/static/vendor/xterm.mjs", "text/javascript"),
                       ("/static/vendor/xterm.css", "text/css")):
        status, headers, body = get(web_server, path)
        assert (status, headers["content-type"].split(";")[0]) == (200, kind)
        assert headers["content-security-policy"] == csp
        assert len(body) == int(headers["content-length"]) > 0


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET /nothing HTTP/1.1\r\nHost: h\r\n\r\n", 404),
    (b"GET /static/../../etc/passwd HTTP/1.1\r\nHost: h\r\n\r\n", 404),
    (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", 405),
    (b"DELETE /ws HTTP/1.1\r\nHost: h\r\n\r\n", 405),
    (b"GET /ws HTTP/1.1\r\nHost: h\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: h\r\n" + b"X-Big: " + b"x" * 17000 + b"\r\n\r\n", 431),
    (b"GET /" + b"a" * 17000 + b" HTTP/1.1\r\nHost: h\r\n\r\n", 414),
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
])
def test_refusals_name_what_was_wrong(web_server: ServerProcess, request_bytes: bytes,
                                      status: int) -> None:
    got, headers, body = http(web_server, request_bytes)
    assert got == status
    assert body.startswith(str(status).encode()) and len(body) > 20  # says why, for people
    if status == 405:
        assert headers["allow"] == "GET"


def test_an_upgrade_without_the_subprotocol_is_400(web_server: ServerProcess) -> None:
    status, _, body = get(web_server, "/ws", *upgrade_headers(web_server, protocol=None))
    assert status == 400 and b"ttyserve.v1" in body
    status, _, _ = get(web_server, "/ws", *upgrade_headers(web_server, protocol="chat, other"))
    assert status == 400


def test_the_origin_check(web_server: ServerProcess) -> None:
    host = web_server.addresses[0].split(":", 1)[1]
    for origin, expected in ((f"http://{host}", 101), ("https://trusted.example", 101),
                             ("https://evil.example", 403), ("null", 403),
                             (f"https://{host}", 403), (None, 101)):
        extra = [f"Origin: {origin}"] if origin is not None else []
        status, headers, _ = get(web_server, "/ws", *upgrade_headers(web_server, *extra))
        assert status == expected, origin
        if expected == 101:
            assert headers["sec-websocket-protocol"] == "ttyserve.v1"


def test_the_browse_line_carries_the_generated_token(web_server: ServerProcess) -> None:
    host, port = host_port(web_server)
    assert web_server.browse == [f"http://{host}:{port}/#token={token_of(web_server)}"]
    assert len(token_of(web_server)) >= 32


@pytest.mark.asyncio
async def test_the_token_is_required_and_a_configured_one_is_never_printed(
        web_server: ServerProcess, short_dir: Path) -> None:
    address = web_server.addresses[0]
    for token in (None, "wrong"):
        with pytest.raises(RequestError) as info:
            await run(["true"], address=address, token=token)
        assert info.value.code == "unauthorized"
    result = await run(["sh", "-c", "echo over-ws"], address=address, token=token_of(web_server))
    assert (result.returncode, result.stdout) == (0, b"over-ws\n")
    token_file = short_dir / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    configured = start_server(short_dir, "--token-file", str(token_file),
                              listen=["ws:127.0.0.1:0"])
    try:
        assert configured.browse == []  # stdout had only its `listening` line
        result = await run(["true"], address=configured.addresses[0], token=TOKEN)
        assert result.returncode == 0
    finally:
        configured.stop()
    assert TOKEN not in configured.stderr_tail()


def test_beyond_loopback_a_web_listener_needs_tls(short_dir: Path) -> None:
    server = start_server(short_dir, listen=["ws:0.0.0.0:0"], expect_lines=0)
    assert server.wait() == ServeExit.CONFIG
    assert "wss:" in server.stderr_tail()


async def ws_client(server: ServerProcess) -> tuple[anyio.abc.SocketStream, WSConnection]:
    host, port = host_port(server)
    stream = await anyio.connect_tcp(host, port)
    ws = WSConnection(ConnectionType.CLIENT)
    await stream.send(ws.send(Request(host=f"{host}:{port}", target="/ws",
                                      subprotocols=["ttyserve.v1"])))
    while True:
        ws.receive_data(await stream.receive())
        events = list(ws.events())
        if any(isinstance(e, AcceptConnection) for e in events):
            return stream, ws
        assert not any(isinstance(e, RejectConnection) for e in events)


async def until_closed(stream: anyio.abc.SocketStream, ws: WSConnection,
                       ) -> tuple[list[dict[str, object]], int | None]:
    """Control messages received, and the close code, until the server closes."""
    messages: list[dict[str, object]] = []
    decoder = FrameDecoder()
    with anyio.fail_after(10):
        while True:
            try:
                data = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return messages, None
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, BytesMessage):
                    for frame in decoder.feed(event.data):
                        if frame.kind is FrameKind.CTRL_OUT:
                            messages.append(parse_object(frame.payload)[1])
                elif isinstance(event, CloseConnection):
                    return messages, event.code


def hello(token: str) -> bytes:
    return encode_frame(FrameKind.CTRL_IN, 0, encode_message(Hello(protocol=1, token=token)))


@pytest.mark.asyncio
async def test_a_text_message_is_a_protocol_error_closed_with_1002(
        web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    async with stream:
        await stream.send(ws.send(BytesMessage(data=hello(token_of(web_server)))))
        await stream.send(ws.send(TextMessage(data='{"type": "open"}')))
        messages, code = await until_closed(stream, ws)
    assert [m["type"] for m in messages] == ["welcome", "error"]
    assert messages[-1]["code"] == "protocol_error" and code == 1002


@pytest.mark.asyncio
async def test_a_message_that_ends_inside_a_frame_is_closed_with_1002(
        web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    frame = hello(token_of(web_server))
    async with stream:
        await stream.send(ws.send(BytesMessage(data=frame[:-3])))  # the rest never comes
        messages, code = await until_closed(stream, ws)
    assert messages[-1]["code"] == "protocol_error" and code == 1002


@pytest.mark.asyncio
async def test_several_frames_in_one_message_and_a_frame_split_over_fragments(
        web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    opening = b"".join(opening_frames(web_server))
    async with stream:  # one message, sent as two WebSocket fragments cutting a frame in two
        await stream.send(ws.send(BytesMessage(data=opening[:20], message_finished=False)))
        await stream.send(ws.send(BytesMessage(data=opening[20:], message_finished=True)))
        messages, code = await until_closed(stream, ws)
    assert [m["type"] for m in messages] == ["welcome", "opened", "exit"]
    assert messages[-1]["code"] == 2 and code == 1000


@pytest.mark.asyncio
async def test_the_handshake_deadline_and_max_frame_apply(web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    async with stream:  # says nothing: dropped after --handshake-timeout 2
        messages, code = await until_closed(stream, ws)
    assert messages[-1]["code"] == "protocol_error" and code == 1002
    stream, ws = await ws_client(web_server)
    oversize = bytes([3]) + (0).to_bytes(4, "big") + ((1 << 20) + 1).to_bytes(4, "big")
    async with stream:
        await stream.send(ws.send(BytesMessage(data=hello(token_of(web_server)) + oversize)))
        messages, code = await until_closed(stream, ws)
    assert "max_frame" in str(messages[-1]["message"]) and code == 1002


@pytest.mark.asyncio
async def test_multiplexing_with_credit_over_a_websocket(web_server: ServerProcess) -> None:
    payload = os.urandom(2 << 20)
    async with connect(web_server.addresses[0], token=token_of(web_server), multiplex=True,
                       window=64 * 1024) as conn:
        results = await echo_through_cat(conn, 3, payload)
        starved = await conn.spawn(["yes"], pty=False)  # nobody reads it: others go on
        assert (await (await conn.spawn(["sh", "-c", "exit 5"], pty=False)).wait()).code == 5
        await starved.cancel()
    assert results == [payload] * 3


@pytest.mark.asyncio
async def test_wss_serves_the_page_and_the_protocol_over_tls(short_dir: Path) -> None:
    tls_files(short_dir)
    server = start_server(short_dir, "--tls-cert", str(short_dir / "cert.pem"), "--tls-key",
                          str(short_dir / "key.pem"), listen=["wss:127.0.0.1:0"],
                          expect_browse=1)
    try:
        assert server.browse[0].startswith("https://127.0.0.1:")
        token = server.browse[0].split("#token=", 1)[1]
        result = await run(["sh", "-c", "echo secure"], address=server.addresses[0],
                           token=token, tls=client_tls_context(str(short_dir / "ca.pem")))
        assert result.stdout == b"secure\n"
        context = ssl.create_default_context(cafile=str(short_dir / "ca.pem"))
        host, port = host_port(server)
        with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(
                raw, server_hostname=host) as sock:
            sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200") and b"wss://" in head
    finally:
        server.stop()


@pytest.mark.asyncio
async def test_max_connections_applies_to_web_listeners(short_dir: Path) -> None:
    server = start_server(short_dir, "--max-connections", "1", listen=["ws:127.0.0.1:0"],
                          expect_browse=1)
    try:
        first, ws = await ws_client(server)
        async with first:
            status, _, _ = get(server, "/")  # a second connection: closed without an answer
            assert status == 0
            await first.send(ws.send(CloseConnection(code=1000)))
            await until_closed(first, ws)  # the server has let the first one go
        assert await wait_until(lambda: get(server, "/")[0] == 200, timeout=10)
    finally:
        server.stop()


def test_origins_compare_as_browsers_compare_them(web_server: ServerProcess) -> None:
    host, port = host_port(web_server)
    for origin, expected in ((f"HTTP://{host.upper()}:{port}/", 101),
                             ("https://TRUSTED.example:443", 101),
                             (f"http://{host}:{port + 1}", 403), (f"ws://{host}:{port}", 403)):
        status, _, _ = get(web_server, "/ws", *upgrade_headers(web_server, f"Origin: {origin}"))
        assert status == expected, origin


def test_a_loopback_listener_refuses_another_host_name(web_server: ServerProcess) -> None:
    _, port = host_port(web_server)
    host = f"Host: rebound.example:{port}"
    request = "\r\n".join(["GET /ws HTTP/1.1", host, *upgrade_headers(web_server),
                            f"Origin: http://rebound.example:{port}", "", ""]).encode()
    status, _, body = http(web_server, request)
    assert status == 403 and b"rebinding" in body
    for name in ("localhost", "[::1]"):
        request = "\r\n".join(["GET /ws HTTP/1.1", f"Host: {name}:{port}",
                                *upgrade_headers(web_server), "", ""]).encode()
        assert http(web_server, request)[0] == 101


@pytest.mark.parametrize("extra, status", [
    (["Content-Length: 3"], 400),
    (["Origin: http://a.example", "Origin: http://b.example"], 400),
    (["Sec-WebSocket-Protocol: chat"], 101),  # ttyserve.v1 is offered in another header line
])
def test_upgrade_header_rules(web_server: ServerProcess, extra: list[str], status: int) -> None:
    assert get(web_server, "/ws", *upgrade_headers(web_server), *extra)[0] == status


def test_bare_newlines_are_counted_as_header_lines(web_server: ServerProcess) -> None:
    request = b"GET / HTTP/1.1\nHost: h\n" + b"X-A: b\n" * 3000 + b"\n"
    assert http(web_server, request)[0] == 431


def test_keep_alive_and_pipelined_requests(web_server: ServerProcess) -> None:
    host = web_server.addresses[0].split(":", 1)[1]
    one = f"GET /static/page.css HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection(host_port(web_server), timeout=10) as sock:
        sock.sendall(one + one)  # pipelined
        data = b""
        while data.count(b"HTTP/1.1 200 OK") < 2:
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        sock.sendall(one)  # and a third on the same connection, later
        more = b""
        while b"HTTP/1.1 200 OK" not in more:
            chunk = sock.recv(65536)
            assert chunk
            more += chunk


def test_a_client_that_resets_during_a_download_harms_nothing(web_server: ServerProcess) -> None:
    host = web_server.addresses[0].split(":", 1)[1]
    for _ in range(5):
        sock = socket.create_connection(host_port(web_server), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(f"GET /static/vendor/xterm.mjs HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        sock.recv(100)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # a reset, in the middle of the 340 KB
    assert get(web_server, "/")[0] == 200
    assert web_server.proc.poll() is None


@pytest.mark.asyncio
async def test_broken_websocket_framing_closes_with_1002_and_pings_are_answered(
        web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    async with stream:
        await stream.send(ws.send(Ping(payload=b"are you there")))
        with anyio.fail_after(10):
            while True:
                ws.receive_data(await stream.receive())
                if any(isinstance(e, Pong) and e.payload == b"are you there"
                       for e in ws.events()):
                    break
        await stream.send(ws.send(BytesMessage(data=hello(token_of(web_server)))))
        await stream.send(bytes([0x80 | 0x40 | 0x2, 0x80, 0, 0, 0, 0]))  # RSV1 set: invalid
        messages, code = await until_closed(stream, ws)
    assert messages[-1]["code"] == "protocol_error" and code == 1002


@pytest.mark.asyncio
async def test_a_websocket_frame_over_the_limit_is_refused_with_1009_before_it_is_read(
        web_server: ServerProcess) -> None:
    """A frame is read whole, so its size is bounded (4 MiB, or two of max_frame's frames):
    one that says it holds more is refused by its header, its payload never awaited."""
    stream, ws = await ws_client(web_server)
    async with stream:
        await stream.send(ws.send(BytesMessage(data=hello(token_of(web_server)))))
        size = 5 << 20
        await stream.send(bytes([0x82, 0x80 | 127]) + size.to_bytes(8, "big") + b"mask")
        messages, code = await until_closed(stream, ws)
    assert [m["type"] for m in messages] == ["welcome", "error"]
    assert messages[-1]["code"] == "protocol_error" and code == 1009


def opening_frames(server: ServerProcess) -> tuple[bytes, bytes]:
    """`hello`, and an `open` of a command that says two and exits 2."""
    return hello(token_of(server)), encode_frame(FrameKind.CTRL_IN, 1, encode_message(
        Open(argv=["sh", "-c", "echo two; exit 2"], pty=False)))


@pytest.mark.asyncio
async def test_frames_that_came_with_the_upgrade_request_are_read(
        web_server: ServerProcess) -> None:
    """The request, `hello` and `open` in one write: the server has them before it reads
    the socket again (which would say nothing more), and answers all the same."""
    host, port = host_port(web_server)
    ws = WSConnection(ConnectionType.CLIENT)
    upgrade = ws.send(Request(host=f"{host}:{port}", target="/ws", subprotocols=["ttyserve.v1"]))
    ws.receive_data(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Protocol: ttyserve.v1\r\n"
                    b"Sec-WebSocket-Accept: " + generate_accept_token(_key(upgrade)) + b"\r\n\r\n")
    list(ws.events())  # (our side of the handshake, done ahead to frame the messages)
    first, second = opening_frames(web_server)
    messages = ws.send(BytesMessage(data=first)) + ws.send(BytesMessage(data=second))
    stream = await anyio.connect_tcp(host, port)
    async with stream:
        await stream.send(upgrade + messages)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += await stream.receive()
        head, rest = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        ws.receive_data(rest)
        controls, code = await until_closed(stream, ws)
    assert [m["type"] for m in controls] == ["welcome", "opened", "exit"]
    assert controls[-1]["code"] == 2 and code == 1000


@pytest.mark.asyncio
async def test_several_messages_in_one_read_are_all_taken(web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    first, second = opening_frames(web_server)
    async with stream:
        await stream.send(ws.send(BytesMessage(data=first)) + ws.send(BytesMessage(data=second)))
        controls, code = await until_closed(stream, ws)
    assert [m["type"] for m in controls] == ["welcome", "opened", "exit"]
    assert controls[-1]["code"] == 2 and code == 1000



def _key(request: bytes) -> bytes:
    return next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key:"))


@pytest.mark.asyncio
async def test_a_close_from_the_client_is_answered(web_server: ServerProcess) -> None:
    stream, ws = await ws_client(web_server)
    async with stream:
        await stream.send(ws.send(BytesMessage(data=hello(token_of(web_server)))))
        decoder = FrameDecoder()
        while not decoder.feed(b"".join(e.data for e in ws.events()
                                       if isinstance(e, BytesMessage))):
            ws.receive_data(await stream.receive())  # until `welcome`
        await stream.send(ws.send(CloseConnection(code=1000)))
        _, code = await until_closed(stream, ws)
    assert code == 1000  # the server's answer, not just the end of the connection
