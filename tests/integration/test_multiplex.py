"""Multiplexed connections: many sessions, one channel each, credit per channel (section 7)."""

from __future__ import annotations

import anyio
import pytest
from helpers import SH, ServerProcess, ctrl, raw_peer, split_output

from ttyserve.client import connect
from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Hello, Open, Window

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]
WINDOW = 65536


async def test_many_sessions_on_one_connection(server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0], multiplex=True, window=WINDOW) as conn:
        sessions = [await conn.spawn([SH, "-c", f"seq 1 {20000 + i}"], pty=False)
                    for i in range(10)]
        outputs = []
        for session in sessions:
            outputs.append(b"".join([chunk.data async for chunk in session]))
            assert session.status is not None and session.status.code == 0
    for i, out in enumerate(outputs):
        assert out == b"".join(b"%d\n" % n for n in range(1, 20001 + i))


async def test_a_stalled_channel_gets_no_more_than_its_window(
        server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True, window=WINDOW))
                        + ctrl(1, Open(argv=["yes"], pty=False))
                        + ctrl(2, Open(argv=[SH, "-c", "seq 1 5000"], pty=False)))
        frames = []
        while not any(c.get("type") == "exit" for c in split_output(frames, 2)[2]):
            frame = await peer.next_frame()
            assert frame is not None
            frames.append(frame)
        # The other session ran to its end while `yes` had used up its credit.
        assert split_output(frames, 2)[0] == b"".join(b"%d\n" % n for n in range(1, 5001))
        stalled = len(split_output(frames, 1)[0])
        assert 0 < stalled <= WINDOW
        await peer.send(ctrl(1, Window(bytes=WINDOW)))
        with anyio.move_on_after(1):  # what arrives now is bounded by the new grant
            while True:
                frame = await peer.next_frame()
                assert frame is not None
                frames.append(frame)
                if len(split_output(frames, 1)[0]) == 2 * WINDOW:
                    break
        assert stalled < len(split_output(frames, 1)[0]) <= 2 * WINDOW
        await peer.send(ctrl(1, {"type": "cancel"}))
        assert all(f.kind is not FrameKind.STDERR for f in frames)
