"""`ttyserve serve --stdio`: one connection on stdin and stdout, nothing but frames on stdout,
the policy and limits still apply, and stdin's EOF cancels and reaps every session."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SH, ctrl, split_output, start_warm_server, stdio_server, ttyserve_command

from ttyserve.exitcodes import ServeExit
from ttyserve.protocol.frames import Frame, FrameKind
from ttyserve.protocol.messages import Hello, Open

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True, params=["alone", "warm"])
def far_side(request: pytest.FixtureRequest, short_dir: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test twice: `serve --stdio` serving by itself, and handed to a warm server
    (cli/warm.py): the contract is the same."""
    if request.param == "alone":
        yield
        return
    with start_warm_server(short_dir, monkeypatch):
        yield


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def controls(frames: list[Frame]) -> list[dict[str, object]]:
    return [c for channel in {f.channel for f in frames} for c in split_output(frames,
                                                                                channel)[2]]


@pytest.mark.asyncio
async def test_frames_only_on_stdout_and_exit_0_after_the_session(tmp_path: Path) -> None:
    async with stdio_server() as server:
        await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", "echo out; echo err >&2; exit 3"], pty=False)))
        frames = await server.peer.frames_until_eof()  # every byte decoded as a frame
        assert await server.exit_code() == ServeExit.OK
    out, err, messages = split_output(frames)
    assert (out, err) == (b"out\n", b"err\n")
    assert [m["type"] for m in split_output(frames, 0)[2] + messages] == [
        "welcome", "opened", "exit"]
    assert messages[-1]["code"] == 3
    assert frames[-1].kind is FrameKind.CTRL_OUT  # the exit is the last frame


@pytest.mark.asyncio
async def test_a_refusal_is_logged_on_stderr_while_frames_flow_on_stdout() -> None:
    async with stdio_server("--allow-command", "/bin/echo") as server:
        await server.peer.send(ctrl(0, Hello(protocol=1, multiplex=True))
                               + ctrl(1, Open(argv=[SH, "-c", "true"], pty=False))
                               + ctrl(2, Open(argv=["/bin/echo", "allowed"], pty=False)))
        frames: list[Frame] = []
        while not any(m.get("type") == "exit" for m in split_output(frames, 2)[2]):
            frame = await server.peer.next_frame()
            assert frame is not None
            frames.append(frame)
        await server.peer.transport.send_eof()
        frames += await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
        assert "forbidden" in server.stderr()
    refusal = split_output(frames, 1)[2][0]
    assert refusal["type"] == "error" and refusal["code"] == "forbidden"
    assert split_output(frames, 2)[0] == b"allowed\n"


@pytest.mark.asyncio
async def test_stdin_eof_cancels_and_reaps_every_session() -> None:
    async with stdio_server() as server:
        await server.peer.send(
            ctrl(0, Hello(protocol=1, multiplex=True))
            + b"".join(ctrl(channel, Open(argv=[SH, "-c", "echo up; exec sleep 600"],
                                          pty=channel == 2)) for channel in (1, 2, 3)))
        pids: dict[int, int] = {}
        started: set[int] = set()
        while len(started) < 3:
            frame = await server.peer.next_frame()
            assert frame is not None
            if frame.kind is FrameKind.CTRL_OUT and frame.channel:
                pids[frame.channel] = int(split_output([frame], frame.channel)[2][0]["pid"])
            elif frame.kind is FrameKind.STDOUT and b"up" in frame.payload:
                started.add(frame.channel)
        assert all(alive(pid) for pid in pids.values())
        await server.peer.transport.send_eof()
        await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
    assert not [pid for pid in pids.values() if alive(pid)]  # reaped by the server


@pytest.mark.asyncio
async def test_single_session_eof_before_the_end_cancels_it() -> None:
    async with stdio_server() as server:
        await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", "echo up; exec sleep 600"], pty=False)))
        pid = None
        while True:
            frame = await server.peer.next_frame()
            assert frame is not None
            if frame.kind is FrameKind.CTRL_OUT and frame.channel == 1:
                pid = int(split_output([frame])[2][0]["pid"])
            if frame.kind is FrameKind.STDOUT:
                break
        assert pid is not None and alive(pid)
        await server.peer.transport.send_eof()
        rest = await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
    assert not alive(pid)
    assert not any(m.get("type") == "exit" for m in controls(rest))  # cancelled: no exit


@pytest.mark.asyncio
async def test_no_token_is_asked_even_when_one_is_configured() -> None:
    async with stdio_server(env={"TTYSERVE_TOKEN": "x" * 32}) as server:
        await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", "exit 0"], pty=False)))
        frames = await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
    assert split_output(frames, 0)[2][0]["type"] == "welcome"


