"""Detachable sessions at the command line, in a real terminal (tmux): `exec --detachable`,
the detach key, `sessions --live`, and `attach` with its scrollback and exit code."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import ServerProcess, ttyserve_command

from ttyserve.client import connect

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed: apt-get install tmux")]


class Tmux:
    """A tmux server of our own (its own socket), with windows that run shell lines."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.name, *args], check=True, text=True,
                              capture_output=True, timeout=10).stdout

    def start(self, window: str, line: str) -> None:
        """A window whose shell runs ``line``, then says its status and the terminal's mode."""
        command = f"{line}; echo rc=$?; stty -a | tr ' ' '\\n' | grep -x -e icanon -e echo"
        args = ["new-window", "-d", "-n", window] if self._has_session() else [
            "new-session", "-d", "-s", "t", "-n", window, "-x", "120", "-y", "40"]
        self.run(*args, "sh", "-c", f"{command}; sleep 600")

    def _has_session(self) -> bool:
        return subprocess.run(["tmux", "-L", self.name, "has-session", "-t", "t"],
                              capture_output=True).returncode == 0

    def keys(self, window: str, *keys: str) -> None:
        self.run("send-keys", "-t", f"t:{window}", *keys)

    def screen(self, window: str) -> str:
        return self.run("capture-pane", "-p", "-J", "-S", "-200", "-t", f"t:{window}")

    def expect(self, window: str, pattern: str, timeout: float = 15) -> re.Match[str]:
        """Poll the window's screen (tmux has no event for it) until ``pattern`` is on it."""
        deadline = time.monotonic() + timeout
        while not (match := re.search(pattern, self.screen(window))):
            assert time.monotonic() < deadline, f"{pattern!r} not on screen:\n{self.screen(window)}"
            time.sleep(0.05)
        return match

    def kill(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True,
                           timeout=10)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    session = Tmux(f"ttyserve-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        yield session
    finally:
        session.kill()


def command(*args: str) -> str:
    return shlex.join(ttyserve_command(*args))


def test_detach_list_and_attach_at_a_terminal(server_process: ServerProcess, tmux: Tmux) -> None:
    address = server_process.addresses[0]
    tmux.start("exec", command("exec", "--connect", address, "--detachable", "-t",
                               "--env", "PS1=remote$ ", "--", "sh"))
    session_id = tmux.expect("exec", r"ttyserve: session (\S+) \(reattach: ttyserve attach "
                             r"\1\)").group(1)
    tmux.expect("exec", r"remote\$ ")
    tmux.keys("exec", "echo typed-$((6*7))", "Enter")
    tmux.expect("exec", r"\ntyped-42")
    tmux.keys("exec", "C-\\")
    tmux.keys("exec", "d")  # the detach key: Ctrl-\ then d
    screen = tmux.expect("exec", r"rc=0\nicanon\necho").string  # exit 0, terminal restored
    line = f"ttyserve: session {session_id} (reattach: ttyserve attach {session_id})"
    assert screen.count(line) == 2, screen  # once opened, and again once detached

    listed = subprocess.run(ttyserve_command("sessions", "--live", "--connect", address,
                                             "--json"), capture_output=True, timeout=20)
    assert listed.returncode == 0, listed.stderr
    (info,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (info["session"], info["attached"], info["pty"]) == (session_id, False, True)
    table = subprocess.run(ttyserve_command("sessions", "--live", "--connect", address),
                           capture_output=True, text=True, timeout=20).stdout
    assert re.search(rf"{session_id}\s+-\s+\d+\s+yes\s+\S+\s+detached\s+0\s+-\s+sh", table), table

    tmux.start("attach", command("attach", "--connect", address, session_id))
    tmux.expect("attach", r"typed-42")  # the scrollback first
    tmux.keys("attach", "echo again-$((1+1))", "Enter")
    tmux.expect("attach", r"\nagain-2")  # then live, and interactive
    tmux.keys("attach", "exit 5", "Enter")
    tmux.expect("attach", r"rc=5\nicanon\necho")  # the remote status, the terminal restored


async def detached_shell(address: str) -> str:
    """A detachable `sh` under a PTY, detached: its id."""
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sh"], pty=True, detachable=True, env={"PS1": "remote$ "})
        await session.detach()
    assert session.id is not None
    return session.id


def live_sessions(address: str) -> list[dict[str, object]]:
    listed = subprocess.run(ttyserve_command("sessions", "--live", "--connect", address,
                                             "--json"), capture_output=True, timeout=20)
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line) for line in listed.stdout.splitlines()]


