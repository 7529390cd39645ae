"""Acceptance 2: no escape window. A program whose first act is a fork (util-linux `setsid -f`
forks before anything else) always has its child in the session's cgroup, 1,000 times over:
the process is born in its cgroup, never moved there after it ran."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from conftest import contained_server

from ttyserve.backends.cgroups import cgroup2_mount
from ttyserve.client import connect
from ttyserve.server.journal import SessionStart, read_file

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

SESSIONS = 1000
AT_ONCE = 16
FORK_FIRST = ["setsid", "-f", "cat", "/proc/self/cgroup"]  # the grandchild says where it is


async def test_children_forked_first_thing_are_inside(sock_path: Path, cgroup_base: str,
                                                      short_dir: Path) -> None:
    journal = short_dir / "journal"
    seen: dict[int, str] = {}  # the session's pid: the cgroup its child was born in
    async with (contained_server(sock_path, cgroup_base, journal=journal,
                                 max_sessions_per_connection=AT_ONCE) as (_, address, _c),
                connect(address, multiplex=True) as conn):
        limiter = anyio.Semaphore(AT_ONCE)

        async def one() -> None:
            async with limiter:
                session = await conn.spawn(FORK_FIRST, pty=False)
                out = b"".join([chunk.data async for chunk in session])
                assert (await session.wait()).code == 0
                assert session.pid is not None
                lines = [line for line in out.decode().splitlines() if line.startswith("0::")]
                assert len(lines) == 1, out
                seen[session.pid] = lines[0][3:]

        async with anyio.create_task_group() as group:
            for _ in range(SESSIONS):
                group.start_soon(one)
    mount = cgroup2_mount()
    assert mount is not None
    starts = [r for r in read_file(str(journal)).records if isinstance(r, SessionStart)]
    assert len(starts) == len(seen) == SESSIONS
    outside = [(s.pid, s.cgroup, seen[s.pid]) for s in starts
               if s.cgroup is None or s.pid is None
               or os.path.normpath(mount + seen[s.pid]) != s.cgroup]
    assert outside == []
