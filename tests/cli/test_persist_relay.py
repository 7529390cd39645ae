"""`serve --stdio --persist` with the user's server answering on the default socket (a
carrier's reconnect, contracts.md "Sessions that survive anything"): a relay that imports
only the interpreter's own modules, carries a session byte for byte to that server, and
leaves it the server's when the carrier goes."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from helpers import SH, RawPeer, ctrl, split_output, start_server, ttyserve_command

from ttyserve.client import connect
from ttyserve.defaults import PERSIST_ARGUMENTS
from ttyserve.protocol.messages import Hello, Open
from ttyserve.transport.streams import PipeTransport

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("workers")]

# What a relay must never load: the event loop, the codec, the command line, the server.
HEAVY = ("asyncio", "anyio", "msgspec", "ttyserve.cli.main", "ttyserve.server", "selectors")


class Relay:
    def __init__(self, process: subprocess.Popen[bytes], peer: RawPeer) -> None:
        self.process = process
        self.peer = peer

    async def exit_code(self) -> int:
        with anyio.fail_after(10):
            return await anyio.to_thread.run_sync(self.process.wait)

    def imported(self) -> list[str]:
        """The modules it imported (`-X importtime` on its stderr)."""
        assert self.process.stderr is not None
        lines = self.process.stderr.read().decode().splitlines()
        return [line.rsplit("|", 1)[1].strip() for line in lines
                if line.startswith("import time:") and "imported package" not in line]


@contextlib.asynccontextmanager
async def relay(runtime: Path) -> AsyncIterator[Relay]:
    """The carrier's far side, `ttyserve serve --stdio --persist`, on our pipes, with the
    default socket in ``runtime``."""
    to_relay, from_us = os.pipe()
    from_relay, to_us = os.pipe()
    process = subprocess.Popen(
        ttyserve_command(*PERSIST_ARGUMENTS), stdin=to_relay, stdout=to_us,
        stderr=subprocess.PIPE,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPROFILEIMPORTTIME": "1"})
    os.close(to_relay)
    os.close(to_us)
    transport = PipeTransport(from_relay, from_us)
    try:
        yield Relay(process, RawPeer(transport))
    finally:
        await transport.aclose()
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()


@pytest.mark.asyncio
async def test_a_reconnect_relays_to_the_running_server_importing_only_builtins(
        short_dir: Path) -> None:
    server = start_server(short_dir, listen=[f"unix:{short_dir / 'ttyserve.sock'}"])
    try:
        async with relay(short_dir) as far_side:
            await far_side.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
                argv=[SH, "-c", r"printf 'a\000b\377'; echo err >&2; exit 3"], pty=False)))
            frames = await far_side.peer.frames_until_eof()
            assert await far_side.exit_code() == 0
            imported = far_side.imported()
    finally:
        server.stop()
    out, err, messages = split_output(frames)
    assert (out, err) == (b"a\0b\xff", b"err\n")
    assert [m["type"] for m in split_output(frames, 0)[2] + messages] == [
        "welcome", "opened", "exit"]
    assert messages[-1]["code"] == 3
    assert "ttyserve.cli.persist" in imported  # (the relay, not a server of its own)
    assert not [name for name in imported if name.split(".")[0] in HEAVY
                or name.startswith(HEAVY)], imported


@pytest.mark.asyncio
async def test_a_detachable_session_stays_the_servers_when_the_relay_goes(
        short_dir: Path) -> None:
    server = start_server(short_dir, listen=[f"unix:{short_dir / 'ttyserve.sock'}"])
    try:
        async with relay(short_dir) as far_side:
            await far_side.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
                argv=["sleep", "30"], pty=False, detachable=True)))
            assert (await far_side.peer.next_control())["type"] == "welcome"
            opened = await far_side.peer.next_control()
            assert opened["type"] == "opened"
            await far_side.peer.transport.send_eof()  # the carrier goes: stdin's end
            assert await far_side.exit_code() == 0
        async with connect(f"unix:{short_dir / 'ttyserve.sock'}", multiplex=True) as conn:
            (info,) = await conn.list_sessions()
            assert (info.session, info.attached) == (opened["session"], False)
            again = await conn.attach(info.session)
            await again.cancel()
    finally:
        server.stop()
