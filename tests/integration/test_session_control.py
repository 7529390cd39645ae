"""Acceptance 7: resize, signal, eof, env and cwd, end to end through the client library."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import SH, ServerProcess

from ttyserve.client import Session, connect, run

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def read_until(session: Session, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = await session.receive()
        assert chunk is not None, f"exited before {marker!r}; got {seen!r}"
        seen += chunk.data
    return seen


async def test_resize_reaches_the_pty(server_process: ServerProcess) -> None:
    script = "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", script], pty=True, rows=24, cols=80)
        await read_until(session, b"ready")
        await session.resize(50, 132)
        out = await read_until(session, b"50 132")
        assert (await session.wait()).code == 0
    assert b"50 132" in out


async def test_signal_int_under_a_pty_kills_the_foreground_sleep(
        server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn(["sleep", "30"], pty=True)
        await session.signal("INT")
        status = await session.wait()
    assert (status.code, status.signal) == (-2, "INT")


async def test_signal_reaches_the_process_group_in_pipe_mode(
        server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", "trap 'echo got-usr1; exit 5' USR1; echo ready; "
                                    "while :; do sleep 0.05; done"], pty=False)
        await read_until(session, b"ready")
        await session.signal("USR1")
        await read_until(session, b"got-usr1")
        assert (await session.wait()).code == 5


async def test_unknown_signal_is_refused_and_the_session_goes_on(
        server_process: ServerProcess) -> None:
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn(["cat"], pty=False)
        await session.signal("NOPE")  # type: ignore[arg-type]
        await session.send(b"still here\n")
        await read_until(session, b"still here")
        await session.eof()
        assert (await session.wait()).code == 0
    assert [e.code for e in session.errors] == ["bad_request"]


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_eof_ends_cat(server_process: ServerProcess, pty: bool) -> None:
    result = await run(["cat"], address=server_process.addresses[0], input=b"abc\n", pty=pty)
    assert result.status.code == 0
    assert b"abc" in result.stdout


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_env_and_cwd(server_process: ServerProcess, pty: bool, tmp_path: Path) -> None:
    result = await run([SH, "-c", 'printf "%s|%s" "$GREETING" "$(pwd)"'], pty=pty,
                       address=server_process.addresses[0], env={"GREETING": "hi there"},
                       cwd=str(tmp_path))
    assert result.stdout == f"hi there|{tmp_path}".encode()


async def test_stdout_and_stderr_are_told_apart_byte_for_byte(
        server_process: ServerProcess) -> None:
    payload = bytes(range(256)) * 64
    result = await run([SH, "-c", "cat; printf 'e\\000rr' >&2"], input=payload,
                       address=server_process.addresses[0])
    assert (result.stdout, result.stderr) == (payload, b"e\x00rr")


async def test_default_command_runs_without_argv(server_process: ServerProcess) -> None:
    result = await run([], address=server_process.addresses[0], input=b"echo from-default\n")
    assert (result.status.code, result.stdout) == (0, b"from-default\n")
