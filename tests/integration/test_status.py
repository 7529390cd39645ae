"""Acceptance 3: how a process ended, as the wire `exit` says it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from helpers import SH, ServerProcess, running_server

from ttyserve.backends.local import LocalBackend, PipeProcess
from ttyserve.client import connect, run

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


@pytest.mark.parametrize("code", [0, 1, 42, 255])
async def test_normal_exit_codes(server_process: ServerProcess, code: int) -> None:
    result = await run([SH, "-c", f"exit {code}"], address=server_process.addresses[0])
    assert result.status.code == code
    assert result.status.signal is None and result.status.error is None


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_kill_9(server_process: ServerProcess, pty: bool) -> None:
    result = await run([SH, "-c", "kill -9 $$"], address=server_process.addresses[0], pty=pty)
    assert (result.status.code, result.status.signal, result.status.core_dumped) == (
        -9, "KILL", False)


async def test_sighup_in_pipe_mode_is_minus_one_with_signal_and_no_error(
        server_process: ServerProcess) -> None:
    result = await run([SH, "-c", "kill -HUP $$"], address=server_process.addresses[0])
    assert result.status.code == -1
    assert result.status.signal == "HUP"
    assert result.status.error is None


class StatusLostProcess(PipeProcess):
    """The process really exits and is reaped, but its status is lost (as with ECHILD)."""

    def _collect_status(self) -> int | None:
        super()._collect_status()
        raise ChildProcessError(errno.ECHILD, os.strerror(errno.ECHILD))


class StatusLostBackend(LocalBackend):
    pipe_process = StatusLostProcess


async def test_failed_wait_is_minus_one_with_error(sock_path: Path) -> None:
    async with running_server(sock_path, backend=StatusLostBackend()) as (_, address):
        async with connect(address) as conn:
            session = await conn.spawn(["echo", "still delivered"], pty=False)
            out = [chunk.data async for chunk in session]
        assert session.status is not None
        assert session.status.code == -1
        assert session.status.signal is None
        assert "waitpid failed" in str(session.status.error)
        assert b"".join(out) == b"still delivered\n"
