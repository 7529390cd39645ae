"""The attachment's gate: replay first, then live output, with no gap and no duplicate.

With no event loop, the gate's steps one at a time; then the race itself, forced: an
in-process server whose memory-backend process always has output ready while an attach
replays its ring through a small window, so live output is there to overtake the replay
at every step the replay waits for credit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from backends.memory import counted, open_memory_backend
from helpers import running_server, wait_until
from server.fakes import Wire, controls, make_session, output

from ttyserve.client import connect
from ttyserve.protocol.frames import FrameKind
from ttyserve.server.channels.attachment import Attachment
from ttyserve.server.sessions.pump import Stall
from ttyserve.server.sessions.session import ServerSession


def test_until_the_replay_is_over_the_attachment_takes_no_live_output() -> None:
    session, process = make_session(pty=True)
    (stdout,) = session.start_output()
    process.stdout.write(b"old")
    assert stdout.step() is Stall.READABLE  # detached: into the ring
    wire = Wire(window=2)
    channel = wire.open_channel()
    attachment = Attachment.attach(wire, channel, session)
    frames = wire.frames()
    assert [c["type"] for c in controls(frames, channel)] == ["attached"]
    assert output(frames, channel) == b"ol"  # the replay, within the credit
    process.stdout.write(b"new")
    assert attachment.limit() == 0 and stdout.step() is Stall.SINK  # one byte held at most
    assert bytes(process.stdout.buffered) == b"ew"
    wire.core.receive_data(_window(channel, 100))
    wire.core.next_event()
    attachment.resume()  # the rest of the replay, then the gate opens
    assert attachment.live and attachment.limit() > 0
    assert stdout.step() is Stall.READABLE
    assert output(wire.frames(), channel) == b"dnew"


def test_a_steal_replays_before_the_byte_the_last_writer_left_held() -> None:
    """The previous writer had no credit, so its pump holds a byte read ahead; made the sink
    of a new channel, the session resumes that pump at once, before the replay went out:
    only the gate keeps the byte behind the replay."""
    session, process = make_session(pty=True, watchable=True)
    assert session.start_output() == []  # run from readiness callbacks
    wire = Wire(window=3)
    first = wire.opened(session)
    process.stdout.write(b"abcde")
    process.stdout.ready()  # "abc": the credit is spent, the pump stops watching
    session.sink_ready()  # resumed by the connection's send queue, say: still no credit
    process.stdout.ready()  # so "d" is read ahead and held
    assert output(wire.frames(), first.channel) == b"abc"
    assert bytes(process.stdout.buffered) == b"e"
    channel = wire.open_channel()
    registry_steal(session)
    attachment = Attachment.attach(wire, channel, session)  # 3 bytes of credit: the ring's
    wire.core.receive_data(_window(channel, 100))
    wire.core.next_event()
    attachment.resume()
    process.stdout.ready()
    frames = [f for f in wire.frames() if f.channel == channel]
    assert [c["type"] for c in controls(frames, channel)][:1] == ["attached"]
    assert output(frames, channel) == b"abcde"  # the ring's "abc", then "d" and "e"


def registry_steal(session: ServerSession) -> None:
    """What SessionRegistry.attach does to the writer of a session attached with steal."""
    previous = session.sink
    assert previous is not None
    session.sink = None
    previous.release("stolen")


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_live_output_never_overtakes_the_replay(sock_path: Path) -> None:
    scrollback = 16 * 1024
    expected = counted(0, 200_000)  # far more than the test reads
    async with open_memory_backend() as backend, running_server(
            sock_path, backend=backend, scrollback=scrollback) as (server, address):
        async with connect(address, multiplex=True) as conn:
            session = await conn.spawn(["count"], pty=False, detachable=True)
            first = b""
            while len(first) < 10_000:
                chunk = await session.receive()
                assert chunk is not None
                first += chunk.data
            await session.detach()
        assert expected.startswith(first)
        # Detached, the process runs on into the ring (it never blocks), past its size.
        ring = server.registry.sessions[session.id or ""].ring
        assert ring is not None and await wait_until(lambda: ring.dropped > 0, timeout=10)
        async with connect(address, multiplex=True, window=2048) as conn:
            again = await conn.attach(session.id or "")
            received = b""
            while len(received) < 8 * scrollback:
                chunk = await again.receive()
                assert chunk is not None
                received += chunk.data
            await again.cancel()
    assert again.dropped > 0  # the ring had wrapped: the replay began where it held
    assert received == expected[again.dropped:again.dropped + len(received)]


def _window(channel: int, size: int) -> bytes:
    from ttyserve.protocol.frames import encode_frame
    from ttyserve.protocol.messages import Window, encode_message

    return encode_frame(FrameKind.CTRL_IN, channel, encode_message(Window(bytes=size)))
