"""A backend with no descriptors serves real clients: the in-memory double behind a real server.

The double's processes are Python programs on memory streams (tests/backends/memory.py),
so every byte here takes the interface's stream-shaped path through the session,
its attachment and the protocol core.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from backends.memory import open_memory_backend
from helpers import running_server

from ttyserve.client import connect

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_output_exit_and_signal_deaths_through_the_stream_path(sock_path: Path) -> None:
    async with open_memory_backend() as backend, running_server(
            sock_path, backend=backend) as (_, address), connect(address, multiplex=True) as conn:
        session = await conn.spawn(["emit", "out", "err", "7"], pty=False)
        chunks = [(c.stream, c.data) async for c in session]
        assert sorted(chunks) == [("stderr", b"err"), ("stdout", b"out")]
        assert session.status is not None and session.status.code == 7
        killed = await conn.spawn(["die", "KILL"], pty=False)
        status = await killed.wait()
        assert (status.code, status.signal, status.core_dumped) == (-9, "KILL", False)
        lost = await conn.spawn(["lost-status", "still", "delivered"], pty=False)
        out = b"".join([c.data async for c in lost])
        assert out == b"still delivered" and lost.status is not None
        assert lost.status.code == -1 and "waitpid failed" in str(lost.status.error)


async def test_stdin_through_the_stream_path_with_windows(sock_path: Path) -> None:
    payload = os.urandom(3 << 20)
    async with open_memory_backend() as backend, running_server(
            sock_path, backend=backend) as (_, address), connect(
            address, multiplex=True, window=256 * 1024) as conn:
        session = await conn.spawn(["cat"], pty=False)
        received = bytearray()

        async def feed() -> None:
            await session.send(payload)
            await session.eof()

        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            async for chunk in session:
                received += chunk.data
        assert bytes(received) == payload
        assert session.status is not None and session.status.code == 0
