"""`exec` in pipe mode to a plain socket runs with no event loop (exec_direct.py): what it
must show is that the loop-free path is the one taken, and that it keeps every promise
under load (the rest of test_exec_cli.py runs through it as well)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SH, ServerProcess, start_server, ttyserve_command, wait_for_line

from ttyserve.exitcodes import ExecExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


def imported(*args: str) -> tuple[subprocess.CompletedProcess[bytes], set[str]]:
    """Run `exec` with -X importtime; its result and the top-level modules it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "ttyserve", *args],
                            capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0]
             for line in result.stderr.decode().splitlines() if line.startswith("import time:")}
    return result, names


def test_pipe_mode_to_a_socket_imports_no_event_loop(short_dir: Path) -> None:
    server = start_server(short_dir, "--insecure",
                          listen=[f"unix:{short_dir / 's.sock'}", "tcp:127.0.0.1:0"])
    try:
        for address in server.addresses:
            result, names = imported("exec", "--connect", address, "-T", "--", SH, "-c",
                                     "echo ran; exit 3")
            assert (result.returncode, result.stdout) == (3, b"ran\n")
            assert {"ttyserve", "msgspec"} <= names  # the listing is read right
            assert not names & {"anyio", "asyncio", "ssl"}, address
        # A PTY still takes the anyio path (raw mode, resize, the detach key).
        result, names = imported("exec", "--connect", server.addresses[0], "-t", "--", "true")
        assert result.returncode == 0 and "anyio" in names
    finally:
        server.stop()


def test_20_mb_through_cat_both_ways_at_once(server_process: ServerProcess) -> None:
    """stdin is read only while little is unsent, and output is read all the while: a
    process echoing its input never deadlocks with us."""
    payload = os.urandom(20 << 20)
    result = subprocess.run(ttyserve_command("exec", "--connect", server_process.addresses[0],
                                             "--", "cat"),
                            input=payload, capture_output=True, timeout=50)
    assert result.returncode == 0, result.stderr
    assert hashlib.sha256(result.stdout).digest() == hashlib.sha256(payload).digest()


def test_closed_output_is_141_and_the_session_is_cancelled(
        server_process: ServerProcess) -> None:
    proc = subprocess.Popen(ttyserve_command("exec", "--json", "--connect",
                                             server_process.addresses[0], "--", "yes"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    remote: int | None = None
    try:
        opened = json.loads(wait_for_line(proc))
        assert opened["event"] == "opened"
        remote = os.pidfd_open(opened["pid"])  # before it can end: no pid reuse
        assert json.loads(wait_for_line(proc))["event"] == "stdout"
        proc.stdout.close()
        assert proc.wait(timeout=20) == ExecExit.SIGNAL_BASE + signal.SIGPIPE
        assert b"local output closed" in proc.stderr.read()
        ready, _, _ = select.select([remote], [], [], 10)
        assert ready, "the remote `yes` still runs: the session did not end"
    finally:
        if remote is not None:
            os.close(remote)
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_stdin_is_cut_to_the_servers_max_frame(short_dir: Path) -> None:
    server = start_server(short_dir, "--max-frame", "4096")
    try:
        payload = os.urandom(300_000)
        result = subprocess.run(ttyserve_command("exec", "--connect", server.addresses[0],
                                                 "--", "cat"),
                                input=payload, capture_output=True, timeout=30)
        assert result.returncode == 0, result.stderr
        assert result.stdout == payload
    finally:
        server.stop()
