"""ssh that can drop (section 10 over a carrier): `exec --resume --connect ssh://...` reaches
`serve --stdio --persist` on the far side, which relays to the user's own server there,
started in the background; the ssh client is killed mid-stream, and the command still
finishes with its whole output, once, and its exit code."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import children_of, server_pid, ttyserve_command, wait_until_gone

if TYPE_CHECKING:  # not imported when run: `conftest` names a different module per directory
    from conftest import Sshd

pytestmark = pytest.mark.timeout(90)
LINES = 300


@pytest.fixture
def far_side(sshd: Sshd) -> Iterator[tuple[str, Path]]:
    """A remote command that gives the far side a runtime directory of its own (the user's
    default socket lives there), and, after the test, its background server stopped."""
    runtime = Path(tempfile.mkdtemp(prefix="tts-rt-", dir="/tmp"))
    runtime.chmod(0o700)
    wrapper = sshd.directory / "ttyserve-far"
    wrapper.write_text(f'#!/bin/sh\nXDG_RUNTIME_DIR={runtime} exec {sshd.remote_command} "$@"\n')
    wrapper.chmod(0o755)
    try:
        yield str(wrapper), runtime
    finally:
        pid = server_pid(runtime / "ttyserve.sock")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # the server the far side started: ours to end
            assert wait_until_gone(pid)
        shutil.rmtree(runtime, ignore_errors=True)


def ssh_children(pid: int) -> list[int]:
    return [child for child in children_of(pid)
            if Path(f"/proc/{child}/comm").read_text().strip() == "ssh"]


def test_exec_resume_finishes_whole_when_its_ssh_is_killed(
        sshd: Sshd, far_side: tuple[str, Path]) -> None:
    remote, runtime = far_side
    script = (f"i=0; while [ $i -lt {LINES} ]; do i=$((i+1)); echo line$i; sleep 0.01; "
              "done; exit 7")
    client = subprocess.Popen(
        ttyserve_command("exec", "--resume", "30", "--heartbeat", "1", "--connect",
                         sshd.address, "--remote-command", remote, "-T", "--", "sh", "-c",
                         script), env=sshd.env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout is not None
        first = client.stdout.readline()  # the command runs: the far side's server has it
        assert first == b"line1\n", (first, client.stderr.read() if client.poll() is not None
                                      else "")
        (ssh,) = ssh_children(client.pid)
        os.kill(ssh, signal.SIGKILL)  # the ssh connection drops, for real
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    text = err.decode(errors="replace")
    numbers = [int(n) for n in re.findall(rb"(?m)^line(\d+)$", first + out)]
    assert numbers == list(range(1, LINES + 1)), text
    assert client.returncode == 7, text
    assert re.search(r"connection lost \(.*\); resuming", text), text
    assert re.search(r"resumed after \d+\.\d s", text), text
    assert (runtime / "ttyserve.sock").exists()  # the far side's own server, still serving
