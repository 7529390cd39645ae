"""`serve --stdio --persist` with the user's server answering on the default socket (a
carrier's reconnect, contracts.md "Sessions that survive anything"): a relay that imports
only the interpreter's own modules, carries a session byte for byte to that server, and
leaves it the server's when the carrier goes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers import (
    SH,
    StdioServer,
    ctrl,
    far_side_process,
    split_output,
    start_server,
    ttyserve_command,
)

from ttyserve.client import connect
from ttyserve.defaults import PERSIST_ARGUMENTS
from ttyserve.protocol.messages import Hello, Open

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("workers")]

# What a relay must never load: the event loop, the codec, the command line, the server.
HEAVY = ("asyncio", "anyio", "msgspec", "ttyserve.cli.main", "ttyserve.server", "selectors")


@pytest.fixture
def runtime(short_dir: Path) -> Iterator[Path]:
    """A runtime directory whose default socket a server answers on."""
    server = start_server(short_dir, listen=[f"unix:{short_dir / 'ttyserve.sock'}"])
    try:
        yield short_dir
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def relay(runtime: Path) -> AsyncIterator[StdioServer]:
    """The carrier's far side, `ttyserve serve --stdio --persist`, on our pipes, its
    imports on its stderr (`-X importtime`)."""
    async with far_side_process(ttyserve_command(*PERSIST_ARGUMENTS), {
            "XDG_RUNTIME_DIR": str(runtime), "PYTHONPROFILEIMPORTTIME": "1"}) as process:
        yield process


def imported(stderr: str) -> list[str]:
    return [line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "imported package" not in line]


@pytest.mark.asyncio
async def test_a_reconnect_relays_to_the_running_server_importing_only_builtins(
        runtime: Path) -> None:
    async with relay(runtime) as far:
        await far.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", r"printf 'a\000b\377'; echo err >&2; exit 3"], pty=False)))
        frames = await far.peer.frames_until_eof()
        assert await far.exit_code() == 0
        modules = imported(far.stderr())
    out, err, messages = split_output(frames)
    assert (out, err) == (b"a\0b\xff", b"err\n")
    assert [m["type"] for m in split_output(frames, 0)[2] + messages] == [
        "welcome", "opened", "exit"]
    assert messages[-1]["code"] == 3
    assert "ttyserve.cli.persist" in modules  # (the relay, not a server of its own)
    assert not [name for name in modules if name.startswith(HEAVY)], modules


@pytest.mark.asyncio
async def test_a_detachable_session_stays_the_servers_when_the_relay_goes(
        runtime: Path) -> None:
    async with relay(runtime) as far:
        await far.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=["sleep", "30"], pty=False, detachable=True)))
        assert (await far.peer.next_control())["type"] == "welcome"
        opened = await far.peer.next_control()
        assert opened["type"] == "opened"
        await far.peer.transport.send_eof()  # the carrier goes: stdin's end
        assert await far.exit_code() == 0
    async with connect(f"unix:{runtime / 'ttyserve.sock'}", multiplex=True) as conn:
        (info,) = await conn.list_sessions()
        assert (info.session, info.attached) == (opened["session"], False)
        again = await conn.attach(info.session)
        await again.cancel()
