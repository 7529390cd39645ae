"""A session in another worker, in process: two workers' registries joined by real link
sockets (workers.py), a scripted client on worker 0 whose channel's route is a hop to
worker 1. The hop's rules: what the client sends goes on and what comes back is framed by
the client's own connection; the far worker never sends more than the client granted (and
a link that does is a lost worker, not a broken server); a link that ends under a channel
ends it with exit -1; a writer held over a link is waited for, on an event, when it is
letting go.
"""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest
from helpers import RawPeer, ctrl
from server.workers import Worker, two_workers

from ttyserve.errors import ErrorCode
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import (
    WRITER,
    Attach,
    Attached,
    Detach,
    Hello,
    Offsets,
    Open,
    Window,
    parse_object,
)
from ttyserve.protocol.server import AttachRequested, HelloReceived, ServerConnection
from ttyserve.server.connections import requests
from ttyserve.server.connections.hop import WORKER_LOST
from ttyserve.server.sessions.session import ServerSession

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]
WINDOW = 4096


def hello(window: int | None = None) -> bytes:
    return ctrl(0, Hello(protocol=1, multiplex=True, window=window))


async def control(peer: RawPeer, channel: int | None = None) -> dict[str, object]:
    """The next control message (on ``channel``, if given), skipping other frames."""
    while True:
        frame = await peer.next_frame()
        assert frame is not None, "the connection closed"
        if frame.kind is FrameKind.CTRL_OUT and channel in (None, frame.channel):
            return parse_object(frame.payload)[1]


async def detached_session(worker: Worker, script: str) -> str:
    """Open a detachable session on ``worker`` and leave it detached: its id."""
    async with worker.client() as peer:
        await peer.send(hello() + ctrl(1, Open(argv=["sh", "-c", script], pty=False,
                                                detachable=True)))
        assert (await control(peer))["type"] == "welcome"
        opened = await control(peer, 1)
        assert opened["type"] == "opened", opened
        await peer.send(ctrl(1, Detach()))
        _, last = await output_until_exit(peer, 1)
        assert last["type"] == "detached", last
        return str(opened["session"])


async def output_until_exit(peer: RawPeer, channel: int,
                            window: int | None = None) -> tuple[bytes, dict[str, object]]:
    """The channel's stdout up to its last frame, and that frame; with ``window``, credit is
    given back as the output is read, and no frame may exceed what was granted."""
    out, credit = b"", window
    while True:
        frame = await peer.next_frame()
        assert frame is not None, "the connection closed before the channel's exit"
        if frame.channel != channel:
            continue
        if frame.kind is FrameKind.STDOUT:
            out += frame.payload
            if credit is not None:
                credit -= len(frame.payload)
                assert credit >= 0, "more output than the client granted"
                await peer.send(ctrl(channel, Window(bytes=len(frame.payload))))
                credit += len(frame.payload)
        elif frame.kind is FrameKind.CTRL_OUT:
            message = parse_object(frame.payload)[1]
            if message["type"] in ("exit", "detached"):
                return out, message


async def test_a_channel_whose_session_is_in_another_worker_is_served_over_a_hop(
        tmp_path: Path) -> None:
    """Attach on worker 0 to a session of worker 1: its replay, input that crosses, output
    paced by the client's small window, and the exit after all of it."""
    async with two_workers(tmp_path) as (here, there):
        session = await detached_session(
            there, "printf ready; read line; head -c 200000 /dev/zero | tr '\\0' x; exit 3")
        assert session.startswith("s1.")
        async with here.client() as peer:
            await peer.send(hello(WINDOW) + ctrl(1, Attach(session=session)))
            assert (await control(peer))["type"] == "welcome"
            attached = await control(peer, 1)
            assert attached["type"] == "attached", attached
            await peer.send(encode_frame(FrameKind.STDIN, 1, b"go\n"))
            out, last = await output_until_exit(peer, 1, WINDOW)
        assert out == b"ready" + b"x" * 200000
        assert last == {"type": "exit", "code": 3}


async def test_a_link_that_ends_under_a_channel_ends_it_with_exit_minus_one(
        tmp_path: Path) -> None:
    """The far worker's end of the link goes (as when it dies): the client's channel gets
    exit -1 and why, as its last frame, and its connection goes on."""
    async with two_workers(tmp_path) as (here, there):
        session = await detached_session(there, "printf ready; sleep 30")
        async with here.client() as peer:
            await peer.send(hello() + ctrl(1, Attach(session=session)))
            assert (await control(peer, 1))["type"] == "attached"
            link = there.links[-1]
            link.transport.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[attr-defined]
            _, last = await output_until_exit(peer, 1)
            assert last == {"type": "exit", "code": -1, "error": WORKER_LOST}
            await peer.send(ctrl(2, Open(argv=["true"], pty=False)))
            assert (await control(peer, 2))["type"] == "opened"


