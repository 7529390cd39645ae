"""Running under a service manager (contracts.md): socket activation by systemd's protocol,
tested by handing the server real inherited sockets (descriptors 3 and on, LISTEN_PID its
own pid, LISTEN_FDNAMES naming a WebSocket listener)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SH, ServerProcess, start_server, ttyserve_command

from ttyserve.exitcodes import ServeExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
# The wrapper a service manager is: LISTEN_PID is the pid that execs the server.
AS_ACTIVATED = ("sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh")


def handing(*sockets: socket.socket) -> dict[str, object]:
    """Popen's arguments that put ``sockets`` at descriptors 3, 4, ... of the server."""
    high = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 20) for s in sockets]

    def in_place() -> None:  # in the child, before it execs: systemd's layout
        for target, fd in enumerate(high, 3):
            os.dup2(fd, target)

    return {"preexec_fn": in_place, "pass_fds": tuple(range(3, 3 + len(sockets))),
            "_close_after": high}


@contextlib.contextmanager
def activated(short_dir: Path, names: str, *sockets: socket.socket, lines: int,
              browse: int = 0) -> Iterator[ServerProcess]:
    given = handing(*sockets)
    high = given.pop("_close_after")
    try:
        server = start_server(short_dir, "--command", SH, listen=[], expect_lines=lines,
                              expect_browse=browse, prefix=AS_ACTIVATED,
                              env={"LISTEN_FDS": str(len(sockets)), "LISTEN_FDNAMES": names},
                              **given)
    finally:
        for fd in high:  # type: ignore[attr-defined]
            os.close(fd)
    try:
        yield server
    finally:
        server.stop()


def test_the_server_serves_on_the_sockets_it_is_handed(short_dir: Path) -> None:
    path = short_dir / "activated.sock"
    framed = socket.socket(socket.AF_UNIX)
    framed.bind(str(path))
    framed.listen()
    web = socket.create_server(("127.0.0.1", 0))
    port = web.getsockname()[1]
    with framed, web, activated(short_dir, "control:ws", framed, web, lines=2,
                                browse=1) as server:
        assert server.addresses == [f"unix:{path}", f"ws:127.0.0.1:{port}"]
        ran = subprocess.run(ttyserve_command("exec", "--connect", f"unix:{path}", "--", SH,
                                              "-c", "echo served; exit 4"),
                             capture_output=True, timeout=30)
        assert (ran.returncode, ran.stdout) == (4, b"served\n"), ran.stderr
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        assert server.stop(signal.SIGTERM) == ServeExit.OK
    assert path.exists()  # the service manager's socket: not the server's to remove


def test_a_descriptor_that_is_not_a_listening_socket_is_exit_3(short_dir: Path) -> None:
    unlistened = socket.socket(socket.AF_UNIX)  # bound to nothing, listening for nothing
    given = handing(unlistened)
    high = given.pop("_close_after")
    try:
        result = subprocess.run(
            [*AS_ACTIVATED, *ttyserve_command("serve", "--workers", "1")],
            env={**os.environ, "LISTEN_FDS": "1", "LISTEN_FDNAMES": "control"},
            capture_output=True, text=True, timeout=30, **given)  # type: ignore[call-overload]
    finally:
        unlistened.close()
        for fd in high:  # type: ignore[attr-defined]
            os.close(fd)
    assert result.returncode == ServeExit.CONFIG, result.stderr
    assert "inherited descriptor 3 (control): not a listening stream socket" in result.stderr


def test_another_processs_listen_pid_is_not_ours(short_dir: Path) -> None:
    """LISTEN_PID names another process: nothing was handed to this one, which binds
    --listen as always (and no session inherits the variables)."""
    server = start_server(short_dir, "--command", SH,
                          env={"LISTEN_PID": "1", "LISTEN_FDS": "1"})
    try:
        assert server.addresses == [f"unix:{short_dir / 's.sock'}"]
        ran = subprocess.run(ttyserve_command("exec", "--connect", server.addresses[0], "--",
                                              SH, "-c", "echo ${LISTEN_FDS:-none}"),
                             capture_output=True, timeout=30)
        assert ran.stdout == b"none\n", ran.stderr
    finally:
        server.stop()


def test_the_sockets_handed_over_are_kept_across_an_upgrade_in_place(
        short_dir: Path, workers: int) -> None:
    """SIGUSR2 (systemctl reload): the new code finds no LISTEN_PID of its own, and serves on
    the handed sockets all the same (with workers, the supervisor holds them anyway)."""
    path = short_dir / "activated.sock"
    framed = socket.socket(socket.AF_UNIX)
    framed.bind(str(path))
    framed.listen()
    with framed, activated(short_dir, "control", framed, lines=1) as server:
        server.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while server.stderr_tail().count("upgraded:") < workers:  # (a log line, no event)
            assert time.monotonic() < deadline, server.stderr_tail()
            time.sleep(0.05)
        ran = subprocess.run(ttyserve_command("exec", "--connect", f"unix:{path}", "--", SH,
                                              "-c", "echo again"),
                             capture_output=True, timeout=30)
        assert ran.stdout == b"again\n", (ran.stderr, server.stderr_tail())


def test_json_logs_are_one_object_a_line(short_dir: Path, workers: int) -> None:
    server = start_server(short_dir, "--log-format", "json")
    assert server.stop(signal.SIGTERM) == ServeExit.OK
    lines = [json.loads(line) for line in server.stderr_tail().splitlines()]
    assert lines and all({"time", "level", "message"} <= set(line) for line in lines)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"])
               for line in lines)
    said = [line["message"] for line in lines]
    assert any("shutting down gracefully" in message for message in said), said
    assert ({line["worker"] for line in lines if "worker" in line}
            == (set() if workers == 1 else {0, 1}))


def test_a_handed_web_socket_needs_its_token_on_every_worker(short_dir: Path) -> None:
    """The token the server made for a handed `ws` socket is asked of every connection,
    whichever worker serves it (a worker checks what its supervisor accepts for it)."""
    web = socket.create_server(("127.0.0.1", 0))
    port = web.getsockname()[1]
    with web, activated(short_dir, "ws", web, lines=1, browse=1) as server:
        token = server.browse[0].split("#token=", 1)[1]
        for _ in range(4):  # (connections take turns between the workers)
            refused = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/sessions")
            with pytest.raises(urllib.error.HTTPError) as answer:
                urllib.request.urlopen(refused, timeout=10)
            assert answer.value.code == 401
            allowed = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/sessions",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(allowed, timeout=10) as listed:
                assert listed.status == 200
