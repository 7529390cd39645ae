"""`exec` never reports a lost session as a success: every way a connection can end without
the session's `exit` (a reset, silence the heartbeat notices, the server killed, the server
upgrading itself) gives 255, and with --json an `error` event of class `lost`, last."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults import fault_proxy
from helpers import ServerProcess, start_server
from helpers import token_file as write_token
from test_exec_resume import run_exec

from ttyserve.errors import TargetFailure
from ttyserve.exitcodes import ExecExit

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "exec-lost-token"
MARKER = b"marker-line"
SCRIPT = ["sh", "-c", "echo marker-line; sleep 60"]


@pytest.fixture
def token_file(short_dir: Path) -> Path:
    return write_token(short_dir, TOKEN)


@pytest.fixture
def server(short_dir: Path, token_file: Path) -> Iterator[ServerProcess]:
    process = start_server(short_dir, "--token-file", str(token_file),
                           listen=["tcp:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


def kill_server(server: ServerProcess) -> None:
    os.kill(server.pid, signal.SIGKILL)


def upgrade_server(server: ServerProcess) -> None:
    os.kill(server.pid, signal.SIGUSR2)  # `server_restarting`, then the new code takes over


def assert_lost(code: int, out: bytes, err: str) -> None:
    events = [json.loads(line) for line in out.splitlines()]
    names = [event["event"] for event in events]
    assert code == ExecExit.FAILURE, (code, err)
    assert names[0] == "opened" and "exit" not in names, events
    assert events[-1]["event"] == "error" and events[-1]["class"] == TargetFailure.LOST, (
        events, err)


@pytest.mark.parametrize("how", ["reset", "silence", "server killed", "server upgraded"])
async def test_a_connection_that_ends_without_exit_is_255_and_lost(
        server: ServerProcess, token_file: Path, how: str) -> None:
    extra: list[str] = []
    async with fault_proxy(server.addresses[0]) as proxy:

        async def fault(process: object) -> None:
            await proxy.wait_fault()  # the marker went through: the command runs
            if how == "silence":
                proxy.black_hole()
            elif how == "server killed":
                kill_server(server)
            elif how == "server upgraded":
                upgrade_server(server)

        if how == "reset":
            proxy.cut_after = MARKER
        else:
            proxy.seen_after = MARKER
        if how == "silence":
            extra = ["--heartbeat", "1"]
        if how == "server upgraded":
            extra = ["--detachable"]  # (an undetachable one would be hung up: its exit comes)
        code, out, err = await run_exec(proxy, token_file, *extra, "--json", "-T", "--",
                                        *SCRIPT, during=fault if how != "reset" else None)
    assert_lost(code, out, err)

