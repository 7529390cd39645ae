"""What is particular to the portable backend: ownership of what ptyprocess and subprocess
made, errors raised in the child, its waiting, and where it differs from the fast path."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
from pathlib import Path

import pytest
from drain import read_all, read_until
from helpers import SH, zombie_children

from ttyserve.backends.base import ProcessSpec
from ttyserve.backends.local import LocalBackend, LocalProcess
from ttyserve.backends.portable import PortableBackend, start_on_pipes, start_on_terminal
from ttyserve.backends.spawn import resolve_executable, spawn_supported
from ttyserve.backends.watch import PidfdWatch, PollWatch
from ttyserve.errors import SpawnError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]
MODES = [pytest.param(False, id="pipe"), pytest.param(True, id="pty")]


async def test_popen_never_reaps_our_child() -> None:
    backend = PortableBackend()
    process = await backend.spawn(ProcessSpec(argv=[SH, "-c", "exit 7"], pty=False))
    try:
        popen = backend._popens[process.pid]
        await read_all(process)  # end of output: the child has exited and is a zombie
        subprocess.run(["true"], check=True)  # a new Popen runs subprocess's _cleanup()
        assert (await process.wait()).code == 7  # the status was still ours to collect
        assert popen.returncode == 7 and process.pid not in backend._popens
        del popen
        gc.collect()
        assert all(p.pid != process.pid for p in subprocess._active)  # type: ignore[attr-defined]
    finally:
        await process.aclose()


async def test_ptyprocess_never_closes_or_kills_our_child() -> None:
    process = await PortableBackend().spawn(ProcessSpec(argv=["cat"], pty=True))
    try:
        gc.collect()  # ptyprocess's object is garbage now; its __del__ must do nothing
        await process.send_stdin(b"still alive\n")
        await read_until(process, b"still alive\r\nstill alive")  # the echo, then cat
        await process.send_eof()
        assert (await process.wait()).code == 0
    finally:
        await process.aclose()


@pytest.mark.parametrize("pty", MODES)
async def test_a_cwd_that_vanishes_after_the_check_names_the_cwd(pty: bool,
                                                                  tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")
    before = len(os.listdir("/proc/self/fd"))
    env = {b"PATH": b"/usr/bin:/bin"}
    with pytest.raises(SpawnError) as info:
        if pty:
            start_on_terminal("/bin/true", ["true"], env, gone, 24, 80)
        else:
            fds = (os.open(os.devnull, os.O_RDWR),) * 3
            try:
                start_on_pipes("/bin/true", ["true"], env, gone, fds)
            finally:
                os.close(fds[0])
    assert info.value.errno == errno.ENOENT and "gone" in str(info.value)
    assert len(os.listdir("/proc/self/fd")) == before
    assert zombie_children(os.getpid()) == []


async def test_exits_are_awaited_on_a_pidfd_unless_polling_is_asked_for() -> None:
    for backend, watch in ((PortableBackend(), PidfdWatch),
                           (PortableBackend(watch=PollWatch), PollWatch)):
        process = await backend.spawn(ProcessSpec(argv=["true"], pty=False))
        try:
            assert isinstance(process, LocalProcess)
            assert isinstance(process._watch, watch)
            assert (await process.wait()).code == 0
        finally:
            await process.aclose()


@pytest.mark.skipif(not spawn_supported(), reason="no posix_spawn fast path here")
@pytest.mark.parametrize("pty", MODES)
async def test_argv0_under_a_pty_is_the_resolved_path(pty: bool) -> None:
    """A documented difference (portable.py): ptyprocess replaces argv[0]."""
    argv = ["sh", "-c", "tr '\\0' ' ' </proc/$$/cmdline"]
    seen = []
    for backend in (LocalBackend(), PortableBackend()):
        process = await backend.spawn(ProcessSpec(argv=argv, pty=pty))
        try:
            out, _ = await read_all(process)
            await process.wait()
        finally:
            await process.aclose()
        seen.append(out.split(b" ")[0])
    resolved = resolve_executable("sh", os.environ.get("PATH", os.defpath), os.getcwd())
    assert seen == [b"sh", os.fsencode(resolved) if pty else b"sh"]
