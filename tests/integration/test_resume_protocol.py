"""Section 10 on the server, rule by rule, over real sockets: offsets (with and without a ring
overrun), an offset in the future, --keep-ended and `release`, the per-session detached
timeout, and heartbeats on every carriage, including the close after 3 x S of silence."""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
import trustme
from helpers import (
    SH,
    RawPeer,
    ServerProcess,
    control_of,
    ctrl,
    start_server,
    token_file,
    ttyserve_command,
    wait_until,
)

from ttyserve.addresses import parse_address
from ttyserve.client import client_tls_context, connect
from ttyserve.client.dial import open_transport
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Attach, Hello, Offsets, Open, Ping, Release
from ttyserve.transport.streams import PipeTransport

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "resume-token-for-tests"
SCROLLBACK = 4096
# Both streams, in an order the server reads them in (each line waits for the last).
TWO_STREAMS = ("printf 'out-one\\n'; sleep 0.05; printf 'err-one\\n' >&2; sleep 0.05; "
               "printf 'out-two\\n'; sleep 0.05; printf 'err-two\\n' >&2; read wait")


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server(short_dir: Path, ca: trustme.CA) -> Iterator[ServerProcess]:
    """Every listening carriage, a small ring, --keep-ended 2."""
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(short_dir / "cert.pem"))
    cert.private_key_pem.write_to_path(str(short_dir / "key.pem"))
    process = start_server(
        short_dir, "--command", SH, "--scrollback", str(SCROLLBACK), "--keep-ended", "2",
        "--detached-timeout", "600", "--token-file", str(token_file(short_dir, TOKEN)),
        "--tls-cert", str(short_dir / "cert.pem"), "--tls-key", str(short_dir / "key.pem"),
        listen=[f"unix:{short_dir / 's.sock'}", "tcp:127.0.0.1:0", "tls:127.0.0.1:0",
                "ws:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


def address_of(server: ServerProcess, scheme: str) -> str:
    return next(a for a in server.addresses if a.startswith(scheme + ":"))


@contextlib.asynccontextmanager
async def peer(server: ServerProcess, ca: trustme.CA, short_dir: Path, scheme: str = "unix",
               **hello: object) -> AsyncIterator[RawPeer]:
    """A raw peer over ``scheme``, its `hello` sent (multiplexed) and `welcome` read."""
    if scheme == "stdio":
        async with stdio_peer() as raw:
            await raw.send(ctrl(0, Hello(protocol=1, multiplex=True, **hello)))  # type: ignore[arg-type]
            yield raw
        return
    context: ssl.SSLContext | None = None
    if scheme == "tls":
        ca.cert_pem.write_to_path(str(short_dir / "ca.pem"))
        context = client_tls_context(str(short_dir / "ca.pem"))
    transport = await open_transport(parse_address(address_of(server, scheme)), context)
    try:
        raw = RawPeer(transport)
        await raw.send(ctrl(0, Hello(protocol=1, token=TOKEN, multiplex=True, **hello)))  # type: ignore[arg-type]
        yield raw
    finally:
        await transport.aclose()


@contextlib.asynccontextmanager
async def stdio_peer() -> AsyncIterator[RawPeer]:
    """`serve --stdio` as a child whose stdin and stdout are the peer's transport."""
    to_server, from_us = os.pipe()
    from_server, to_us = os.pipe()
    process = await anyio.open_process(
        ttyserve_command("serve", "--stdio", "--command", SH), stdin=to_server, stdout=to_us)
    os.close(to_server)
    os.close(to_us)
    transport = PipeTransport(from_server, from_us)
    try:
        yield RawPeer(transport)
    finally:
        await transport.aclose()
        with anyio.fail_after(10):
            await process.wait()


async def stream_output(raw: RawPeer, channel: int) -> tuple[list[tuple[FrameKind, bytes]],
                                                                dict[str, object]]:
    """Output frames of ``channel`` until its next control message, and that message."""
    chunks = []
    while True:
        frame = await raw.next_frame()
        assert frame is not None, "closed"
        if frame.channel != channel:
            continue
        if frame.kind is FrameKind.CTRL_OUT:
            return chunks, control_of(frame)
        chunks.append((frame.kind, frame.payload))


def joined(chunks: list[tuple[FrameKind, bytes]], kind: FrameKind) -> bytes:
    return b"".join(data for k, data in chunks if k is kind)


async def produced(address: str) -> tuple[str, bytes, bytes]:
    """A detachable session that printed on both streams, detached: its id and output."""
    async with connect(address, token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", TWO_STREAMS], pty=False, detachable=True)
        out = err = b""
        while not (out.endswith(b"out-two\n") and err.endswith(b"err-two\n")):
            chunk = await session.receive()
            assert chunk is not None
            if chunk.stream == "stdout":
                out += chunk.data
            else:
                err += chunk.data
        assert session.offsets == Offsets(stdout=len(out), stderr=len(err))
        await session.detach()
        assert session.id is not None
        return session.id, out, err


async def test_attach_at_offsets_sends_each_stream_from_there_in_production_order(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    session_id, out, err = await produced(server.addresses[0])
    async with peer(server, ca, short_dir) as raw:
        await raw.next_control()  # welcome
        await raw.send(ctrl(1, Attach(session=session_id)))  # no offsets: the whole ring
        attached = await raw.next_control()
        assert attached["type"] == "attached" and attached["offsets"] == {"stdout": 0, "stderr": 0}
        await raw.send(ctrl(1, {"type": "detach"}))
        whole, detached = await stream_output(raw, 1)
        assert detached["type"] == "detached"
        await raw.send(ctrl(2, Attach(session=session_id, offsets=Offsets(stdout=4, stderr=8))))
        assert (await raw.next_control())["offsets"] == {"stdout": 4, "stderr": 8}
        await raw.send(ctrl(2, {"type": "detach"}))
        chunks, detached = await stream_output(raw, 2)
    assert detached["type"] == "detached"
    assert joined(chunks, FrameKind.STDOUT) == out[4:] == b"one\nout-two\n"
    assert joined(chunks, FrameKind.STDERR) == err[8:] == b"err-two\n"
    # The order across the streams is the order they were produced in: the whole replay's,
    # less what was asked not to be sent (all of `err-one`).
    out_, err_ = FrameKind.STDOUT, FrameKind.STDERR
    assert [k for k, _ in whole] == [out_, err_, out_, err_]
    assert chunks == [(out_, b"one\n"), (out_, b"out-two\n"), (err_, b"err-two\n")]


async def test_an_offset_the_ring_dropped_begins_where_it_holds_and_says_so(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", "seq 1 20000; read wait"], pty=False,
                                   detachable=True)
        full = b"".join(b"%d\n" % n for n in range(1, 20001))
        received = b""
        while len(received) < len(full):
            chunk = await session.receive()
            assert chunk is not None
            received += chunk.data
        await session.detach()
    assert received == full
    async with peer(server, ca, short_dir) as raw:
        await raw.next_control()
        await raw.send(ctrl(1, Attach(session=session.id or "", offsets=Offsets(stdout=10))))
        attached = await raw.next_control()
        begins = attached["offsets"]["stdout"]  # type: ignore[index]
        assert begins > 10 and len(full) - begins <= SCROLLBACK  # 10..begins is lost
        await raw.send(ctrl(1, {"type": "cancel"}))
    async with peer(server, ca, short_dir) as raw:  # (cancelled: gone)
        await raw.next_control()
        await raw.send(ctrl(1, Attach(session=session.id or "")))
        assert (await raw.next_control())["code"] == "no_such_session"


async def test_an_offset_in_the_future_is_bad_request_and_changes_nothing(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    session_id, out, err = await produced(server.addresses[0])
    async with peer(server, ca, short_dir) as holder:
        await holder.next_control()
        await holder.send(ctrl(1, Attach(session=session_id, offsets=Offsets(stdout=len(out)))))
        assert (await holder.next_control())["type"] == "attached"
        async with peer(server, ca, short_dir) as raw:
            await raw.next_control()
            for channel, offsets in ((5, Offsets(stdout=len(out) + 1)),
                                     (6, Offsets(stderr=len(err) + 1))):
                await raw.send(ctrl(channel, Attach(session=session_id, steal=True,
                                                    offsets=offsets)))
                refusal = await raw.next_control()
                assert refusal["code"] == "bad_request", refusal
                assert "beyond" in str(refusal["message"])
        # The steal was refused before it took anything: the holder is still attached.
        await holder.send(ctrl(1, {"type": "detach"}))
        _, detached = await stream_output(holder, 1)
        assert detached == {"type": "detached"}


async def test_an_ended_session_is_kept_for_keep_ended_then_released(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    async with peer(server, ca, short_dir) as raw:
        await raw.next_control()
        await raw.send(ctrl(1, Open(argv=[SH, "-c", "echo bye; exit 7"], pty=False,
                                    detachable=True)))
        opened = await raw.next_control()
        chunks, exit_message = await stream_output(raw, 1)
        assert exit_message == {"type": "exit", "code": 7}
        # The exit was sent, but this client "lost" it: it attaches again at its offsets.
        await raw.send(ctrl(2, Attach(session=str(opened["session"]),
                                      offsets=Offsets(stdout=len(b"bye\n")))))
        assert (await raw.next_control())["offsets"] == {"stdout": 4, "stderr": 0}
        chunks, again = await stream_output(raw, 2)
        assert chunks == [] and again == exit_message
        await raw.send(ctrl(0, Release(session=str(opened["session"]))))
        await raw.send(ctrl(3, Attach(session=str(opened["session"]))))
        assert (await raw.next_control())["code"] == "no_such_session"
        # Not released: gone once --keep-ended (2 s) has passed since the exit went out.
        await raw.send(ctrl(4, Open(argv=["true"], pty=False, detachable=True)))
        session = str((await raw.next_control())["session"])
        assert (await stream_output(raw, 4))[1]["type"] == "exit"

    async def gone() -> bool:
        async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
            return all(info.session != session for info in await conn.list_sessions())

    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        (kept,) = [s for s in await conn.list_sessions() if s.session == session]
        assert kept.exit == {"code": 0}
    with anyio.fail_after(10):
        while not await gone():
            await anyio.sleep(0.1)


async def test_a_session_hangs_up_after_its_own_detached_timeout(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    async with peer(server, ca, short_dir) as raw:
        await raw.next_control()
        for timeout, detachable in ((601, True), (5, False)):  # over the server's; no detach
            await raw.send(ctrl(1 if detachable else 2, Open(
                argv=["sleep", "30"], pty=False, detachable=detachable,
                detached_timeout=timeout)))
            refusal = await raw.next_control()
            assert refusal["code"] == "bad_request", refusal
        await raw.send(ctrl(3, Open(argv=["sleep", "30"], pty=False, detachable=True,
                                    detached_timeout=1)))
        pid = int((await raw.next_control())["pid"])  # type: ignore[call-overload]
        await raw.send(ctrl(3, {"type": "detach"}))
        assert (await raw.next_control())["type"] == "detached"
        # Hung up within a second of its 1 s deadline, not the server's 600 s.
        assert await wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=5)


@pytest.mark.parametrize("scheme", ["unix", "tcp", "tls", "ws", "stdio"])
async def test_heartbeats_on_every_carriage(server: ServerProcess, ca: trustme.CA,
                                            short_dir: Path, scheme: str) -> None:
    async with peer(server, ca, short_dir, scheme, heartbeat=1) as raw:
        welcome = await raw.next_control()
        assert welcome["type"] == "welcome" and welcome["heartbeat"] == 1
        with anyio.fail_after(3):  # we said nothing since hello: the server pings
            assert await raw.next_control() == {"type": "ping"}
        await raw.send(ctrl(0, Ping()))
        with anyio.fail_after(3):  # the answer, after any ping the server sent meanwhile
            answers = [await raw.next_control()]
            while answers[-1] == {"type": "ping"}:
                answers.append(await raw.next_control())
        assert answers[-1] == {"type": "pong"}


async def test_without_heartbeat_no_ping_but_a_ping_is_answered(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    async with peer(server, ca, short_dir) as raw:
        welcome = await raw.next_control()
        assert "heartbeat" not in welcome
        await raw.send(ctrl(0, Ping()))
        assert await raw.next_control() == {"type": "pong"}
        with anyio.move_on_after(2.5) as quiet:  # longer than any heartbeat the tests use
            await raw.next_frame()
        assert quiet.cancelled_caught


@pytest.mark.parametrize("scheme", ["unix", "tcp"])
async def test_a_silent_peer_is_closed_after_three_heartbeats(
        server: ServerProcess, ca: trustme.CA, short_dir: Path, scheme: str) -> None:
    """A real socket that stops reading and writing: its detachable session is detached, its
    other one cancelled, after 3 x S of silence and not before."""
    async with peer(server, ca, short_dir, scheme, heartbeat=1) as raw:
        await raw.next_control()
        await raw.send(ctrl(1, Open(argv=["sleep", "60"], pty=False, detachable=True)))
        kept = await raw.next_control()
        await raw.send(ctrl(2, Open(argv=["sleep", "60"], pty=False)))
        plain = int((await raw.next_control())["pid"])  # type: ignore[call-overload]
        silent_since = anyio.current_time()  # from here on, nothing is read or written
        assert await wait_until(lambda: not os.path.exists(f"/proc/{plain}"), timeout=10)
        silence = anyio.current_time() - silent_since
        assert 2.9 <= silence <= 5, silence
    async with connect(address_of(server, scheme), token=TOKEN, multiplex=True) as conn:
        (info,) = [s for s in await conn.list_sessions() if s.session == kept["session"]]
        assert info.attached is False and info.exit is None  # detached, still running
        again = await conn.attach(str(kept["session"]))
        await again.cancel()



async def test_a_client_whose_input_we_do_not_read_is_not_taken_for_dead(
        server: ServerProcess, ca: trustme.CA, short_dir: Path) -> None:
    """The server stops reading a connection without windows while its process does not take
    its input: the client's bytes then wait unread in the socket, and they count as heard.
    For longer than 3 x S the connection lives on (the server's pings keep coming)."""
    async with peer(server, ca, short_dir, heartbeat=1) as raw:
        await raw.next_control()
        await raw.send(ctrl(1, Open(argv=["sleep", "60"], pty=False)))
        pid = int((await raw.next_control())["pid"])  # type: ignore[call-overload]
        stuffing = encode_frame(FrameKind.STDIN, 1, b"x" * 65536)
        sent = 0
        with anyio.move_on_after(2):  # until the server stops reading and the socket fills
            while sent < (8 << 20):
                await raw.send(stuffing)  # (whole frames: a cut one is never resumed)
                sent += len(stuffing)
        assert sent > (1 << 20)  # past the 1 MiB the server queues for the process
        pings = 0
        with anyio.move_on_after(5):  # watching for a close that must not come
            while (frame := await raw.next_frame()) is not None:
                pings += frame.kind is FrameKind.CTRL_OUT
        assert frame is not None and pings >= 3, pings  # no close: the server kept pinging
        assert os.path.exists(f"/proc/{pid}")
