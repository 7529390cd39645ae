"""The door over a real ssh (protocol section 15): a target reached by `ssh://` through
OpenSSH's sshd on loopback, with the door's keys; the client holds none. Its session's
output and exit are the far side's, and a dropped ssh is resumed under it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import ServerProcess, children_of, server_pid, start_server, wait_until_gone

from ttyserve.client import connect

if TYPE_CHECKING:  # not imported when run: `conftest` names a different module per directory
    from conftest import Sshd

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("workers")]


@pytest.fixture
def door(sshd: Sshd, short_dir: Path) -> Iterator[ServerProcess]:
    """A door whose one target, `web-1`, is this machine over ssh, its far side's server
    in a runtime directory of its own (stopped after the test)."""
    runtime = Path(tempfile.mkdtemp(prefix="tts-rt-", dir="/tmp"))
    runtime.chmod(0o700)
    wrapper = sshd.directory / "ttyserve-door-far"
    wrapper.write_text(f'#!/bin/sh\nXDG_RUNTIME_DIR={runtime} exec {sshd.remote_command} "$@"\n')
    wrapper.chmod(0o755)
    targets = short_dir / "targets.toml"
    targets.write_text(f'[targets.web-1]\nvia = "{sshd.address}"\n'
                       f'remote_command = "{wrapper}"\nlabels = {{ role = "web" }}\n')
    server = start_server(short_dir, "--targets", str(targets), env=sshd.env)
    try:
        yield server
    finally:
        server.stop()
        pid = server_pid(runtime / "ttyserve.sock")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # the server the far side started: ours to end
            assert wait_until_gone(pid)
        shutil.rmtree(runtime, ignore_errors=True)


def door_ssh(door: ServerProcess) -> list[int]:
    """The ssh clients the door runs (carriers, children of its workers)."""
    return [child for worker in door.worker_pids() for child in children_of(worker)
            if Path(f"/proc/{child}/comm").read_text().strip() == "ssh"]


@pytest.mark.asyncio
async def test_a_session_on_an_ssh_target_through_the_door(door: ServerProcess) -> None:
    async with connect(door.addresses[0], multiplex=True) as conn:
        assert [(t.name, t.labels) for t in await conn.list_targets()] == [
            ("web-1", {"role": "web"})]
        session = await conn.spawn(["sh", "-c", "echo over ssh; exit 5"], pty=False,
                                   target="web-1")
        out = b"".join([chunk.data async for chunk in session])
        assert out == b"over ssh\n" and (await session.wait()).code == 5
        lines = 300
        script = f"i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo l$i; sleep 0.01; done"
        kept = await conn.spawn(["sh", "-c", script], pty=False, target="web-1",
                                detachable=True)
        first = await kept.receive()
        assert first is not None
        (ssh,) = door_ssh(door)
        os.kill(ssh, signal.SIGKILL)  # the door's ssh drops, for real
        out = first.data + b"".join([chunk.data async for chunk in kept])
        assert out == b"".join(b"l%d\n" % i for i in range(1, lines + 1))
        assert (await kept.wait()).code == 0
