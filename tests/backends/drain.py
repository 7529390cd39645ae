"""Reading a process's output in tests, through the `OutputSource` interface only."""

from __future__ import annotations

import anyio

from ttyserve.backends.base import OutputSource, ProcessHandle


async def receive(source: OutputSource) -> bytes:
    """The next output of ``source``, waiting for it; b"" at end of file."""
    while not (data := source.receive_nowait(1 << 20)) and not source.at_eof:
        await source.wait_readable()
    return data


async def read_all(process: ProcessHandle) -> tuple[bytes, bytes]:
    """stdout and stderr until both reach end of file."""
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


async def read_until(process: ProcessHandle, marker: bytes) -> bytes:
    """stdout up to (at least) ``marker``."""
    buf = b""
    while marker not in buf:
        data = await receive(process.stdout)
        assert data, f"end of output before {marker!r}: {buf!r}"
        buf += data
    return buf
