"""One conformance suite for every backend factory, in pipe and in PTY mode.

Each test states its program once per kind of backend through the kit: the
real backends (posix_spawn, portable, portable forced to poll for exits) run
/bin/sh scripts, the in-memory double (memory.py) runs its Python programs.
Tests about real OS processes (signal dispositions, sessions and process
groups, the controlling terminal, descriptors, orphans) take `real_kit` and
run for the real backends only; they are gathered at the end of the file.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import stat
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from drain import read_all, read_until
from helpers import SH, processes_in_group, wait_until, zombie_children
from memory import open_memory_backend

from ttyserve.backends.base import Backend, ProcessHandle, ProcessSpec
from ttyserve.backends.local import ChildBackend, LocalBackend, LocalProcess
from ttyserve.backends.portable import PortableBackend
from ttyserve.backends.spawn import closes_every_descriptor, spawn_supported
from ttyserve.backends.watch import PollWatch
from ttyserve.errors import SpawnError
from ttyserve.protocol.messages import Exit

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]
MODES = [pytest.param(False, id="pipe"), pytest.param(True, id="pty")]


# --- the kits ----------------------------------------------------------------


@dataclass(frozen=True)
class Kit:
    """One backend factory, and how a test says its program to it."""

    open: Callable[[], AbstractAsyncContextManager[Backend]]
    real: bool  # runs OS processes
    closes_inherited_fds: bool = True  # even descriptors made inheritable on purpose

    def argv(self, real: str | list[str], memory: list[str]) -> list[str]:
        """``real`` (a /bin/sh script, or an argv) for a real backend; ``memory`` for the double."""
        if not self.real:
            return memory
        return [SH, "-c", real] if isinstance(real, str) else real


def _plain(make: Callable[[], Backend]) -> Callable[[], AbstractAsyncContextManager[Backend]]:
    @asynccontextmanager
    async def opened() -> AsyncIterator[Backend]:
        yield make()

    return opened


REAL_KITS = [
    pytest.param(Kit(_plain(LocalBackend), real=True,
                     closes_inherited_fds=closes_every_descriptor()),
                 id="posix_spawn", marks=pytest.mark.skipif(
                     not spawn_supported(), reason="posix_spawn lacks the chdir file action here")),
    pytest.param(Kit(_plain(PortableBackend), real=True), id="portable"),
    pytest.param(Kit(_plain(lambda: PortableBackend(watch=PollWatch)), real=True),
                 id="portable-polling"),
]
KITS = [*REAL_KITS, pytest.param(Kit(open_memory_backend, real=False), id="memory")]


@pytest.fixture(params=KITS)
def kit(request: pytest.FixtureRequest) -> Kit:
    kit: Kit = request.param
    return kit


@pytest.fixture(params=REAL_KITS)
def real_kit(request: pytest.FixtureRequest) -> Kit:
    kit: Kit = request.param
    return kit


# --- helpers -----------------------------------------------------------------


@asynccontextmanager
async def spawned(kit: Kit, argv: list[str], pty: bool, **kw: object,
                  ) -> AsyncIterator[ProcessHandle]:
    """A process of ``kit``'s backend, closed (killed if need be) at the end of the block."""
    async with kit.open() as backend:
        process = await backend.spawn(ProcessSpec(argv=argv, pty=pty, **kw))  # type: ignore[arg-type]
        try:
            yield process
        finally:
            await process.aclose()


async def run(kit: Kit, argv: list[str], pty: bool, **kw: object) -> tuple[bytes, bytes, Exit]:
    async with kit.open() as backend:
        return await run_on(backend, argv, pty, **kw)


async def run_on(backend: Backend, argv: list[str], pty: bool = False,
                 **kw: object) -> tuple[bytes, bytes, Exit]:
    """Output and status of ``argv`` run to its end."""
    process = await backend.spawn(ProcessSpec(argv=argv, pty=pty, **kw))  # type: ignore[arg-type]
    try:
        out, err = await read_all(process)
        return out, err, await process.wait()
    finally:
        await process.aclose()


# --- every backend -----------------------------------------------------------


@pytest.mark.parametrize("pty", MODES)
async def test_output_and_exit_code(kit: Kit, pty: bool) -> None:
    argv = kit.argv("echo out; echo err >&2; exit 3", ["emit", "out\n", "err\n", "3"])
    out, err, status = await run(kit, argv, pty)
    assert status.code == 3
    if pty:
        assert out.replace(b"\r\n", b"\n") in (b"out\nerr\n", b"err\nout\n")
        assert err == b""
    else:
        assert (out, err) == (b"out\n", b"err\n")


@pytest.mark.parametrize("pty", MODES)
async def test_kill_9_is_minus_9(kit: Kit, pty: bool) -> None:
    _, _, status = await run(kit, kit.argv("kill -9 $$", ["die", "KILL"]), pty)
    assert (status.code, status.signal, status.core_dumped) == (-9, "KILL", False)


