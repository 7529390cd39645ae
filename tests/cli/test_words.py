"""What the commands say, read as a newcomer reads it (issue 41's words): nothing doubled,
each line naming the command and the thing it is about, and a hint where one helps."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from helpers import SH, ServerProcess, start_server, token_file, ttyserve_command

from ttyserve.client import connect
from ttyserve.exitcodes import ExecExit, ServeExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


def run(*args: str, **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command(*args), capture_output=True, text=True,
                          timeout=30, **options)  # type: ignore[call-overload, no-any-return]


def test_a_refusal_is_said_once_by_the_command_that_met_it(short_dir: Path) -> None:
    server = start_server(short_dir, "--token-file", str(token_file(short_dir, "right")),
                          listen=["tcp:127.0.0.1:0"])
    wrong = short_dir / "wrong"
    wrong.write_text("wrong")
    wrong.chmod(0o600)
    try:
        address = server.addresses[0]
        refused = run("exec", "--connect", address, "--token-file", str(wrong), "--", "true")
        assert refused.returncode == ExecExit.FAILURE
        assert refused.stderr.count("unauthorized") == 1, refused.stderr
        attach = run("attach", "--connect", address, "--token-file", str(wrong), "s-any")
        assert attach.stderr.startswith("ttyserve attach: "), attach.stderr
    finally:
        server.stop()


def test_a_port_clash_names_the_address_as_given(short_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        clash = run("serve", "--workers", "1", "--listen", f"ws:127.0.0.1:{port}")
    assert clash.returncode == ServeExit.CONFIG
    assert f"cannot listen on ws:127.0.0.1:{port}:" in clash.stderr, clash.stderr


def test_nothing_listening_says_what_to_run(short_dir: Path) -> None:
    said = run("exec", "--connect", f"unix:{short_dir / 'none.sock'}", "--", "true")
    assert said.returncode == ExecExit.FAILURE and "ttyserve serve" in said.stderr


def test_the_help_says_what_exec_takes_and_starts() -> None:
    help_text = " ".join(run("exec", "--help").stdout.split())
    assert "ws:HOST:PORT" in help_text and "wss:HOST:PORT" in help_text
    assert "(default: $TTYSERVE_TOKEN)" not in help_text  # a token, not a file
    assert "warm server" in help_text and "TTYSERVE_WARM=0" in help_text


def test_an_observer_is_told_once_how_to_watch_again(server_process: ServerProcess) -> None:
    address = server_process.addresses[0]

    async def detached() -> str:
        async with connect(address, multiplex=True) as conn:
            session = await conn.spawn([SH, "-c", "echo up; exec sleep 60"], pty=False,
                                       detachable=True)
            await session.detach()
        assert session.id is not None
        return session.id

    session_id = anyio.run(detached)
    observer = subprocess.Popen(ttyserve_command("attach", "--connect", address, "--observe",
                                                 session_id),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    with observer:
        assert observer.stdout is not None and observer.stdout.readline() == "up\n"
        observer.send_signal(signal.SIGTERM)  # an observer leaves
        assert observer.wait(20) == 0
        assert observer.stderr is not None
        said = observer.stderr.read()
    assert "reattach:" not in said, said
    assert said.count(f"watch again: ttyserve attach --observe {session_id}") == 1, said


def test_the_journals_listing_shows_whole_ids(short_dir: Path) -> None:
    journal = short_dir / "j.jsonl"
    server = start_server(short_dir, "--journal", str(journal))
    try:
        opened = run("exec", "--connect", server.addresses[0], "--detachable", "--json",
                     "--", "true")
        session_id = json.loads(opened.stdout.splitlines()[0])["session"]
    finally:
        server.stop()
    listing = run("sessions", "--journal", str(journal))
    assert session_id in listing.stdout.split(), listing.stdout


def test_a_config_files_bad_value_names_the_file(short_dir: Path) -> None:
    config = short_dir / "bad.toml"
    config.write_text('max_sessions = "many"\n')
    said = run("serve", "--config", str(config), "--listen", f"unix:{short_dir / 's.sock'}")
    assert said.returncode == ServeExit.CONFIG
    assert f"config file {config}: max_sessions:" in said.stderr, said.stderr


def test_an_http_connection_that_ends_says_how(short_dir: Path) -> None:
    server = start_server(short_dir, listen=["ws:127.0.0.1:0"], expect_browse=1)
    try:
        host, port = server.addresses[0].removeprefix("ws:").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n")  # and gone, mid-request
        deadline = time.monotonic() + 10
        while "HTTP connection ended" not in server.stderr_tail():  # (no event: a log line)
            assert time.monotonic() < deadline, server.stderr_tail()
            time.sleep(0.05)
        lines = [line for line in server.stderr_tail().splitlines()
                 if "HTTP connection ended" in line]
        assert all(not line.rstrip().endswith(":") for line in lines), lines
    finally:
        server.stop()
