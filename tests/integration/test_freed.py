"""Defect 7 of issue 27: what a server served does not stay. An ended session, its channel
and its connection are freed as soon as they are let go, by reference counting alone, with
no wait for the cycle collector (which a quiet server never runs): each kind of session,
run with the collector off, leaves no `ServerSession` and no `ConnectionHandler` alive."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from helpers import SH, reattached, running_server, wait_until

from ttyserve.client import Connection, connect
from ttyserve.server.listener import Server

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def plain(conn: Connection) -> None:
    assert (await (await conn.spawn([SH, "-c", "echo hi"], pty=False)).wait()).code == 0


async def echoed(conn: Connection) -> None:
    session = await conn.spawn(["cat"], pty=False)
    await session.send(b"x" * 100_000)
    await session.eof()
    assert (await session.wait()).code == 0


async def cancelled(conn: Connection) -> None:
    session = await conn.spawn(["sleep", "60"], pty=False)
    await session.cancel()


async def pty(conn: Connection) -> None:
    assert (await (await conn.spawn([SH, "-c", "exit 3"], pty=True)).wait()).code == 3


async def multiplexed(conn: Connection) -> None:
    sessions = [await conn.spawn([SH, "-c", f"echo {n}"], pty=False) for n in range(4)]
    for session in sessions:
        assert (await session.wait()).code == 0


KINDS: dict[str, Callable[[Connection], Awaitable[None]]] = {
    "plain": plain, "echo": echoed, "cancel": cancelled, "pty": pty, "mux": multiplexed}


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def watched(server: Server, work: Callable[[], Awaitable[None]]) -> list[weakref.ref[object]]:
    """Weak references to every session and connection ``work`` made, taken as it goes."""
    refs: list[weakref.ref[object]] = []
    seen: set[int] = set()

    def look() -> None:
        for thing in [*server.registry.sessions.values(), *server.handlers]:
            if id(thing) not in seen:
                seen.add(id(thing))
                refs.append(weakref.ref(thing))

    async with anyio.create_task_group() as group:
        async def keep_looking() -> None:
            while True:
                look()
                await anyio.sleep(0)

        group.start_soon(keep_looking)
        await work()
        group.cancel_scope.cancel()
    return refs


@pytest.mark.parametrize("kind", [*KINDS, "detach", "drop"])
async def test_an_ended_session_and_its_connection_are_freed_without_the_collector(
        short_dir: Path, kind: str, collector_off: None) -> None:
    async with running_server(short_dir / "s.sock", keep_ended=0) as (server, address):
        async def work() -> None:
            if kind == "detach":
                async with reattached(address, "read x; exit 4") as again:
                    await again.send(b"go\n")
                    assert (await again.wait()).code == 4
            elif kind == "drop":
                async with connect(address, multiplex=True) as conn:
                    await conn.spawn(["sleep", "60"], pty=False)
            else:
                async with connect(address, multiplex=True) as conn:
                    await KINDS[kind](conn)

        refs = await watched(server, work)
        assert await wait_until(lambda: not server.registry.sessions and not server.handlers,
                                10)
        assert refs, "nothing was watched"
        await anyio.sleep(0.1)  # (the tasks that ended them return)
        alive = [type(ref()).__name__ for ref in refs if ref() is not None]
        assert alive == [], f"kept until a collection: {alive}"
