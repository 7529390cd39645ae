"""Multiplexed connections: many sessions, one channel each, credit per channel (section 7)."""

from __future__ import annotations

import json

import anyio
import pytest
from helpers import SH, RawPeer, ServerProcess, ctrl, raw_peer, split_output

from ttyserve.client import connect
from ttyserve.protocol.frames import Frame, FrameKind, encode_frame
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


WINDOWED = ctrl(0, Hello(protocol=1, multiplex=True, window=WINDOW))


async def frames_until_exit(peer: RawPeer, channel: int) -> list[Frame]:
    frames: list[Frame] = []
    while not any(c.get("type") == "exit" for c in split_output(frames, channel)[2]):
        frame = await peer.next_frame()
        assert frame is not None, "closed before the exit"
        frames.append(frame)
    return frames


async def test_welcome_offers_a_stdin_window_only_to_a_windowed_hello(
        server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(WINDOWED)
        welcome = await peer.next_control()
        assert isinstance(welcome["window"], int) and welcome["window"] >= 1
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(ctrl(0, Hello(protocol=1, multiplex=True)))
        assert "window" not in await peer.next_control()


async def test_output_ending_at_the_edge_of_the_window_still_exits(
        server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(WINDOWED + ctrl(1, Open(argv=["head", "-c", str(WINDOW), "/dev/zero"],
                                                pty=False)))
        frames = await frames_until_exit(peer, 1)
    out, _, controls = split_output(frames, 1)
    assert len(out) == WINDOW
    assert [c["type"] for c in controls] == ["opened", "exit"] and controls[-1]["code"] == 0


@pytest.mark.parametrize("value", ["65536", 1.5, -1, 0, None, True, 1 << 31])
async def test_a_bad_window_is_refused_and_the_session_stays_usable(
        server_process: ServerProcess, value: object) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        size = WINDOW + 1000
        await peer.send(WINDOWED + ctrl(1, Open(argv=["head", "-c", str(size), "/dev/zero"],
                                                pty=False)))
        frames: list[Frame] = []
        while len(split_output(frames, 1)[0]) < WINDOW:  # the credit is used up
            frame = await peer.next_frame()
            assert frame is not None
            frames.append(frame)
        await peer.send(ctrl(1, json.dumps({"type": "window", "bytes": value}).encode()))
        refusal = await peer.next_control()
        assert (refusal["type"], refusal["code"]) == ("error", "bad_request")
        await peer.send(ctrl(1, Window(bytes=1000)))  # a good one after it works
        frames += await frames_until_exit(peer, 1)
    out, _, controls = split_output(frames, 1)
    assert len(out) == size and controls[-1] == {"type": "exit", "code": 0}


async def test_reopening_an_ended_id_is_refused_on_channel_0(
        server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(WINDOWED + ctrl(1, Open(argv=["true"], pty=False)))
        frames = await frames_until_exit(peer, 1)
        await peer.send(ctrl(1, Open(argv=["true"], pty=False)) + ctrl(2, Open(argv=["true"])))
        frames += await frames_until_exit(peer, 2)
    refusals = [c for c in split_output(frames, 0)[2] if c["type"] != "welcome"]
    assert refusals == [{"type": "error", "code": "channel_in_use", "channel": 1,
                         "message": "channel 1 was already used", "retriable": False}]
    assert split_output(frames, 1)[2][-1]["type"] == "exit"  # nothing after channel 1's exit


async def test_stdin_beyond_the_window_is_a_protocol_error(server_process: ServerProcess) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(WINDOWED + ctrl(1, Open(argv=["sleep", "30"], pty=False)))
        window = (await peer.next_control())["window"]
        assert isinstance(window, int)
        assert (await peer.next_control())["type"] == "opened"
        await peer.send(encode_frame(FrameKind.STDIN, 1, b"x" * window))  # all of it: fine
        await peer.send(encode_frame(FrameKind.STDIN, 1, b"y"))
        frames = await peer.frames_until_eof()
    assert split_output(frames, 0)[2][-1]["code"] == "protocol_error"


async def test_a_flooded_or_starved_channel_does_not_stall_the_others(
        server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0], multiplex=True, window=WINDOW) as conn:
        deaf = await conn.spawn(["sleep", "30"], pty=False)  # never reads its input
        starved = await conn.spawn(["yes"], pty=False)  # whose output nobody reads
        echo = await conn.spawn(["cat"], pty=False)
        flooded = anyio.Event()

        async def flood() -> None:
            await deaf.send(b"z" * (8 << 20))  # far beyond the STDIN window: waits for credit
            flooded.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            for round_trip in range(20):
                line = b"line %d\n" % round_trip
                await echo.send(line)
                got = b""
                while len(got) < len(line):
                    chunk = await echo.receive()
                    assert chunk is not None
                    got += chunk.data
                assert got == line
            assert not flooded.is_set()  # the flood still waits for credit, alone
            tg.cancel_scope.cancel()
        await echo.eof()
        assert (await echo.wait()).code == 0
        await deaf.cancel()
        await starved.cancel()
