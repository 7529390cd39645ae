"""Acceptance 9, server side: `ttyserve serve` exit codes from real subprocesses."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    HELLO,
    SH,
    ServerProcess,
    ctrl,
    processes_in_group,
    start_server,
    ttyserve_command,
)

from ttyserve.exitcodes import ServeExit
from ttyserve.protocol.frames import FrameDecoder
from ttyserve.protocol.messages import Open

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


def run_serve(*args: str, timeout: float = 15) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(ttyserve_command("serve", *args), capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def open_session(server: ServerProcess, script: str) -> tuple[socket.socket, int]:
    """Open a pipe session running ``script``; return the socket and the session's pid."""
    path = server.addresses[0].removeprefix("unix:")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    sock.sendall(HELLO + ctrl(1, Open(argv=[SH, "-c", script], pty=False)))
    decoder, frames = FrameDecoder(), []
    while len(frames) < 3:  # welcome, opened, and the first output: the script is running
        frames += decoder.feed(sock.recv(65536))
    return sock, json.loads(frames[1].payload)["pid"]


def test_sigterm_exits_0_and_removes_the_socket(short_dir: Path) -> None:
    server = start_server(short_dir)
    assert server.stop(signal.SIGTERM) == ServeExit.OK
    assert not (short_dir / "s.sock").exists()


def test_sigterm_hangs_up_sessions_which_still_send_exit(short_dir: Path) -> None:
    server = start_server(short_dir, "--command", SH)
    sock, _ = open_session(server, "echo running; sleep 30")
    with sock:
        server.proc.send_signal(signal.SIGTERM)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert server.wait() == ServeExit.OK
    last = FrameDecoder().feed(data)[-1]
    assert json.loads(last.payload) == {"type": "exit", "code": -1, "signal": "HUP",
                                        "core_dumped": False}


def test_bad_flag_exits_2() -> None:
    result = run_serve("--no-such-flag")
    assert result.returncode == ServeExit.USAGE
    assert b"--no-such-flag" in result.stderr


def test_unbindable_address_exits_3(short_dir: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        result = run_serve(f"--listen=tcp:127.0.0.1:{port}")
    finally:
        taken.close()
    assert result.returncode == ServeExit.CONFIG
    assert str(port).encode() in result.stderr
    assert run_serve("--listen=unix:/proc/no/such/dir/s.sock").returncode == ServeExit.CONFIG
    assert run_serve("--listen=bogus").returncode == ServeExit.CONFIG


def test_second_server_on_a_live_socket_exits_4_naming_the_pid(short_dir: Path) -> None:
    server = start_server(short_dir)
    try:
        result = run_serve(f"--listen=unix:{short_dir / 's.sock'}")
        assert result.returncode == ServeExit.LEASE
        assert f"pid {server.pid}".encode() in result.stderr
    finally:
        server.stop()


def test_stale_socket_is_replaced(short_dir: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short_dir / "s.sock"))
    stale.close()  # the file stays, nobody listens: what a killed server leaves
    server = start_server(short_dir)
    assert server.stop() == ServeExit.OK


def test_tcp_port_0_prints_the_real_port(short_dir: Path) -> None:
    server = start_server(short_dir, listen=["tcp:127.0.0.1:0"], env={"TTYSERVE_TOKEN": "t"})
    try:
        host, port = server.addresses[0].removeprefix("tcp:").rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        socket.create_connection((host, int(port)), timeout=5).close()
    finally:
        assert server.stop() == ServeExit.OK


def test_watchdog_forces_exit_1_and_kills_sessions(short_dir: Path) -> None:
    server = start_server(short_dir, "--shutdown-timeout", "1")
    # The client reads nothing more: the session's output, and so its exit, hold the drain.
    sock, pgid = open_session(server, "trap '' HUP PIPE; echo running; "
                                      "while :; do echo flooding; done 2>/dev/null")
    with sock:
        started = time.monotonic()
        assert server.stop(signal.SIGTERM) == ServeExit.ERROR
        elapsed = time.monotonic() - started
    assert 1 <= elapsed < 5, elapsed
    assert processes_in_group(pgid) == []


def test_second_signal_forces_exit_1_at_once(short_dir: Path) -> None:
    server = start_server(short_dir, "--shutdown-timeout", "30")
    sock, pgid = open_session(server, "trap '' HUP; echo running; sleep 30")
    with sock:
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.stop(signal.SIGINT) == ServeExit.ERROR
        assert time.monotonic() - started < 5
    assert processes_in_group(pgid) == []
