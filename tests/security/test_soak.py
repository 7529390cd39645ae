"""Hardening acceptance 8: sessions opened, fed, cancelled, disconnected and exited at random.

CI runs it briefly; `TTYSERVE_SOAK_SECONDS=600 make test` runs it for as long as you like.
Afterwards the server has no children, its descriptors are back to where they
started, and its memory grew by less than a bound.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import anyio
import pytest
from helpers import SH, start_server

from ttyserve.client import connect, run
from ttyserve.errors import ConnectionLost
from ttyserve.exitcodes import ServeExit

SOAK_SECONDS = float(os.environ.get("TTYSERVE_SOAK_SECONDS", "15"))
WORKERS = 8
RSS_GROWTH_LIMIT_KIB = 24 * 1024

pytestmark = [pytest.mark.usefixtures("workers"), pytest.mark.asyncio, pytest.mark.soak,
              pytest.mark.timeout(int(SOAK_SECONDS) + 120)]


async def one_round(address: str, rng: random.Random, counts: dict[str, int]) -> None:
    action = rng.choice(["exit", "feed", "cancel", "disconnect", "kill", "output"])
    pty = rng.random() < 0.5
    counts[action] = counts.get(action, 0) + 1
    if action == "exit":
        result = await run([SH, "-c", f"exit {rng.randrange(5)}"], address=address, pty=pty)
        assert 0 <= result.status.code < 5
    elif action == "feed":
        data = rng.randbytes(rng.randrange(1, 20000)).replace(b"\x04", b"")
        result = await run(["wc", "-c"], address=address, input=data, pty=False)
        assert result.stdout.strip() == str(len(data)).encode()
    elif action == "output":
        result = await run(["head", "-c", str(rng.randrange(1, 2_000_000)), "/dev/zero"],
                           address=address, pty=pty)
        assert result.status.code == 0
    else:
        async with connect(address) as conn:
            session = await conn.spawn([SH, "-c", "sleep 30 & cat"], pty=pty)
            await session.send(b"x\n")
            if action == "cancel":
                await session.cancel()
            elif action == "kill":
                await session.signal("KILL")
                try:
                    status = await session.wait()
                except ConnectionLost:
                    raise AssertionError("connection lost before exit") from None
                assert status.signal == "KILL"
            # "disconnect": leave without a word


async def test_soak(short_dir: Path) -> None:
    server = start_server(short_dir, "--command", SH, "--linger", "0.5")
    try:
        address = server.addresses[0]
        await run(["true"], address=address)
        await anyio.sleep(0.5)
        fds, rss = server.open_fds(), server.rss_kib()
        counts: dict[str, int] = {}
        deadline = time.monotonic() + SOAK_SECONDS

        async def worker(seed: int) -> None:
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                await one_round(address, rng, counts)

        async with anyio.create_task_group() as tg:
            for seed in range(WORKERS):
                tg.start_soon(worker, seed)

        with anyio.move_on_after(10):
            while server.session_children() or server.open_fds() != fds:
                await anyio.sleep(0.05)  # cancelled sessions finish their SIGKILL grace
        assert server.session_children() == []
        assert server.open_fds() == fds
        assert server.rss_kib() - rss < RSS_GROWTH_LIMIT_KIB
        assert sum(counts.values()) > WORKERS
    finally:
        assert server.stop() == ServeExit.OK
