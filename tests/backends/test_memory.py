"""The in-memory double's fault-injection seams, and the stream helpers it is built on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest
from anyio.streams.file import FileReadStream
from drain import read_all, read_until, receive
from memory import ProgramIO, open_memory_backend

from ttyserve.backends.base import ProcessSpec, StreamInput, StreamSource

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(20)]


async def test_a_lost_status_is_minus_one_with_error_and_output_still_arrives() -> None:
    async with open_memory_backend() as backend:
        process = await backend.spawn(ProcessSpec(argv=["lost-status", "still", "here"], pty=False))
        try:
            out, _ = await read_all(process)
            status = await process.wait()
        finally:
            await process.aclose()
    assert out == b"still here"
    assert (status.code, status.signal) == (-1, None)
    assert "waitpid failed" in str(status.error)


async def test_aclose_kills_a_program_that_ignores_hup_after_the_grace() -> None:
    async with open_memory_backend(grace=0.05) as backend:
        process = await backend.spawn(ProcessSpec(argv=["sleep", "HUP"], pty=True))
        await read_until(process, b"ready")
        process.hang_up()
        assert process.status is None
        await process.aclose()
    assert process.status is not None
    assert (process.status.code, process.status.signal) == (-signal.SIGKILL, "KILL")


async def test_programs_still_running_when_the_backend_closes_are_killed() -> None:
    async with open_memory_backend() as backend:
        process = await backend.spawn(ProcessSpec(argv=["sleep"], pty=False))
    assert (await process.wait()).code == -signal.SIGKILL
    await process.aclose()


async def test_a_test_can_bring_its_own_programs() -> None:
    async def shout(io: ProgramIO) -> int:
        await io.write((await io.read()).upper())
        return 5

    async with open_memory_backend({"shout": shout}) as backend:
        process = await backend.spawn(ProcessSpec(argv=["shout"], pty=False))
        try:
            assert process.write_nowait(b"hi") == 0  # no fast path without descriptors
            await process.send_stdin(b"hi")
            out, _ = await read_all(process)
            assert (out, (await process.wait()).code) == (b"HI", 5)
        finally:
            await process.aclose()


async def test_pids_are_beyond_any_real_process() -> None:
    async with open_memory_backend() as backend:
        process = await backend.spawn(ProcessSpec(argv=["true"], pty=False))
        await process.aclose()
    assert process.pid > 1 << 22
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)


# --- the stream helpers of backends/base.py --------------------------------


async def test_stream_source_over_an_anyio_byte_stream(tmp_path: Path) -> None:
    data = os.urandom(200_000)
    (tmp_path / "data").write_bytes(data)
    stream = await FileReadStream.from_path(tmp_path / "data")
    async with stream:
        source = StreamSource(stream)
        got = b""
        while chunk := await receive(source):
            got += chunk
    assert got == data
    assert source.at_eof


async def test_stream_source_hands_out_what_a_memory_stream_holds_without_waiting() -> None:
    send, receive_stream = anyio.create_memory_object_stream[bytes](8)
    source = StreamSource(receive_stream)
    assert source.receive_nowait(10) == b""
    for item in (b"abc", b"defg", b"hi"):
        send.send_nowait(item)
    assert source.receive_nowait(5) == b"abcde"
    assert source.receive_nowait(100) == b"fghi"
    send.close()
    assert not source.at_eof
    await source.wait_readable()  # end of stream: returns at once
    assert (source.receive_nowait(100), source.at_eof) == (b"", True)
    receive_stream.close()


async def test_stream_source_ends_on_a_broken_stream() -> None:
    class Broken:
        async def receive(self) -> bytes:
            raise anyio.BrokenResourceError

    source = StreamSource(Broken())
    await source.wait_readable()
    assert source.at_eof


async def test_stream_input_takes_nothing_now_and_everything_awaited() -> None:
    send, receive_stream = anyio.create_memory_object_stream[bytes](1)
    stdin = StreamInput(send)
    assert stdin.write_nowait(b"data") == 0
    await stdin.send_stdin(b"data")
    assert receive_stream.receive_nowait() == b"data"
    await stdin.send_eof()
    await stdin.send_eof()  # idempotent
    with pytest.raises(anyio.EndOfStream):
        receive_stream.receive_nowait()
    with pytest.raises(anyio.BrokenResourceError):
        stdin.write_nowait(b"more")
    with pytest.raises(anyio.BrokenResourceError):
        await stdin.send_stdin(b"more")
    receive_stream.close()


async def test_stream_input_whose_reader_is_gone_is_broken() -> None:
    send, receive_stream = anyio.create_memory_object_stream[bytes](1)
    receive_stream.close()
    with pytest.raises(anyio.BrokenResourceError):
        await StreamInput(send).send_stdin(b"data")
    send.close()
