"""The readiness seam under the keystroke path: a descriptor served by the loop's callbacks."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from ttyserve.transport.readiness import ReadableService

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_fd, write_fd = os.pipe()
    try:
        yield read_fd, write_fd
    finally:
        os.close(read_fd)
        os.close(write_fd)


def still_watched(fd: int) -> bool:
    """Whether the loop still has a reader on ``fd`` (removing it says so; it is ours)."""
    return asyncio.get_running_loop().remove_reader(fd)


@pytest.mark.asyncio  # a bare asyncio loop, not anyio.run(): as the tests' servers run
async def test_the_callback_runs_while_readable_and_may_start_tasks(
        pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.set_blocking(read_fd, False)
    got: list[bytes] = []
    started = [anyio.Event(), anyio.Event()]

    async def note(index: int) -> None:
        started[index].set()

    async with anyio.create_task_group() as tg:

        def readable() -> bool:
            got.append(os.read(read_fd, 100))
            # No task runs a callback, and yet the session starts its input pump
            # and the outbox its writer from here: anyio must know its loop.
            tg.start_soon(note, len(got) - 1)
            return len(got) < 2

        async def write_twice() -> None:
            os.write(write_fd, b"a")
            await started[0].wait()
            os.write(write_fd, b"b")

        tg.start_soon(write_twice)
        assert await ReadableService().serve(read_fd, readable)  # until the callback said stop
        await started[1].wait()
    assert not still_watched(read_fd)
    os.write(write_fd, b"c")  # no longer served: the callback does not read this
    await anyio.wait_readable(read_fd)
    assert got == [b"a", b"b"]
    assert os.read(read_fd, 100) == b"c"


@pytest.mark.asyncio
async def test_what_the_callback_raises_is_raised_in_the_task(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.write(write_fd, b"x")

    def readable() -> bool:
        raise ValueError(os.read(read_fd, 1))

    with pytest.raises(ValueError, match="x"):
        await ReadableService().serve(read_fd, readable)
    assert not still_watched(read_fd)


@pytest.mark.asyncio
async def test_cancelled_it_stops_watching_and_the_callback_never_runs(
        pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    calls: list[bytes] = []
    served = anyio.Event()

    def readable() -> bool:
        calls.append(os.read(read_fd, 100))
        served.set()
        return True

    async with anyio.create_task_group() as tg:
        tg.start_soon(ReadableService().serve, read_fd, readable)
        await anyio.wait_all_tasks_blocked()
        os.write(write_fd, b"a")
        await served.wait()  # it is watched
        tg.cancel_scope.cancel()
    assert not still_watched(read_fd)
    os.write(write_fd, b"late")
    await anyio.wait_readable(read_fd)
    await anyio.lowlevel.checkpoint()  # a stale callback would have run by now
    assert calls == [b"a"]
    assert os.read(read_fd, 100) == b"late"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_no_readiness_callbacks_under_trio(anyio_backend: str,
                                                  pipe: tuple[int, int]) -> None:
    assert not await ReadableService().serve(pipe[0], lambda: False)  # the caller waits as usual


@pytest.mark.asyncio
async def test_a_regular_file_is_not_served(tmp_path: Path) -> None:
    """epoll refuses regular files (`serve --stdio < requests`): the caller reads as usual."""
    path = tmp_path / "requests"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert not await ReadableService().serve(fd, lambda: False)
    finally:
        os.close(fd)
