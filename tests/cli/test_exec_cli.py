"""Acceptance 9, client side: `ttyserve exec` exit codes and streams from real subprocesses."""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    SH,
    ServerProcess,
    processes_in_group,
    start_server,
    ttyserve_command,
    wait_for_line,
)

from ttyserve.defaults import TERM_GRACE
from ttyserve.exitcodes import ExecExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


def exec_cmd(server: ServerProcess | str, *args: str, stdin: bytes = b"",
             timeout: float = 20) -> subprocess.CompletedProcess[bytes]:
    address = server if isinstance(server, str) else server.addresses[0]
    return subprocess.run(ttyserve_command("exec", "--connect", address, *args), input=stdin,
                          capture_output=True, timeout=timeout)


def test_exit_0_and_byte_for_byte_streams(server_process: ServerProcess) -> None:
    payload = os.urandom(300_000)
    result = exec_cmd(server_process, "--", SH, "-c", "cat; printf 'to-stderr' >&2",
                      stdin=payload)
    assert result.returncode == 0
    assert result.stdout == payload
    assert result.stderr == b"to-stderr"


def test_remote_status_is_the_exit_code(server_process: ServerProcess) -> None:
    assert exec_cmd(server_process, "--", SH, "-c", "exit 7").returncode == 7


def test_command_not_found_is_127(server_process: ServerProcess) -> None:
    result = exec_cmd(server_process, "--", "no-such-command")
    assert result.returncode == ExecExit.NOT_FOUND
    assert b"no-such-command" in result.stderr


def test_not_executable_is_126(server_process: ServerProcess, tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert exec_cmd(server_process, "--", str(script)).returncode == ExecExit.CANNOT_EXECUTE


def test_remote_sigkill_is_137(server_process: ServerProcess) -> None:
    assert exec_cmd(server_process, "--", SH, "-c", "kill -9 $$").returncode == 137


def test_no_server_is_255_and_says_a_retry_may_help(short_dir: Path) -> None:
    result = exec_cmd(f"unix:{short_dir / 'nobody.sock'}", "--", "true")
    assert result.returncode == ExecExit.FAILURE
    assert b"cannot connect" in result.stderr and b"retry may help" in result.stderr


def test_usage_error_is_255() -> None:
    result = subprocess.run(ttyserve_command("exec", "--retries", "x"), capture_output=True,
                            timeout=20)
    assert result.returncode == ExecExit.FAILURE


def test_json_events(server_process: ServerProcess) -> None:
    result = exec_cmd(server_process, "--json", "--", SH, "-c", "echo out; echo err >&2; exit 4")
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 4
    assert events[0]["event"] == "opened" and events[0]["pid"] > 0
    data = {e["event"]: base64.b64decode(e["data"]) for e in events[1:-1]}
    assert data == {"stdout": b"out\n", "stderr": b"err\n"}
    assert events[-1] == {"event": "exit", "code": 4}


def test_json_signal_exit_carries_every_member(server_process: ServerProcess) -> None:
    result = exec_cmd(server_process, "--json", "--", SH, "-c", "kill -9 $$")
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "event": "exit", "code": -9, "signal": "KILL", "core_dumped": False}


def test_env_and_cwd_flags(server_process: ServerProcess, tmp_path: Path) -> None:
    result = exec_cmd(server_process, "--env", "A=1", "--env", "B=x=y", "--cwd", str(tmp_path),
                      "--", SH, "-c", 'echo "$A $B $(pwd)"')
    assert result.stdout == f"1 x=y {tmp_path}\n".encode()


