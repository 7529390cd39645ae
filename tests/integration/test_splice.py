"""Round 3, item 5: a pipe session's output goes from its pipe into a Unix socket by splice(2),
never read by the server; over TCP, and for a detachable session (its ring needs the bytes),
it is read and sent. Either way the client gets every byte, in order, within its credit.

Whether the server read the bytes is the kernel's own count of what it read(2) (`rchar` in
/proc/PID/io: splice is not counted there, a read is; a reaped child's reads are added, so
the command makes its bytes without reading them)."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server

from ttyserve.client import connect
from ttyserve.transport.splice import CAN_SPLICE

pytestmark = [pytest.mark.usefixtures("workers"), pytest.mark.asyncio, pytest.mark.timeout(60),
              pytest.mark.skipif(not CAN_SPLICE, reason="splice(2) is Linux's")]
SIZE = 24 << 20
TOKEN = "splice-token"
WINDOW = 100_003  # credit that never falls on a frame's edge


def rchar(pid: int) -> int:
    """The bytes process ``pid`` read with read(2) and its kin so far."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    token = short_dir / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    process = start_server(short_dir, "--token-file", str(token), "--linger", "1",
                           listen=[f"unix:{short_dir / 's.sock'}", "tcp:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


PRODUCER = [sys.executable, "-c", "import random, sys; "
            f"sys.stdout.buffer.write(random.Random(7).randbytes({SIZE}))"]
EXPECTED = random.Random(7).randbytes(SIZE)


@pytest.mark.parametrize(("listener", "detachable", "spliced"), [
    (0, False, True), (1, False, False), (0, True, False)],
    ids=["unix-spliced", "tcp-read", "unix-detachable-read"])
@pytest.mark.parametrize("window", [None, WINDOW], ids=["no-window", "window"])
async def test_pipe_output_is_spliced_only_into_a_unix_socket_and_arrives_whole(
        server: ServerProcess, listener: int, detachable: bool, spliced: bool,
        window: int | None) -> None:
    before = sum(rchar(pid) for pid in server.worker_pids())
    async with connect(server.addresses[listener], token=TOKEN, multiplex=True,
                       window=window) as conn:
        session = await conn.spawn(PRODUCER, pty=False, detachable=detachable)
        received = bytearray()
        while (chunk := await session.receive()) is not None:
            received += chunk.data
        status = await session.wait()
    read = sum(rchar(pid) for pid in server.worker_pids()) - before
    assert status.code == 0, status
    assert received == EXPECTED
    if spliced:
        assert read < SIZE // 4, f"the server read {read} of {SIZE} bytes"
    else:
        assert read >= SIZE, f"the server read {read} of {SIZE} bytes"
