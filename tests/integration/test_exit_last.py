"""Acceptance 2: under load, every session gets all its output, then one `exit`, then nothing."""

from __future__ import annotations

import anyio
import pytest
from helpers import HELLO, SH, ServerProcess, ctrl, raw_peer, split_output

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Open

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
SESSIONS = 100
LINES = 20000
EXPECTED = b"".join(b"%d\n" % i for i in range(1, LINES + 1))


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_many_sessions_exit_at_once_exit_is_last(server_process: ServerProcess,
                                                        pty: bool) -> None:
    address = server_process.addresses[0]
    script = f"head -c 2 >/dev/null; seq 1 {LINES}; exit 3"
    results: dict[int, list] = {}
    all_opened = anyio.Event()
    opened_count = 0
    go = anyio.Event()

    async def one(index: int) -> None:
        nonlocal opened_count
        async with raw_peer(address) as peer:
            await peer.send(HELLO + ctrl(1, Open(argv=[SH, "-c", script], pty=pty)))
            welcome = await peer.next_control()
            opened = await peer.next_control()
            assert (welcome["type"], opened["type"]) == ("welcome", "opened"), opened
            opened_count += 1
            if opened_count == SESSIONS:
                all_opened.set()
            await go.wait()
            await peer.send(encode_frame(FrameKind.STDIN, 1, b"g\n"))
            results[index] = await peer.frames_until_eof()

    async with anyio.create_task_group() as tg:
        for i in range(SESSIONS):
            tg.start_soon(one, i)
        await all_opened.wait()
        go.set()

    assert len(results) == SESSIONS
    for frames in results.values():
        out, err, controls = split_output(frames)
        assert frames[-1].kind is FrameKind.CTRL_OUT
        assert controls == [{"type": "exit", "code": 3}]  # exactly one exit, and it is last
        if pty:
            assert out.replace(b"\r\n", b"\n").endswith(EXPECTED)
        else:
            assert (out, err) == (EXPECTED, b"")