@pytest.mark.parametrize("pty", MODES)
async def test_eof_ends_cat(kit: Kit, pty: bool) -> None:
    async with spawned(kit, kit.argv(["cat"], ["cat"]), pty) as process:
        await process.send_stdin(b"hello\n")
        await process.send_eof()
        out, _ = await read_all(process)
        assert (await process.wait()).code == 0
        assert b"hello" in out


async def test_input_and_output_larger_than_any_buffer(kit: Kit) -> None:
    data = bytes(range(256)) * 1024  # 256 KiB: more than a pipe or a memory stream holds
    async with spawned(kit, kit.argv(["cat"], ["cat"]), False) as process:
        async with anyio.create_task_group() as tg:

            async def feed() -> None:
                written = process.write_nowait(data)
                await process.send_stdin(data[written:])
                await process.send_eof()

            tg.start_soon(feed)
            out, _ = await read_all(process)
        assert out == data
        assert (await process.wait()).code == 0


@pytest.mark.parametrize("pty", MODES)
async def test_env_and_cwd_apply(kit: Kit, pty: bool, tmp_path: Path) -> None:
    argv = kit.argv('echo "$FOO:$(pwd)"', ["env-cwd", "FOO"])
    out, _, status = await run(kit, argv, pty, env={"FOO": "bar"}, cwd=str(tmp_path))
    assert status.code == 0
    assert out.strip() == f"bar:{tmp_path}".encode()


async def test_pty_size_and_term_reach_the_program(kit: Kit) -> None:
    argv = kit.argv("stty size; echo $TERM", ["size"])
    out, _, _ = await run(kit, argv, True, rows=33, cols=101, term="vt220")
    assert out.replace(b"\r", b"").split(b"\n")[:2] == [b"33 101", b"vt220"]


async def test_resize_reaches_the_pty_with_sigwinch(kit: Kit) -> None:
    script = "trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"
    async with spawned(kit, kit.argv(script, ["winch"]), True) as process:
        await read_until(process, b"ready")
        process.resize(40, 120)
        out, _ = await read_all(process)
        assert b"40 120" in out
        assert (await process.wait()).code == 0


async def test_signal_int_under_pty_kills_foreground_sleep(kit: Kit) -> None:
    async with spawned(kit, kit.argv(["sleep", "30"], ["sleep"]), True) as process:
        process.send_signal(signal.SIGINT)
        assert (await process.wait()).code == -signal.SIGINT


@pytest.mark.parametrize("pty", MODES)
async def test_hang_up_ends_a_sleeping_process(kit: Kit, pty: bool) -> None:
    async with spawned(kit, kit.argv(["sleep", "30"], ["sleep"]), pty) as process:
        process.hang_up()
        status = await process.wait()
        assert (status.code, status.signal) == (-signal.SIGHUP, "HUP")


@pytest.mark.parametrize("pty", MODES)
async def test_aclose_ends_a_running_process_and_is_idempotent(kit: Kit, pty: bool) -> None:
    async with spawned(kit, kit.argv(["sleep", "30"], ["sleep"]), pty) as process:
        await process.aclose()
        assert process.status is not None and process.status.code == -signal.SIGHUP
    await process.aclose()


@pytest.mark.parametrize("pty", MODES)
async def test_unknown_command_is_enoent(kit: Kit, pty: bool) -> None:
    async with kit.open() as backend:
        with pytest.raises(SpawnError) as info:
            await backend.spawn(ProcessSpec(argv=["no-such-command-x"], pty=pty))
    assert info.value.errno == errno.ENOENT


# --- real OS processes only --------------------------------------------------


@pytest.mark.parametrize("pty", MODES)
async def test_signals_and_mask_are_reset_for_children(real_kit: Kit, pty: bool) -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        argv = [SH, "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"]
        out, _, _ = await run(real_kit, argv, pty)
    finally:
        signal.signal(signal.SIGHUP, previous)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
    fields = dict(line.split(b":\t") for line in out.replace(b"\r", b"").splitlines())
    assert int(fields[b"SigBlk"], 16) == 0
    assert not int(fields[b"SigIgn"], 16) & (1 << (signal.SIGHUP - 1))


@pytest.mark.parametrize("pty", MODES)
async def test_new_session_and_process_group(real_kit: Kit, pty: bool) -> None:
    out, _, _ = await run(real_kit, [SH, "-c", "ps -o pid=,pgid=,sid= -p $$"], pty)
    pid, pgid, sid = out.split()
    assert pid == pgid == sid


async def test_pty_is_the_controlling_terminal_with_the_size(real_kit: Kit) -> None:
    out, _, _ = await run(real_kit, [SH, "-c", "tty; stty size; echo $TERM"], True, rows=33,
                          cols=101, term="vt220")
    lines = out.replace(b"\r", b"").split(b"\n")
    assert lines[0].startswith(b"/dev/pts/")
    assert lines[1:3] == [b"33 101", b"vt220"]


