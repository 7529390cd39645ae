"""Acceptance 10: a person at a real terminal runs `ttyserve exec -t` into a remote shell.

The terminal is a real PTY whose slave is the controlling terminal of the
client, as in a terminal emulator: keys are written to the master, the screen
is read from it, and a window resize is TIOCSWINSZ on it (the kernel then
sends SIGWINCH to the client).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, children_of, ttyserve_command

from ttyserve.backends.spawn import Stdio, encode_environment, spawn

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
PROMPT = b"remote$ "


class Terminal:
    """A PTY running one program as its controlling terminal's session leader."""

    def __init__(self, argv: list[str], rows: int = 24, cols: int = 80) -> None:
        self.master, slave = os.openpty()
        self.resize(rows, cols)
        self.slave_path = os.ttyname(slave)
        env = encode_environment({**os.environ, "TERM": "xterm"})
        self.pid = spawn(argv[0], argv, env, os.getcwd(), Stdio(tty_path=self.slave_path))
        self._slave = slave  # kept open: the terminal's settings stay readable after exit
        self.screen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def expect(self, pattern: bytes, timeout: float = 10) -> bytes:
        """Read the screen until ``pattern`` (a regex) appears after what was matched before."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.screen)):
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(remaining, 0))
            assert ready, f"{pattern!r} not on screen; screen: {self.screen[-500:]!r}"
            self.screen += os.read(self.master, 65536)
        self.screen = self.screen[match.end():]
        return match.group(0)

    def settings(self) -> list[object]:
        return termios.tcgetattr(self._slave)

    def wait(self, timeout: float = 10) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        raise AssertionError("the client did not exit")

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self.master)
        os.close(self._slave)


@pytest.fixture
def terminal(server_process: ServerProcess) -> Iterator[Terminal]:
    argv = ttyserve_command("exec", "-t", "--connect", server_process.addresses[0],
                            "--env", f"PS1={PROMPT.decode()}", "--", "/bin/sh", "-i")
    term = Terminal(argv)
    try:
        yield term
    finally:
        term.close()


def in_the_foreground(ancestor: int, program: bytes) -> bool:
    """Whether a descendant of ``ancestor`` running ``program`` is the foreground job of its
    terminal (its process group is the terminal's: /proc/PID/stat's pgrp and tpgid)."""
    pending = children_of(ancestor)
    while pending:
        pid = pending.pop()
        pending += children_of(pid)
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if argv0.endswith(program) and fields[2] == fields[5]:
            return True
    return False


def test_a_person_at_a_terminal(terminal: Terminal, server_process: ServerProcess) -> None:
    cooked = terminal.settings()
    terminal.expect(re.escape(PROMPT))
    raw = terminal.settings()
    assert not raw[3] & termios.ICANON and not raw[3] & termios.ECHO  # local terminal is raw

    terminal.type(b"echo $((6*7))\r")
    terminal.expect(rb"\r\n42\r\n")
    terminal.expect(re.escape(PROMPT))

    terminal.type(b"stty size\r")
    terminal.expect(rb"\r\n24 80\r\n")
    terminal.resize(40, 132)  # the window grows: the client sees SIGWINCH and sends resize
    terminal.expect(re.escape(PROMPT))
    deadline = time.monotonic() + 10
    while True:  # the resize travels concurrently with our typing: ask until it has arrived
        terminal.type(b"stty size\r")
        size = terminal.expect(rb"\r\n\d+ \d+\r\n")
        terminal.expect(re.escape(PROMPT))
        if size == b"\r\n40 132\r\n" or time.monotonic() > deadline:
            break
    assert size == b"\r\n40 132\r\n"

    terminal.type(b"sleep 30; echo not-interrupted\r")
    terminal.expect(rb"sleep 30; echo not-interrupted\r\n")
    # The line is echoed before the shell runs it: a Ctrl-C that comes before `sleep` is the
    # remote terminal's foreground job goes to the shell, which goes on waiting for `sleep`.
    deadline = time.monotonic() + 10
    while not in_the_foreground(server_process.pid, b"sleep"):
        assert time.monotonic() < deadline, "sleep never became the foreground job"
        time.sleep(0.01)
    started = time.monotonic()
    terminal.type(b"\x03")  # Ctrl-C: a byte for the remote terminal, as with ssh
    terminal.expect(re.escape(PROMPT))
    assert time.monotonic() - started < 5
    assert b"not-interrupted" not in terminal.screen

    terminal.type(b"exit 3\r")
    assert terminal.wait() == 3
    assert terminal.settings() == cooked  # the local terminal is restored


def test_terminal_is_restored_when_the_server_dies(short_dir: object) -> None:
    from pathlib import Path

    from helpers import start_server

    server = start_server(Path(str(short_dir)), "--command", "/bin/sh -i")
    term = Terminal(ttyserve_command("exec", "-t", "--connect", server.addresses[0],
                                     "--env", f"PS1={PROMPT.decode()}"))
    try:
        cooked = term.settings()
        term.expect(re.escape(PROMPT))
        assert term.settings() != cooked
        server.stop(9)  # the connection breaks under the client
        assert term.wait() == 255
        assert term.settings() == cooked
        term.expect(rb"exit status is unknown")
    finally:
        term.close()
        server.stop()
