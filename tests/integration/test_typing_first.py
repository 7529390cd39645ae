"""A keystroke never waits behind a whole chunk of another session's flood: once a PTY
session's echo is out, the flooding session's frames are small (server/sessions/typing_first.py);
before anyone typed they were whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import SH, ctrl, raw_peer, running_server

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Hello, Open
from ttyserve.server.sessions.typing_first import BULK_GRAIN

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]
AFTER = 8  # frames of the flood looked at once the echo is out


async def test_a_flood_reads_small_while_another_session_is_typed_into(sock_path: Path) -> None:
    async with running_server(sock_path) as (_, address), raw_peer(address) as peer:
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True))
                        + ctrl(1, Open(argv=["head", "-c", "2000000000", "/dev/zero"],
                                       pty=False))
                        + ctrl(2, Open(argv=[SH, "-c", "stty -icanon; echo ready; exec cat"],
                                       pty=True)))
        whole = ready = False
        while not (whole and ready):
            frame = await peer.next_frame()
            assert frame is not None
            if frame.kind is FrameKind.STDOUT and frame.channel == 1:
                whole = whole or len(frame.payload) > BULK_GRAIN
            elif frame.kind is FrameKind.STDOUT and frame.channel == 2:
                ready = ready or b"ready" in frame.payload
        await peer.send(encode_frame(FrameKind.STDIN, 2, b"k"))
        while True:  # the echo: the keystroke was read before anything below was
            frame = await peer.next_frame()
            assert frame is not None
            if frame.kind is FrameKind.STDOUT and frame.channel == 2 and b"k" in frame.payload:
                break
        sizes: list[int] = []
        while len(sizes) < AFTER:
            frame = await peer.next_frame()
            assert frame is not None
            if frame.kind is FrameKind.STDOUT and frame.channel == 1:
                sizes.append(len(frame.payload))
        assert max(sizes) <= BULK_GRAIN, sizes
