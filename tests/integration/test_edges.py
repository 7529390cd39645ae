"""Edges found in review: cancel racing open, slow readers, shared credit, stalled stdin."""

from __future__ import annotations

import anyio
import pytest
from helpers import (
    HELLO,
    SH,
    ServerProcess,
    ctrl,
    kill_group,
    processes_in_group,
    raw_peer,
    split_output,
    wait_until,
)

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Cancel, Hello, Open

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_cancel_in_the_same_batch_as_open(server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(HELLO + ctrl(1, Open(argv=[SH, "-c", "echo started; sleep 30"],
                                             pty=False)) + ctrl(1, Cancel()))
        frames = await peer.frames_until_eof()
    # The open is answered before the cancel is read (answers keep request order);
    # after the cancel nothing is sent: no output, no exit.
    assert [c["type"] for c in split_output(frames, 1)[2]] == ["opened"]
    assert split_output(frames, 1)[0] == b""


async def test_a_slow_reader_still_gets_everything_and_the_exit(
        server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(HELLO + ctrl(1, Open(argv=["head", "-c", "3000000", "/dev/zero"],
                                             pty=False)))
        await anyio.sleep(3.5)  # the point: a client that reads late, after the process ended
        frames = await peer.frames_until_eof()
    out, _, controls = split_output(frames, 1)
    assert len(out) == 3_000_000
    assert controls[-1] == {"type": "exit", "code": 0}


async def test_stdout_and_stderr_share_one_window(server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True, window=1000))
                        + ctrl(1, Open(argv=[SH, "-c", "yes out & yes err >&2"], pty=False)))
        frames = []
        with anyio.move_on_after(1):  # nothing beyond the window may arrive, however long
            while (frame := await peer.next_frame()) is not None:
                frames.append(frame)
        await peer.send(ctrl(1, Cancel()))
    out, err, _ = split_output(frames, 1)
    assert 0 < len(out) + len(err) <= 1000


async def test_stdin_stuck_behind_a_finished_session_does_not_stall_the_connection(
        server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        # A background child keeps stdin open but never reads it; the shell exits.
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True))
                        + ctrl(1, Open(argv=[SH, "-c", "sleep 30 & exit 0"], pty=False)))
        assert (await peer.next_control())["type"] == "welcome"
        opened = await peer.next_control()
        assert opened["type"] == "opened"
        pgid = int(opened["pid"])  # type: ignore[call-overload]
        try:
            chunk = encode_frame(FrameKind.STDIN, 1, b"x" * 65536)
            for _ in range(24):  # 1.5 MiB: more than the pipe and the session's queue hold
                await peer.send(chunk)
            await peer.send(ctrl(2, Open(argv=["echo", "second"], pty=False)))
            frames = []
            while not any(c.get("type") == "exit" for c in split_output(frames, 2)[2]):
                frame = await peer.next_frame()
                assert frame is not None
                frames.append(frame)
            assert split_output(frames, 2)[0] == b"second\n"
        finally:
            kill_group(pgid)
            assert await wait_until(lambda: not processes_in_group(pgid), timeout=5)
