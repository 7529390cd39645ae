"""100 sessions across three targets, over several connections (so with two workers each
worker has carriers of its own), with one carrier SIGKILLed mid-run: every exit right, no
byte lost or doubled, the journal exact (one start and one end each, with its target)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from helpers import ServerProcess
from target_doors import Far, carriers

from ttyserve.client import connect

pytestmark = [pytest.mark.timeout(180)]
SESSIONS, CONNECTIONS, LINES = 100, 4, 150


def script(index: int) -> str:
    return (f"i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo s{index}-$i; sleep 0.01; "
            f"done; exit {index % 7}")


@pytest.mark.asyncio
async def test_100_sessions_on_3_targets_survive_a_killed_carrier(
        start_door: Callable[..., ServerProcess], far: Callable[[str], Far],
        short_dir: Path) -> None:
    fars = [far(f"t{n}") for n in range(3)]
    door = start_door("".join(f.entry() for f in fars))
    results: dict[int, tuple[bytes, int]] = {}
    started = anyio.Event()  # every session opened (a carrier lost under an open in flight
    opened = 0  # is target_unreachable: test_door's), and output flowing

    async def run(conn: object, index: int) -> None:
        nonlocal opened
        session = await conn.spawn(  # type: ignore[attr-defined]
            ["sh", "-c", script(index)], pty=False, target=f"t{index % 3}", detachable=True)
        opened += 1
        out = b""
        async for chunk in session:
            out += chunk.data
            if opened == SESSIONS and out.count(b"\n") >= 5:
                started.set()
        results[index] = (out, (await session.wait()).code)

    async def connection(first: int) -> None:
        async with connect(door.addresses[0], multiplex=True) as conn, \
                anyio.create_task_group() as group:
            for index in range(first, SESSIONS, CONNECTIONS):
                group.start_soon(run, conn, index)

    with anyio.fail_after(150):
        async with anyio.create_task_group() as group:
            for first in range(CONNECTIONS):
                group.start_soon(connection, first)
            await started.wait()
            killed = carriers(door, fars[1])
            assert killed
            os.kill(killed[0], signal.SIGKILL)  # one worker's carrier to t1, mid-run
    for index in range(SESSIONS):
        out, code = results[index]
        assert out == b"".join(b"s%d-%d\n" % (index, i) for i in range(1, LINES + 1)), index
        assert code == index % 7
    with anyio.fail_after(20):
        while True:
            lines = [json.loads(line) for line in
                     (short_dir / "journal").read_text().splitlines()]
            ends = {r["id"]: r for r in lines if r["event"] == "session.end"}
            if len(ends) >= SESSIONS:
                break
            await anyio.sleep(0.05)  # (the last ends are written as their exits go out)
    starts = {r["id"]: r for r in lines if r["event"] == "session.start"}
    by_script = {script(index): index for index in range(SESSIONS)}
    assert len(starts) == SESSIONS and set(ends) == set(starts)
    for session_id, start in starts.items():
        end = ends[session_id]
        index = by_script[str(start["argv"][2])]
        assert start["target"] == end["target"] == f"t{index % 3}"
        assert (end["reason"], end["code"]) == ("exit", index % 7)
        assert end["bytes_out"] == len(results[index][0])
