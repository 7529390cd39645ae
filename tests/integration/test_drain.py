"""Acceptance 4: a grandchild holding the pipe or PTY delays `exit` by at most the linger."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import SH, ServerProcess

from ttyserve.client import connect

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]
LINGER = 1.0  # what the server_process fixture is started with


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_grandchild_holding_output_delays_exit_by_at_most_the_linger(
        server_process: ServerProcess, pty: bool, tmp_path: Path) -> None:
    # The parent waits until the grandchild ignores SIGHUP: a PTY's hang-up when
    # the parent exits must not catch it before its trap is set.
    script = ("seq 1 30000; (trap '' HUP; touch \"$ARMED\"; exec sleep 30) & "
              "while [ ! -e \"$ARMED\" ]; do sleep 0.01; done; "
              "echo grandchild=$!; echo last-line")
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", script], pty=pty,
                                   env={"ARMED": str(tmp_path / "armed")})
        started = time.monotonic()
        out = b"".join([chunk.data async for chunk in session])
        elapsed = time.monotonic() - started
    text = out.replace(b"\r\n", b"\n")
    grandchild = int(text.split(b"grandchild=")[1].split(b"\n")[0])
    try:
        assert session.status is not None and session.status.code == 0
        assert text.startswith(b"".join(b"%d\n" % i for i in range(1, 30001)))
        assert text.endswith(b"last-line\n")
        # The linger ran out: the grandchild held the output open until then (and then, in
        # its session's cgroup, it was killed as a leftover: tests/containment).
        assert LINGER * 0.9 <= elapsed < LINGER + 1.5, elapsed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_without_a_grandchild_exit_does_not_wait_for_the_linger(
        server_process: ServerProcess, pty: bool) -> None:
    async with connect(server_process.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", "echo done"], pty=pty)
        started = time.monotonic()
        await session.wait()
    assert time.monotonic() - started < LINGER * 0.8
