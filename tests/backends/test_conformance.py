"""One conformance suite for both local backends: pipe and PTY."""

from __future__ import annotations

import errno
import os
import signal
import stat
from pathlib import Path

import anyio
import pytest
from helpers import SH, processes_in_group

from ttyserve.backends.base import ProcessSpec
from ttyserve.backends.local import FdSource, LocalBackend, LocalProcess
from ttyserve.errors import SpawnError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]
MODES = [pytest.param(False, id="pipe"), pytest.param(True, id="pty")]


async def receive(source: FdSource) -> bytes:
    """The next output of ``source``, waiting for it; b"" at end of file."""
    while not (data := source.receive_nowait(1 << 20)) and not source.at_eof:
        await source.wait_readable()
    return data


async def read_all(process: LocalProcess) -> tuple[bytes, bytes]:
    out, err = b"", b""

    async def drain_stderr() -> None:
        nonlocal err
        assert process.stderr is not None
        while data := await receive(process.stderr):
            err += data

    async with anyio.create_task_group() as tg:
        if process.stderr is not None:
            tg.start_soon(drain_stderr)
        while data := await receive(process.stdout):
            out += data
    return out, err


async def run(argv: list[str], pty: bool, **kw: object) -> tuple[bytes, bytes, object]:
    process = await LocalBackend().spawn(ProcessSpec(argv=argv, pty=pty, **kw))  # type: ignore[arg-type]
    try:
        out, err = await read_all(process)
        status = await process.wait()
    finally:
        await process.aclose()
    return out, err, status


@pytest.mark.parametrize("pty", MODES)
async def test_output_and_exit_code(pty: bool) -> None:
    out, err, status = await run([SH, "-c", "echo out; echo err >&2; exit 3"], pty)
    assert status.code == 3  # type: ignore[attr-defined]
    if pty:
        assert out.replace(b"\r\n", b"\n") in (b"out\nerr\n", b"err\nout\n")
        assert err == b""
    else:
        assert (out, err) == (b"out\n", b"err\n")


@pytest.mark.parametrize("pty", MODES)
async def test_kill_9_is_minus_9(pty: bool) -> None:
    _, _, status = await run([SH, "-c", "kill -9 $$"], pty)
    assert (status.code, status.signal, status.core_dumped) == (-9, "KILL", False)  # type: ignore[attr-defined]


@pytest.mark.parametrize("pty", MODES)
async def test_eof_ends_cat(pty: bool) -> None:
    process = await LocalBackend().spawn(ProcessSpec(argv=["cat"], pty=pty))
    try:
        await process.send_stdin(b"hello\n")
        await process.send_eof()
        out, _ = await read_all(process)
        assert (await process.wait()).code == 0
        assert b"hello" in out
    finally:
        await process.aclose()


@pytest.mark.parametrize("pty", MODES)
async def test_env_and_cwd_apply(pty: bool, tmp_path: Path) -> None:
    out, _, status = await run([SH, "-c", 'echo "$FOO:$(pwd)"'], pty, env={"FOO": "bar"},
                               cwd=str(tmp_path))
    assert status.code == 0  # type: ignore[attr-defined]
    assert out.strip() == f"bar:{tmp_path}".encode()


@pytest.mark.parametrize("pty", MODES)
async def test_signals_and_mask_are_reset_for_children(pty: bool) -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        out, _, _ = await run([SH, "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"], pty)
    finally:
        signal.signal(signal.SIGHUP, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
    fields = dict(line.split(b":\t") for line in out.replace(b"\r", b"").splitlines())
    assert int(fields[b"SigBlk"], 16) == 0
    assert not int(fields[b"SigIgn"], 16) & (1 << (signal.SIGHUP - 1))


@pytest.mark.parametrize("pty", MODES)
async def test_new_session_and_process_group(pty: bool) -> None:
    out, _, _ = await run([SH, "-c", "ps -o pid=,pgid=,sid= -p $$"], pty)
    pid, pgid, sid = out.split()
    assert pid == pgid == sid


async def test_pty_is_the_controlling_terminal_with_the_size() -> None:
    out, _, _ = await run([SH, "-c", "tty; stty size; echo $TERM"], True, rows=33, cols=101,
                          term="vt220")
    lines = out.replace(b"\r", b"").split(b"\n")
    assert lines[0].startswith(b"/dev/pts/")
    assert lines[1:3] == [b"33 101", b"vt220"]


async def test_resize_reaches_the_pty_with_sigwinch() -> None:
    script = "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"
    process = await LocalBackend().spawn(ProcessSpec(argv=[SH, "-c", script], pty=True))
    try:
        buf = b""
        while b"ready" not in buf:
            buf += await receive(process.stdout)
        process.resize(40, 120)
        out, _ = await read_all(process)
        assert b"40 120" in out
        assert (await process.wait()).code == 0
    finally:
        await process.aclose()


async def test_signal_int_under_pty_kills_foreground_sleep() -> None:
    process = await LocalBackend().spawn(ProcessSpec(argv=["sleep", "30"], pty=True))
    try:
        process.send_signal(signal.SIGINT)
        assert (await process.wait()).code == -signal.SIGINT
    finally:
        await process.aclose()


@pytest.mark.parametrize("pty", MODES)
async def test_spawn_errors_carry_errno(pty: bool, tmp_path: Path) -> None:
    backend = LocalBackend()
    with pytest.raises(SpawnError) as info:
        await backend.spawn(ProcessSpec(argv=["no-such-command-x"], pty=pty))
    assert info.value.errno == errno.ENOENT
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(SpawnError) as info:
        await backend.spawn(ProcessSpec(argv=[str(script)], pty=pty))
    assert info.value.errno == errno.EACCES
    script.chmod(stat.S_IRWXU)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF\x00garbage")
    garbage.chmod(stat.S_IRWXU)
    with pytest.raises(SpawnError) as info:
        await backend.spawn(ProcessSpec(argv=[str(garbage)], pty=pty))
    assert info.value.errno == errno.ENOEXEC
    with pytest.raises(SpawnError) as info:
        await backend.spawn(ProcessSpec(argv=["true"], pty=pty, cwd=str(tmp_path / "nope")))
    assert info.value.errno == errno.ENOENT and "nope" in str(info.value)


async def test_command_is_looked_up_with_the_sessions_path(tmp_path: Path) -> None:
    tool = tmp_path / "only-here"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(stat.S_IRWXU)
    out, _, status = await run(["only-here"], False, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (out, status.code) == (b"found\n", 0)  # type: ignore[attr-defined]


@pytest.mark.parametrize("pty", MODES)
async def test_terminate_kills_the_whole_group_even_when_hup_is_ignored(pty: bool) -> None:
    script = "trap '' HUP; sleep 30 & echo started; wait"
    process = await LocalBackend().spawn(ProcessSpec(argv=[SH, "-c", script], pty=pty))
    try:
        buf = b""
        while b"started" not in buf:
            buf += await receive(process.stdout)
        status = await process.end_group()
        assert status.code == -signal.SIGKILL
        assert processes_in_group(process.pid) == []
    finally:
        await process.aclose()


@pytest.mark.parametrize("pty", MODES)
async def test_aclose_leaves_no_descriptor_and_no_zombie(pty: bool) -> None:
    before = len(os.listdir("/proc/self/fd"))
    process = await LocalBackend().spawn(ProcessSpec(argv=["sleep", "30"], pty=pty))
    await process.aclose()
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ChildProcessError):
        os.waitpid(process.pid, os.WNOHANG)
