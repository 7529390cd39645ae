"""Acceptance 11: 500 sessions back to back and 200 at once leave no zombie and no descriptor."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from helpers import SH, open_fds, running_server, wait_until, zombie_children

from ttyserve.client import run

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]


async def test_500_back_to_back_and_200_at_once(sock_path: Path) -> None:
    async with running_server(sock_path) as (server, address):
        warm = await run(["true"], address=address)  # the event loop's own descriptors exist now
        assert warm.status.code == 0
        assert await wait_until(lambda: not server.handlers, timeout=5)
        baseline = open_fds()

        for i in range(500):
            result = await run(["echo", str(i)], address=address, pty=i % 2 == 0)
            assert result.status.code == 0
            assert result.stdout.replace(b"\r\n", b"\n") == f"{i}\n".encode()

        results: list[int] = []

        async def one(i: int) -> None:
            result = await run([SH, "-c", f"sleep 0.5; echo {i}"], address=address, pty=i % 2 == 1)
            assert result.stdout.replace(b"\r\n", b"\n") == f"{i}\n".encode()
            results.append(result.status.code)

        async with anyio.create_task_group() as tg:
            for i in range(200):
                tg.start_soon(one, i)
        assert results == [0] * 200

        # The server closes its side after the client has read the exit: allow it a moment.
        assert await wait_until(lambda: not server.handlers, timeout=5)
        assert await wait_until(lambda: open_fds() == baseline, timeout=5), (open_fds(), baseline)
        assert zombie_children(os.getpid()) == []


async def test_cancel_and_disconnect_leak_nothing(sock_path: Path) -> None:
    from ttyserve.client import connect

    async with running_server(sock_path) as (server, address):
        await run(["true"], address=address)
        assert await wait_until(lambda: not server.handlers, timeout=5)
        baseline = open_fds()

        async def cancelled(i: int) -> None:
            async with connect(address) as conn:
                session = await conn.spawn([SH, "-c", "sleep 30 & sleep 30"], pty=i % 2 == 0)
                await session.cancel()

        async def disconnected(i: int) -> None:
            async with connect(address) as conn:
                await conn.spawn(["sleep", "30"], pty=i % 2 == 0)

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(cancelled, i)
                tg.start_soon(disconnected, i)

        assert await wait_until(lambda: not server.handlers, timeout=10)
        assert await wait_until(lambda: open_fds() == baseline, timeout=5), (open_fds(), baseline)
        assert await wait_until(lambda: not zombie_children(os.getpid()), timeout=5)