def test_retries_wait_for_a_server_that_comes_up(short_dir: Path) -> None:
    address = f"unix:{short_dir / 's.sock'}"
    client = subprocess.Popen(ttyserve_command("exec", "--connect", address, "--retries", "8",
                                               "--", "echo", "finally"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stderr is not None
    first = client.stderr.readline()  # it has failed once already
    assert b"retrying" in first and b"No such file" in first
    server = start_server(short_dir)
    try:
        out, err = client.communicate(timeout=30)
        assert client.returncode == 0, err
        assert out == b"finally\n"
    finally:
        server.stop()


def test_first_sigint_is_forwarded_second_cancels_with_130(server_process: ServerProcess) -> None:
    script = "trap 'echo got-int' INT; while :; do sleep 0.05; done"
    client = subprocess.Popen(ttyserve_command("exec", "--connect", server_process.addresses[0],
                                               "--json", "-T", "--", SH, "-c", script),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pgid = json.loads(wait_for_line(client))["pid"]
        client.send_signal(signal.SIGINT)
        event = json.loads(wait_for_line(client))
        assert base64.b64decode(event["data"]) == b"got-int\n"  # forwarded, still running
        client.send_signal(signal.SIGINT)
        assert client.wait(10) == ExecExit.INTERRUPTED
        deadline = time.monotonic() + 3
        while processes_in_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_in_group(pgid) == []  # the session was cancelled
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()


def test_sigterm_to_the_client_is_forwarded(server_process: ServerProcess) -> None:
    script = "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"
    client = subprocess.Popen(ttyserve_command("exec", "--connect", server_process.addresses[0],
                                               "-T", "--", SH, "-c", script),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for_line(client) == b"ready\n"
        client.send_signal(signal.SIGTERM)
        out, _ = client.communicate(timeout=10)
        assert (client.returncode, out) == (3, b"got-term\n")
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()


def test_sigint_while_retrying_stops_at_once_and_starts_nothing(short_dir: Path) -> None:
    client = subprocess.Popen(ttyserve_command("exec", "--connect", f"unix:{short_dir / 'none'}",
                                               "--retries", "50", "--", "true"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stderr is not None
    assert b"retrying" in client.stderr.readline()
    started = time.monotonic()
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=10)
    assert client.returncode == ExecExit.INTERRUPTED
    assert time.monotonic() - started < 3
    assert b"nothing was started" in err


@pytest.mark.parametrize("mode", ["-t", "-T"])
@pytest.mark.parametrize("second", [False, True], ids=["grace", "second SIGTERM"])
def test_a_scripts_timeout_never_wedges_on_a_remote_that_ignores_sigterm(
        server_process: ServerProcess, mode: str, second: bool) -> None:
    """contracts.md: SIGTERM is forwarded; a session not ended TERM_GRACE seconds later, or
    at a second SIGTERM, is cancelled, and `exec` exits 143 (as `timeout` around ssh does
    not: it waits for the remote forever)."""
    client = subprocess.Popen(
        ttyserve_command("exec", "--connect", server_process.addresses[0], mode, "--", SH,
                         "-c", "trap 'echo got-term' TERM; echo up; while :; do sleep 1; done"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with client:
        assert client.stdout is not None and client.stdout.readline().strip() == b"up"
        started = time.monotonic()
        client.send_signal(signal.SIGTERM)
        while (line := client.stdout.readline()).strip() != b"got-term":  # forwarded, and
            assert line, "the client ended before the remote said it got SIGTERM"  # survived
        if second:
            client.send_signal(signal.SIGTERM)
        code = client.wait(TERM_GRACE + 10)
        elapsed = time.monotonic() - started
        assert client.stderr is not None
        said = client.stderr.read().decode()
    assert code == ExecExit.SIGNAL_BASE + signal.SIGTERM, said
    assert "cancelled" in said
    if second:
        assert elapsed < TERM_GRACE / 2 + 1, elapsed
    else:
        assert TERM_GRACE * 0.9 <= elapsed < TERM_GRACE + 5, elapsed
    assert wait_until_no_sessions(server_process)


def wait_until_no_sessions(server: ServerProcess) -> bool:
    """The cancelled session's process is gone (its end is the server's to finish)."""
    deadline = time.monotonic() + 10
    while server.session_children():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
