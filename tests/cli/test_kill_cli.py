"""`ttyserve kill [--signal NAME] ID` (contracts.md): a session of the caller's ends, attached
or not; without --signal it is cancelled, with it its process gets the signal and the session
ends as the process does; an unknown id is 255 with a line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest
from helpers import SH, start_server, ttyserve_command
from http_api import api_server, create, events, request

from ttyserve.client import connect
from ttyserve.errors import SessionDetached
from ttyserve.exitcodes import ExecExit
from ttyserve.server.journal import Reason, SessionEnd, read_file

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


async def kill(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: subprocess.run(
        ttyserve_command("kill", "--connect", address, *args), capture_output=True,
        text=True, timeout=20))


async def test_kill_cancels_a_detached_session_and_signals_an_attached_one(
        short_dir: Path) -> None:
    journal = short_dir / "j.jsonl"
    server = start_server(short_dir, "--journal", str(journal))
    address = server.addresses[0]
    try:
        async with connect(address, multiplex=True) as conn:
            detached = await conn.spawn(["sleep", "600"], pty=False, detachable=True)
            await detached.detach()
            attached = await conn.spawn([SH, "-c", "echo up; exec sleep 600"], pty=True,
                                        detachable=True)
            assert await attached.receive() is not None  # it runs
            cancelled = await kill(address, detached.id or "")
            assert (cancelled.returncode, cancelled.stderr) == (0, "")
            signalled = await kill(address, "--signal", "term", attached.id or "")
            assert (signalled.returncode, signalled.stderr) == (0, "")
            with anyio.fail_after(10), pytest.raises(SessionDetached) as taken:
                _ = [chunk async for chunk in attached]  # its output, until the steal
            assert taken.value.reason == "stolen"  # its writer was told, and may come back
            again = await conn.attach(attached.id or "")
            status = await again.wait()
            assert (status.code, status.signal) == (-15, "TERM")  # ended as its process did
            with anyio.fail_after(10):
                while any(s.session == detached.id for s in await conn.list_sessions()):
                    await anyio.sleep(0.05)  # (its end is written in the background)
    finally:
        server.stop()
    ends = {r.id: r for r in read_file(str(journal)).records if isinstance(r, SessionEnd)}
    assert ends[detached.id or ""].reason == Reason.CANCELLED
    assert (ends[attached.id or ""].reason, ends[attached.id or ""].signal) == (
        Reason.EXIT, "TERM")


async def test_kill_of_an_ended_session_lets_it_go(short_dir: Path) -> None:
    """An ended session kept after its exit went out (here to an HTTP output stream, which
    releases nothing) is let go by kill (as the API's DELETE does): gone from the list."""
    api = api_server(short_dir)
    try:
        session_id = create(api, argv=["true"], pty=False)
        assert events(api, session_id)[-1]["type"] == "exit"  # delivered, and kept
        listed = request(api, "GET", "/sessions").json()["sessions"]
        assert [s["session"] for s in listed] == [session_id]
        done = await kill(api.server.addresses[0], "--token-file",
                          str(short_dir / "token"), session_id)
        assert (done.returncode, done.stderr) == (0, "")
        assert request(api, "GET", "/sessions").json()["sessions"] == []
    finally:
        api.server.stop()


async def test_kill_of_an_unknown_session_or_signal_is_255_with_a_line(short_dir: Path) -> None:
    server = start_server(short_dir)
    try:
        unknown = await kill(server.addresses[0], "s-no-such-session")
        assert unknown.returncode == ExecExit.FAILURE
        assert "no_such_session" in unknown.stderr and unknown.stderr.count("\n") == 1
        bad = await kill(server.addresses[0], "--signal", "BOGUS", "s-any")
        assert bad.returncode == ExecExit.FAILURE and "'BOGUS' is not one of" in bad.stderr
    finally:
        server.stop()