@pytest.mark.parametrize("pty", MODES)
async def test_core_dump_is_reported(real_kit: Kit, pty: bool, tmp_path: Path) -> None:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern or not resource.getrlimit(resource.RLIMIT_CORE)[1]:
        pytest.skip(f"cores are not written to the cwd here ({pattern!r})")
    script = "ulimit -c $(ulimit -H -c); kill -QUIT $$"
    _, _, status = await run(real_kit, [SH, "-c", script], pty, cwd=str(tmp_path))
    assert (status.code, status.signal, status.core_dumped) == (-3, "QUIT", True)


@pytest.mark.parametrize("pty", MODES)
async def test_spawn_errors_carry_errno(real_kit: Kit, pty: bool, tmp_path: Path) -> None:
    async with real_kit.open() as backend:
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


@pytest.mark.parametrize("pty", MODES)
async def test_failed_exec_leaves_no_descriptor_and_no_zombie(real_kit: Kit, pty: bool,
                                                              tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x7fELF\x00garbage")
    garbage.chmod(stat.S_IRWXU)
    before = len(os.listdir("/proc/self/fd"))
    async with real_kit.open() as backend:
        with pytest.raises(SpawnError):
            await backend.spawn(ProcessSpec(argv=[str(garbage)], pty=pty))
    assert len(os.listdir("/proc/self/fd")) == before
    assert zombie_children(os.getpid()) == []


async def test_command_is_looked_up_with_the_sessions_path(real_kit: Kit, tmp_path: Path) -> None:
    tool = tmp_path / "only-here"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(stat.S_IRWXU)
    out, _, status = await run(real_kit, ["only-here"], False,
                               env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert (out, status.code) == (b"found\n", 0)


@pytest.mark.parametrize("pty", MODES)
async def test_child_sees_only_fds_0_to_2(real_kit: Kit, pty: bool, tmp_path: Path) -> None:
    if not real_kit.closes_inherited_fds:
        pytest.skip("glibc before 2.34 closes only close-on-exec descriptors (spawn.py)")
    inherited = os.open(tmp_path, os.O_RDONLY)
    os.set_inheritable(inherited, True)
    try:
        async with spawned(real_kit, [SH, "-c", "echo ready; read line"], pty) as process:
            await read_until(process, b"ready")  # past exec and the loader: now it waits
            assert sorted(os.listdir(f"/proc/{process.pid}/fd"), key=int) == ["0", "1", "2"]
    finally:
        os.close(inherited)


@pytest.mark.parametrize("pty", MODES)
async def test_terminate_kills_the_whole_group_even_when_hup_is_ignored(real_kit: Kit,
                                                                       pty: bool) -> None:
    script = "trap '' HUP; sleep 30 & echo started; wait"
    async with spawned(real_kit, [SH, "-c", script], pty) as process:
        assert isinstance(process, LocalProcess)
        await read_until(process, b"started")
        status = await process.end_group()
        assert status.code == -signal.SIGKILL
        assert processes_in_group(process.pid) == []


@pytest.mark.parametrize("pty", MODES)
async def test_aclose_leaves_no_descriptor_and_no_zombie(real_kit: Kit, pty: bool) -> None:
    before = len(os.listdir("/proc/self/fd"))
    async with real_kit.open() as backend:
        process = await backend.spawn(ProcessSpec(argv=["sleep", "30"], pty=pty))
        await process.aclose()
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ChildProcessError):
        os.waitpid(process.pid, os.WNOHANG)


async def test_orphans_of_a_session_are_adopted_and_reaped(real_kit: Kit) -> None:
    async with real_kit.open() as backend, anyio.create_task_group() as tg:
        assert isinstance(backend, ChildBackend)
        tg.start_soon(backend.reap_orphans)
        script = "sleep 30 </dev/null >/dev/null 2>&1 & echo $!"
        out, _, status = await run_on(backend, [SH, "-c", script])
        orphan = int(out)
        try:
            assert status.code == 0
            assert parent_of(orphan) == os.getpid()  # adopted: we are a subreaper
            os.kill(orphan, signal.SIGKILL)
            # the kernel gives no event for another process's reaping: poll /proc
            assert await wait_until(lambda: parent_of(orphan) is None, 10)
        finally:
            with suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("pty", MODES)
async def test_a_backend_that_adopts_nothing_reaps_no_other_child(real_kit: Kit,
                                                                 pty: bool) -> None:
    """A backend whose orphan reaper does not run (a server embedded in another program)
    reaps only its own sessions: ending a group it waits for never takes the status of the
    program's other children."""
    theirs = subprocess.Popen([SH, "-c", "exit 7"], start_new_session=True)
    try:
        os.waitid(os.P_PID, theirs.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        script = "trap '' HUP; sleep 30 & echo started; wait"  # a group that outlives the HUP
        async with spawned(real_kit, [SH, "-c", script], pty) as process:
            assert isinstance(process, LocalProcess)
            await read_until(process, b"started")
            await process.end_group(grace=0.3)  # waits for the group, killed after the grace
    finally:
        assert theirs.wait(5) == 7


def parent_of(pid: int) -> int | None:
    """The parent of ``pid``, or None once it is gone (reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return int(text[text.rindex(")") + 2:].split()[1])
