"""The readiness seam under the keystroke path: a descriptor watched by the loop."""

from __future__ import annotations

import os

import anyio
import anyio.abc
import pytest

from ttyserve.readiness import ReadWatch

pytestmark = pytest.mark.timeout(10)


@pytest.mark.asyncio  # a bare asyncio loop, not anyio.run(): as the tests' servers run
async def test_the_callback_runs_while_readable_and_may_start_tasks() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    watch = ReadWatch(read_fd)
    got: list[bytes] = []
    events = [anyio.Event(), anyio.Event()]

    async def note(index: int) -> None:
        events[index].set()

    try:
        async with anyio.create_task_group() as tg:

            def readable() -> None:
                got.append(os.read(read_fd, 100))
                # No task runs a callback, and yet the session starts its input pump
                # and the outbox its writer from here: anyio must know its loop.
                tg.start_soon(note, len(got) - 1)
                if len(got) == 2:
                    watch.stop()

            assert watch.start(readable)
            os.write(write_fd, b"a")
            await events[0].wait()
            os.write(write_fd, b"b")
            await events[1].wait()
        os.write(write_fd, b"c")  # stopped: the callback does not read this
        await anyio.wait_readable(read_fd)  # nor does it hold the descriptor
        assert got == [b"a", b"b"]
        assert os.read(read_fd, 100) == b"c"
    finally:
        watch.stop()
        os.close(read_fd)
        os.close(write_fd)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_no_readiness_callbacks_under_trio(anyio_backend: str) -> None:
    read_fd, write_fd = os.pipe()
    try:
        assert not ReadWatch(read_fd).start(lambda: None)  # the caller waits the usual way
    finally:
        os.close(read_fd)
        os.close(write_fd)