@pytest.mark.asyncio
async def test_limits_still_apply() -> None:
    async with stdio_server("--max-sessions-per-connection", "1") as server:
        await server.peer.send(
            ctrl(0, Hello(protocol=1, multiplex=True))
            + ctrl(1, Open(argv=[SH, "-c", "sleep 600"], pty=False))
            + ctrl(2, Open(argv=[SH, "-c", "true"], pty=False)))
        refusal = None
        while refusal is None:
            frame = await server.peer.next_frame()
            assert frame is not None
            if frame.kind is FrameKind.CTRL_OUT and frame.channel == 2:
                refusal = split_output([frame], 2)[2][0]
        await server.peer.transport.send_eof()
        await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
    assert refusal["type"] == "error" and refusal["code"] == "busy"


@pytest.mark.asyncio
async def test_a_detachable_session_is_refused_it_could_not_outlive_the_connection() -> None:
    async with stdio_server() as server:
        await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", "true"], pty=False, detachable=True)))
        frames = await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
    refusal = split_output(frames)[2][-1]
    assert refusal["type"] == "error" and refusal["code"] == "bad_request"
    assert "serve --stdio" in str(refusal["message"])


def test_a_stray_write_to_fd_1_reaches_stderr_not_the_protocol() -> None:
    """Once stdin and stdout carry the protocol, fd 1 is stderr and fd 0 is /dev/null."""
    code = ("import os, sys\n"
            "from ttyserve.cli.serve import stdio_transport\n"
            "transport = stdio_transport()\n"
            "print('stray print', flush=True)\n"
            "os.write(1, b'stray write\\n')\n"
            "assert sys.stdin.read() == ''\n"
            "os.write(transport.write_fd, b'frames')\n")
    result = subprocess.run([sys.executable, "-c", code], input=b"not for anyone else",
                            capture_output=True, timeout=20)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"frames"
    assert result.stderr == b"stray print\nstray write\n"


def test_stdio_takes_no_listener(tmp_path: Path) -> None:
    result = subprocess.run(
        ttyserve_command("serve", "--stdio", "--listen", f"unix:{tmp_path / 's'}"),
        stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    assert result.returncode == ServeExit.USAGE
    assert b"--stdio" in result.stderr and result.stdout == b""


def test_a_server_cannot_listen_on_a_carrier_address() -> None:
    result = subprocess.run(ttyserve_command("serve", "--listen", "ssh://host"),
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    assert result.returncode == ServeExit.CONFIG
    assert b"serve --stdio" in result.stderr


def test_stdin_eof_before_hello_exits_0() -> None:
    result = subprocess.run(ttyserve_command("serve", "--stdio"), stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=20)
    assert (result.returncode, result.stdout) == (ServeExit.OK, b"")


def test_the_hosts_listen_setting_is_for_its_daemon_not_for_stdio(tmp_path: Path) -> None:
    """Over ssh a shell startup file may export TTYSERVE_LISTEN; --stdio still serves."""
    config = tmp_path / "ttyserve.toml"
    config.write_text(f'listen = ["unix:{tmp_path / "file"}"]\n')
    env = {**os.environ, "TTYSERVE_LISTEN": f"unix:{tmp_path / 'env'}",
           "TTYSERVE_CONFIG": str(config)}
    result = subprocess.run(ttyserve_command("serve", "--stdio"), stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=20, env=env)
    assert (result.returncode, result.stdout) == (ServeExit.OK, b""), result.stderr
    assert not any(tmp_path.glob("env*")) and not any(tmp_path.glob("file*"))


def test_stdio_is_a_flag_only_never_a_setting(tmp_path: Path) -> None:
    config = tmp_path / "ttyserve.toml"
    config.write_text("stdio = true\n")
    result = subprocess.run(ttyserve_command("serve", "--config", str(config)),
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    assert result.returncode == ServeExit.CONFIG
    assert b"'stdio' is a command-line flag only" in result.stderr
    # TTYSERVE_STDIO is not a setting: the server listens (and is stopped by the deadline)
    socket_path = tmp_path / "s"
    env = {**os.environ, "TTYSERVE_STDIO": "1"}
    with subprocess.Popen(ttyserve_command("serve", "--listen", f"unix:{socket_path}"),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env) as server:
        try:
            assert server.stdout is not None
            assert b"listening" in server.stdout.readline()
        finally:
            server.terminate()
            server.wait(10)


@pytest.mark.asyncio
async def test_sighup_ends_it_as_its_carrier_hung_up(tmp_path: Path) -> None:
    """A listening server reads its files again at SIGHUP; `serve --stdio` is a carrier's
    far side, and a hangup means the carrier is gone: it ends, its session with it."""
    async with stdio_server() as server:
        await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", "echo up; sleep 30"], pty=False)))
        while not (await server.peer.next_frame()).payload.startswith(b"up"):
            continue  # (welcome, opened, then the session's first line)
        server.process.send_signal(signal.SIGHUP)
        assert await server.exit_code() is not None
