"""Acceptance: many sessions on one multiplexed connection, checked on the wire.

200 at once, PTY and pipe mixed, each with its own output and exit and nothing
after the exit; then 100,000 short ones in a row with the server's memory flat.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SH, ServerProcess, ctrl, raw_peer, split_output, start_server

from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Hello, Open, parse_object

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("workers")]
WINDOW = 1 << 20


@pytest.fixture
def roomy_server(short_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(short_dir, "--command", SH, "--max-sessions-per-connection", "512",
                          "--linger", "1")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(120)
async def test_200_sessions_pty_and_pipe_mixed_on_one_connection(
        roomy_server: ServerProcess) -> None:
    count = 200
    opens = b"".join(
        ctrl(ch, Open(argv=[SH, "-c", f"echo out-{ch}; exit {ch % 256}"], pty=ch % 2 == 0))
        for ch in range(1, count + 1))
    async with raw_peer(roomy_server.addresses[0]) as peer:
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True, window=WINDOW)) + opens)
        frames = []
        exits = 0
        while exits < count:
            frame = await peer.next_frame()
            assert frame is not None, "the connection closed early"
            frames.append(frame)
            if frame.kind is FrameKind.CTRL_OUT and b'"exit"' in frame.payload:
                exits += 1
    for ch in range(1, count + 1):
        out, err, controls = split_output(frames, ch)
        assert out.replace(b"\r\n", b"\n") == b"out-%d\n" % ch
        assert err == b""
        assert [c["type"] for c in controls] == ["opened", "exit"]
        assert controls[-1]["code"] == ch % 256
        last = max(i for i, f in enumerate(frames) if f.channel == ch)
        assert frames[last].kind is FrameKind.CTRL_OUT  # the exit is the channel's last frame
    assert not any(f.kind is FrameKind.STDERR and f.channel % 2 == 0 for f in frames)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_100000_short_sessions_leave_the_server_memory_flat(
        roomy_server: ServerProcess) -> None:
    total, in_flight, warm_up = 100_000, 48, 20_000
    request = Open(argv=["true"], pty=False)
    async with raw_peer(roomy_server.addresses[0]) as peer:
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True, window=WINDOW)))
        next_channel = 1
        ended = 0
        codes: collections.Counter[object] = collections.Counter()
        rss_after_warm_up = 0

        async def open_more(how_many: int) -> None:
            nonlocal next_channel
            batch = []
            for _ in range(how_many):
                if next_channel <= total:
                    batch.append(ctrl(next_channel, request))
                    next_channel += 1
            if batch:
                await peer.send(b"".join(batch))

        await open_more(in_flight)
        while ended < total:
            frame = await peer.next_frame()
            assert frame is not None, "the connection closed early"
            if frame.kind is not FrameKind.CTRL_OUT or frame.channel == 0:
                continue
            message = parse_object(frame.payload)[1]
            if message["type"] == "exit":
                codes[message["code"]] += 1
                ended += 1
                if ended == warm_up:
                    rss_after_warm_up = roomy_server.rss_kib()
                await open_more(1)
            else:
                assert message["type"] in ("opened", "window"), message
        rss_at_end = roomy_server.rss_kib()
    assert codes == {0: total}
    # 80,000 sessions after the warm-up: one leaked object per session (56 bytes at the
    # least, with its slot) would be 4.3 MiB; the allocator's own drift stays near 2 MiB.
    assert rss_at_end - rss_after_warm_up < 4096, (rss_after_warm_up, rss_at_end)
