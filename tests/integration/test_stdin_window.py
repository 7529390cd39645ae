"""Acceptance: the STDIN window (protocol section 7) bounds what the server takes for a process
that does not read yet, and a stream far larger than it still arrives whole."""

from __future__ import annotations

import hashlib
import os

import anyio
import pytest
from helpers import SH, ServerProcess

from ttyserve.client import connect

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]
TOTAL = 50 << 20
CHUNK = 64 << 10
SLACK = 4 << 20  # socket buffers and the client's own send queue


async def test_50_mib_to_a_process_that_reads_late(server_process: ServerProcess) -> None:
    block = os.urandom(CHUNK)
    sent = 0
    sent_before_reading: int | None = None
    digest = hashlib.sha256()
    async with connect(server_process.addresses[0], window=1 << 20) as conn:
        session = await conn.spawn([SH, "-c", "sleep 5; cat"], pty=False)
        assert conn.welcome is not None and conn.welcome.window is not None
        stdin_window = conn.welcome.window

        async def feed() -> None:
            nonlocal sent
            for _ in range(TOTAL // CHUNK):
                await session.send(block)
                sent += CHUNK
            await session.eof()

        received = 0
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            async for chunk in session:
                if sent_before_reading is None:
                    sent_before_reading = sent  # cat has just begun to read
                digest.update(chunk.data)
                received += len(chunk.data)
        assert session.status is not None and session.status.code == 0
    assert received == TOTAL
    assert digest.hexdigest() == hashlib.sha256(block * (TOTAL // CHUNK)).hexdigest()
    assert sent_before_reading is not None
    assert sent_before_reading <= stdin_window + SLACK, (sent_before_reading, stdin_window)
