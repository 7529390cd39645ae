"""Acceptance 5: cancel and disconnect kill and reap the process group; no `exit` is sent."""

from __future__ import annotations

from pathlib import Path

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
    zombie_children,
)

from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Cancel, Open

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]
# Both members ignore SIGHUP, so only the SIGKILL after the grace ends them.
STUBBORN = "trap '' HUP; sleep 30 & echo started; sleep 30"


async def start_stubborn(peer, pty: bool) -> int:  # type: ignore[no-untyped-def]
    await peer.send(HELLO + ctrl(1, Open(argv=[SH, "-c", STUBBORN], pty=pty)))
    assert (await peer.next_control())["type"] == "welcome"
    opened = await peer.next_control()
    assert opened["type"] == "opened"
    seen = b""
    while b"started" not in seen:
        frame = await peer.next_frame()
        assert frame is not None and frame.kind is FrameKind.STDOUT
        seen += frame.payload
    pgid = int(opened["pid"])  # type: ignore[call-overload]
    assert len(processes_in_group(pgid)) >= 2  # the shell and its sleeps
    return pgid


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_cancel(server_process: ServerProcess, pty: bool) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        pgid = await start_stubborn(peer, pty)
        try:
            await peer.send(ctrl(1, Cancel()))
            rest = await peer.frames_until_eof()
            assert await wait_until(lambda: not processes_in_group(pgid), timeout=3)
        finally:
            kill_group(pgid)
    assert [c for c in split_output(rest)[2] if c["type"] == "exit"] == []
    # Reaped within the orphan sweep of their death (backends/reaper.py), not at once:
    # members orphaned by their leader's death are reaped as the server finds them.
    assert await wait_until(lambda: not zombie_children(server_process.pid), timeout=1)


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_disconnect(server_process: ServerProcess, pty: bool) -> None:
    async with raw_peer(server_process.addresses[0]) as peer:
        pgid = await start_stubborn(peer, pty)
    try:
        assert await wait_until(lambda: not processes_in_group(pgid), timeout=3)
        assert await wait_until(lambda: not zombie_children(server_process.pid), timeout=1)
    finally:
        kill_group(pgid)


async def test_a_cancel_after_the_first_process_returned_hangs_up_what_is_left(
        server_process: ServerProcess, tmp_path: Path) -> None:
    """The shell has exited, a background job holds its output pipe: a cancel still hangs
    the group up (SIGHUP, which the job's trap records), not only SIGKILLs it a grace
    later."""
    hung_up = tmp_path / "hup"
    # The job says its pid once its trap is set (no race with the hang-up), then waits.
    job = f"{SH} -c 'trap \"echo > {hung_up}; exit\" HUP; echo $$; sleep 30 & wait' &"
    async with raw_peer(server_process.addresses[0]) as peer:
        await peer.send(HELLO + ctrl(1, Open(argv=[SH, "-c", job], pty=False)))
        assert (await peer.next_control())["type"] == "welcome"
        opened = await peer.next_control()
        shell = int(opened["pid"])  # type: ignore[call-overload]
        seen = b""
        while not seen.endswith(b"\n"):
            frame = await peer.next_frame()
            assert frame is not None and frame.kind is FrameKind.STDOUT
            seen += frame.payload
        background = int(seen)
        try:
            assert await wait_until(lambda: not Path(f"/proc/{shell}").exists(), timeout=10)
            await peer.send(ctrl(1, Cancel()))
            await peer.frames_until_eof()
            assert await wait_until(lambda: not processes_in_group(shell), timeout=10)
        finally:
            kill_group(shell)
    assert hung_up.exists(), f"the job {background} was killed, never hung up"
