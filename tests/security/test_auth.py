"""Hardening acceptance 1: tokens on TCP and TLS, certificate checks, uids on Unix sockets."""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import trustme
from helpers import RawPeer, ServerProcess, ctrl, start_server

from ttyserve.addresses import Address
from ttyserve.client import client_tls_context, run
from ttyserve.client.dial import open_transport
from ttyserve.errors import RequestError
from ttyserve.protocol.messages import Hello, parse_object

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def ca(short_dir: Path) -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def secure_server(short_dir: Path, ca: trustme.CA) -> Iterator[ServerProcess]:
    """TCP and TLS on loopback, a token, and a certificate made just now."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.cert_chain_pems[0].write_to_path(str(short_dir / "cert.pem"))
    cert.private_key_pem.write_to_path(str(short_dir / "key.pem"))
    token_file = short_dir / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server = start_server(short_dir, "--token-file", str(token_file),
                          "--tls-cert", str(short_dir / "cert.pem"),
                          "--tls-key", str(short_dir / "key.pem"), "--command", "/bin/sh",
                          listen=["tcp:127.0.0.1:0", "tls:127.0.0.1:0",
                                  f"unix:{short_dir / 's.sock'}"])
    try:
        yield server
    finally:
        server.stop()


def address(server: ServerProcess, scheme: str) -> str:
    return next(a for a in server.addresses if a.startswith(scheme + ":"))


def trusting(ca: trustme.CA, short_dir: Path) -> ssl.SSLContext:
    ca.cert_pem.write_to_path(str(short_dir / "ca.pem"))
    return client_tls_context(str(short_dir / "ca.pem"))


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
async def test_right_token_runs(secure_server: ServerProcess, scheme: str, ca: trustme.CA,
                                short_dir: Path) -> None:
    tls = trusting(ca, short_dir) if scheme == "tls" else None
    result = await run(["echo", "in"], address=address(secure_server, scheme), token=TOKEN,
                       tls=tls)
    assert (result.status.code, result.stdout) == (0, b"in\n")


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", ""])
async def test_missing_or_wrong_token_is_unauthorized(secure_server: ServerProcess, scheme: str,
                                                      token: str | None, ca: trustme.CA,
                                                      short_dir: Path) -> None:
    tls = trusting(ca, short_dir) if scheme == "tls" else None
    with pytest.raises(RequestError) as info:
        await run(["echo", "in"], address=address(secure_server, scheme), token=token, tls=tls)
    assert info.value.code == "unauthorized"
    assert info.value.retriable is False
    assert "unauthorized" in secure_server.stderr_tail()


async def test_tls_client_refuses_an_untrusted_certificate(secure_server: ServerProcess) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await run(["true"], address=address(secure_server, "tls"), token=TOKEN)


async def test_tls_client_refuses_a_certificate_for_another_name(short_dir: Path,
                                                                 ca: trustme.CA) -> None:
    cert = ca.issue_cert("other.example")
    cert.cert_chain_pems[0].write_to_path(str(short_dir / "cert.pem"))
    cert.private_key_pem.write_to_path(str(short_dir / "key.pem"))
    server = start_server(short_dir, "--tls-cert", str(short_dir / "cert.pem"),
                          "--tls-key", str(short_dir / "key.pem"), listen=["tls:127.0.0.1:0"],
                          env={"TTYSERVE_TOKEN": TOKEN})
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            await run(["true"], address=server.addresses[0], token=TOKEN,
                      tls=trusting(ca, short_dir))
    finally:
        server.stop()


async def test_guessing_tokens_slows_to_a_crawl(secure_server: ServerProcess) -> None:
    tcp = address(secure_server, "tcp")
    timings = []
    for _ in range(8):
        started = time.monotonic()
        with pytest.raises(RequestError):
            await run(["true"], address=tcp, token="guess")
        timings.append(time.monotonic() - started)
    assert max(timings[:5]) < 0.5  # the first failures are answered at once
    assert timings[-1] >= 1.5  # then each answer waits longer: 0.5 s, 1 s, 2 s, ...
    assert timings[-1] > timings[-2] > timings[-3]


async def test_failed_tls_handshakes_leave_the_server_healthy(secure_server: ServerProcess,
                                                              ca: trustme.CA,
                                                              short_dir: Path) -> None:
    import socket

    host, port = address(secure_server, "tls").removeprefix("tls:").rsplit(":", 1)
    for _ in range(5):  # plaintext on a TLS port: each handshake fails
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n" * 10)
            with contextlib.suppress(ConnectionResetError):
                while sock.recv(4096):
                    continue  # read to the server's close
    for _ in range(10):  # descriptors the failed handshakes used are reused without harm
        result = await run(["echo", "ok"], address=address(secure_server, "unix"))
        assert result.stdout == b"ok\n"
    tls = trusting(ca, short_dir)
    result = await run(["echo", "tls"], address=address(secure_server, "tls"), token=TOKEN,
                       tls=tls)
    assert result.stdout == b"tls\n"
    assert "used by transport" not in secure_server.stderr_tail()


async def test_a_throttled_hello_still_has_to_open_in_time(short_dir: Path) -> None:
    token_file = short_dir / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    server = start_server(short_dir, "--token-file", str(token_file), "--handshake-timeout",
                          "1", listen=["tcp:127.0.0.1:0"])
    try:
        for _ in range(6):  # past the free failures: the next hello is held back
            with pytest.raises(RequestError):
                await run(["true"], address=server.addresses[0], token="guess")
        host, port = server.addresses[0].removeprefix("tcp:").rsplit(":", 1)
        transport = await open_transport(Address("tcp", host=host, port=int(port)))
        try:
            peer = RawPeer(transport)
            await peer.send(ctrl(0, Hello(protocol=1, token=TOKEN)))  # and then no `open`
            started = time.monotonic()
            with anyio.fail_after(10):
                frames = await peer.frames_until_eof()
        finally:
            await transport.aclose()
        messages = [parse_object(f.payload)[1] for f in frames]
        assert [m["type"] for m in messages] == ["welcome", "error"]
        assert messages[1]["code"] == "protocol_error" and "open" in str(messages[1]["message"])
        assert time.monotonic() - started < 8
    finally:
        server.stop()