async def test_a_far_worker_that_sends_more_than_was_granted_is_a_lost_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Worker 1 is a script here that answers the attach and then sends a frame beyond the
    client's window: the hop's core (the mirror of the client's grants) refuses it, the
    link is dropped (said, for the operator, as the link's fault) and the channel ends
    with exit -1; the client's connection and its other channels go on."""
    async def greedy_worker(sock: socket.socket) -> None:
        core = ServerConnection(1 << 20, 1 << 20)
        size = int.from_bytes(await _exactly(sock, 4), "big")
        await _exactly(sock, size)  # the LinkHello
        while True:
            await anyio.wait_readable(sock)
            data = sock.recv(65536)
            if not data:
                return
            core.receive_data(data)
            while (event := core.next_event()) is not None:
                if isinstance(event, HelloReceived):
                    core.accept_hello("greedy", None)
                elif isinstance(event, AttachRequested):
                    core.attached(event.channel, Attached(
                        session=event.request.session, pid=1, pty=False, dropped=0,
                        offsets=Offsets(), role=WRITER))
                    sock.sendall(b"".join(core.data_to_send()))
                    sock.sendall(encode_frame(FrameKind.STDOUT, event.channel,
                                              b"x" * (WINDOW + 1)))
            if core.pending:
                sock.sendall(b"".join(core.data_to_send()))

    async with two_workers(tmp_path, serve_links={1: greedy_worker}) as (here, _), \
            here.client() as peer:
        await peer.send(hello(WINDOW) + ctrl(1, Attach(session="s1.greedy")))
        assert (await control(peer, 1))["type"] == "attached"
        out, last = await output_until_exit(peer, 1, WINDOW)
        assert out == b""
        assert last == {"type": "exit", "code": -1, "error": WORKER_LOST}
        await peer.send(ctrl(2, Open(argv=["sh", "-c", "printf fine"], pty=False)))
        out, last = await output_until_exit(peer, 2)
        assert (out, last) == (b"fine", {"type": "exit", "code": 0})
    assert "link to worker 1: channel 1: output beyond the credit granted" in caplog.text
    assert "Traceback" not in caplog.text


async def test_a_hop_whose_credit_parts_from_the_clients_is_dropped_as_a_lost_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The one invariant of the two ledgers (the hop's mirror of the client's grants, and
    the client's own) is checked where output is relayed: forced apart here (the client's
    credit spent behind the hop's back), the far worker's output within the hop's credit
    is beyond the client's, and the link is dropped as a lost worker, said so, with no
    fault of the connection's."""
    async with two_workers(tmp_path) as (here, there):
        session = await detached_session(there, "read line; head -c 3000 /dev/zero")
        async with here.client() as peer:
            await peer.send(hello(WINDOW) + ctrl(1, Attach(session=session)))
            assert (await control(peer, 1))["type"] == "attached"
            handler = here.handlers[-1]
            handler.send_output(1, FrameKind.STDOUT, b"y" * (WINDOW - 1000))
            await peer.send(encode_frame(FrameKind.STDIN, 1, b"go\n"))
            out, last = await output_until_exit(peer, 1)
            assert out.startswith(b"y" * (WINDOW - 1000))
            assert last == {"type": "exit", "code": -1, "error": WORKER_LOST}
    assert "link to worker 1 broke the client's protocol" in caplog.text
    assert "Traceback" not in caplog.text


async def until_waiting(session: ServerSession) -> None:
    """Until an attach waits for ``session``'s writer to let go (its event made; nothing
    tells a client so)."""
    with anyio.fail_after(5):
        while session._sink_gone is None:
            await anyio.sleep(0.01)


async def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        await anyio.wait_readable(sock)
        data += sock.recv(size - len(data))
    return data


async def test_an_attach_that_meets_a_writer_letting_go_over_a_link_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer attached from worker 0 holds a session of worker 1; an attach on worker 1
    meets it (session_in_use) and waits, on the session's event, not a poll: the writer's
    client leaves, and the waiting attach is answered `attached` at once (the patience is
    made far longer than the test may take, so only the event can answer it)."""
    monkeypatch.setattr(requests, "LINK_LET_GO", 600)
    async with two_workers(tmp_path) as (here, there):
        session_id = await detached_session(there, "printf ready; sleep 30")
        session: ServerSession = there.registry.sessions.get(session_id)  # type: ignore[assignment]
        async with there.client() as second:
            async with here.client() as first:
                await first.send(hello() + ctrl(1, Attach(session=session_id)))
                assert (await control(first, 1))["type"] == "attached"
                await second.send(hello() + ctrl(1, Attach(session=session_id)))
                assert (await control(second))["type"] == "welcome"
                await until_waiting(session)
            # the first client has gone: its hop closes, the link's writer lets go
            with anyio.fail_after(10):
                answer = await control(second, 1)
            assert answer["type"] == "attached", answer
        assert str(ErrorCode.SESSION_IN_USE) not in str(answer)


async def test_an_attach_that_asks_to_wait_is_answered_when_the_writer_lets_go(
        tmp_path: Path) -> None:
    """`wait` (the HTTP door's stream taking its role back after a write): an attach from
    worker 0 to a session of worker 1 whose writer is attached there is session_in_use at
    once without it, and with it is answered `attached` as soon as that writer lets go
    (the wait asked for is far longer than the test may take: only the event answers)."""
    async with two_workers(tmp_path) as (here, there):
        session_id = await detached_session(there, "printf ready; sleep 30")
        session: ServerSession = there.registry.sessions.get(session_id)  # type: ignore[assignment]
        async with here.client() as waiting:
            async with there.client() as writer:
                await writer.send(hello() + ctrl(1, Attach(session=session_id)))
                assert (await control(writer, 1))["type"] == "attached"
                await waiting.send(hello() + ctrl(1, Attach(session=session_id)))
                assert (await control(waiting))["type"] == "welcome"
                refused = await control(waiting, 1)
                assert refused["code"] == ErrorCode.SESSION_IN_USE, refused
                await waiting.send(ctrl(3, Attach(session=session_id, wait=300)))
                await until_waiting(session)
            with anyio.fail_after(10):  # the writer's client has gone: it let go
                answer = await control(waiting, 3)
            assert answer["type"] == "attached", answer