def until_detached(address: str, session_id: str, timeout: float = 15) -> dict[str, object]:
    """Poll `sessions --live` (a closed terminal sends no event we could wait on) until the
    session has no client; its entry."""
    deadline = time.monotonic() + timeout
    while True:
        (info,) = [i for i in live_sessions(address) if i["session"] == session_id]
        if not info["attached"] or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


@pytest.mark.parametrize("client", ["exec --detachable", "attach"])
def test_a_closed_terminal_detaches_and_types_nothing(
        client: str, server_process: ServerProcess, tmux: Tmux, tmp_path: Path) -> None:
    """contracts.md: a terminal that goes away (tmux's session killed: SIGHUP, then EIO on
    stdin and stdout) detaches a detachable session, typing no end-of-input into it, and
    the client says no traceback. The shell is reattached afterwards, still running."""
    address = server_process.addresses[0]
    stderr = tmp_path / "client.stderr"
    if client == "attach":
        session_id = anyio.run(detached_shell, address)
        tmux.start("client", command("attach", "--connect", address, session_id)
                   + f" 2>{stderr}")
    else:
        tmux.start("client", command("exec", "--connect", address, "--detachable", "-t",
                                     "--env", "PS1=remote$ ", "--", "sh") + f" 2>{stderr}")
        tmux.expect("client", r"remote\$ ")  # (opened: the session is listed from now on)
        (info,) = live_sessions(address)
        session_id = str(info["session"])
    tmux.keys("client", "echo typed-$((6*7))", "Enter")
    tmux.expect("client", r"\ntyped-42")
    tmux.kill()  # the terminal goes away
    info = until_detached(address, session_id)
    assert (info["attached"], info.get("exit")) == (False, None), info
    assert "Traceback" not in stderr.read_text(), stderr.read_text()
    with subprocess.Popen(ttyserve_command("attach", "--connect", address, session_id),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as again:
        out, _ = again.communicate(b"echo still-$((1+1))\nexit 7\n", timeout=20)
    assert b"still-2" in out and again.returncode == 7, out


def test_attach_exits_as_exec_does(server_process: ServerProcess) -> None:
    address = server_process.addresses[0]
    unknown = subprocess.run(ttyserve_command("attach", "--connect", address, "no-such-id"),
                             capture_output=True, timeout=20)
    assert unknown.returncode == 255 and b"no_such_session" in unknown.stderr
    opened = subprocess.Popen(ttyserve_command(
        "exec", "--connect", address, "--detachable", "--json", "--", "sh", "-c",
        "read x; kill -TERM $$"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    assert opened.stdout is not None
    event = json.loads(opened.stdout.readline())
    opened.kill()  # the client dies: the session goes on, detached
    opened.communicate(timeout=10)
    attached = subprocess.run(ttyserve_command("attach", "--connect", address,
                                               event["session"]),
                              input=b"go\n", capture_output=True, timeout=20)
    assert attached.returncode == 128 + 15, attached.stderr  # as a shell reports SIGTERM


def test_the_detach_key_passes_other_keys_and_can_be_turned_off() -> None:
    from ttyserve.cli.terminal import DetachKey, parse_key

    key = DetachKey(parse_key("^\\d"))
    assert key.feed(b"ab\x1c") == (b"ab", False) and key.holding
    assert key.feed(b"x") == (b"\x1cx", False)  # Ctrl-\ then another key: both go on
    assert key.feed(b"\x1c") == (b"", False) and key.release() == b"\x1c"  # alone, later
    assert key.feed(b"1\x1cdrest") == (b"1", True)
    assert parse_key("^A^?x") == b"\x01\x7fx"
    usage = subprocess.run(ttyserve_command("exec", "--detach-key", "^", "--", "true"),
                           capture_output=True, timeout=20)
    assert usage.returncode == 255 and b"--detach-key" in usage.stderr
