"""Clients that resume by themselves (section 10): a library session streams every byte once
through real cuts and black holes, and its real exit comes last."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from faults import fault_proxy
from helpers import ServerProcess, start_server, token_file

from ttyserve.client import connect
from ttyserve.client.session import Lost, Resumed, ResumeEvent
from ttyserve.errors import ConnectionLost
from ttyserve.protocol.messages import Offsets

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180), pytest.mark.usefixtures("workers")]
TOKEN = "resume-client-token"
LINES = 6_000_000  # `seq 1 LINES`: 52.9 MB of numbered lines
SEQ_BYTES = sum(len(str(n)) + 1 for n in range(1, LINES + 1))


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    """TCP with a token, and a ring that holds the whole stream: while the client is away,
    the process goes on (it never waits for a detached client), and nothing may be lost."""
    process = start_server(short_dir, "--token-file", str(token_file(short_dir, TOKEN)),
                           "--scrollback", str(64 << 20), listen=["tcp:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


class Lines:
    """Checks numbered lines as they come: each once, in order."""

    def __init__(self) -> None:
        self.next = 1
        self._partial = b""

    def feed(self, data: bytes) -> None:
        *whole, self._partial = (self._partial + data).split(b"\n")
        for line in whole:
            assert line == b"%d" % self.next, (line[:20], self.next)
            self.next += 1


async def test_a_session_streams_every_line_once_through_30_cuts_and_black_holes(
        server: ServerProcess) -> None:
    rng = random.Random(16)
    points = sorted(rng.sample(range(500_000, SEQ_BYTES - 2_000_000), 30))
    faults = ["black hole" if i % 5 == 2 else "cut" for i in range(30)]  # 6 black holes
    events: list[tuple[float, ResumeEvent]] = []
    lines = Lines()
    async with fault_proxy(server.addresses[0]) as proxy, connect(
            proxy.address, token=TOKEN, heartbeat=1,
            on_resume=lambda event: events.append((anyio.current_time(), event))) as conn:
        session = await conn.spawn(["seq", "1", str(LINES)], pty=False, resume=60)

        async def inject() -> None:
            for point, fault in zip(points, faults, strict=True):
                await proxy.fault_at(point, fault)

        async with anyio.create_task_group() as tg:
            tg.start_soon(inject)
            async for chunk in session:
                assert chunk.stream == "stdout"
                lines.feed(chunk.data)
        status = await session.wait()
    assert proxy.faults == faults
    assert lines.next == LINES + 1 and status.code == 0
    assert session.offsets == Offsets(stdout=SEQ_BYTES) and session.lost_bytes == 0
    assert [type(e) for _, e in events] == [Lost, Resumed] * 30 and proxy.connections == 31
    assert all(e.lost_bytes == 0 for _, e in events if isinstance(e, Resumed))
    # A cut is seen at once; a black hole only by the heartbeat, after 3 x 1 s of silence.
    noticed = [at - fault_at for (at, e), fault_at in zip(events[::2], proxy.fault_times,
                                                         strict=True)]
    for fault, delay in zip(faults, noticed, strict=True):
        assert (2.9 < delay < 6) if fault == "black hole" else delay < 1, (fault, noticed)


async def test_a_session_that_cannot_come_back_in_time_ends_with_connection_lost(
        server: ServerProcess) -> None:
    events: list[ResumeEvent] = []
    async with fault_proxy(server.addresses[0]) as proxy, connect(
            proxy.address, token=TOKEN, on_resume=events.append) as conn:
        session = await conn.spawn(["sleep", "60"], pty=False, resume=1)
        proxy.max_connections = 1  # every redial is closed at once
        proxy.cut()
        started = anyio.current_time()
        with pytest.raises(ConnectionLost, match="could not resume within 1 s"):
            await session.wait()
        assert 1 <= anyio.current_time() - started < 5
    assert [type(e) for e in events] == [Lost]
    # Each redial that failed was followed by a backoff (0.1 s doubling, with jitter): a few
    # tries in the second, not one per round trip.
    assert 3 <= proxy.connections <= 10, proxy.connections
