"""An output pump on a real pipe without room: it never reads ahead from a pipe that still
holds bytes (a frame's payload may be in flight from it, spliced as the socket drains: see
the outbox), and still learns of the end of an empty one."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ttyserve.backends.local import FdSource
from ttyserve.protocol.frames import FrameKind
from ttyserve.server.sessions.pump import OutputPump, Stall
from ttyserve.transport.splice import CAN_SPLICE, buffered

pytestmark = pytest.mark.skipif(not CAN_SPLICE, reason="splice(2) is Linux's")


class NoRoom:
    """A pump's owner whose sink takes nothing now (a pipe's bytes in flight, say)."""

    def __init__(self) -> None:
        self.ended = False

    def output_limit(self) -> int:
        return 0

    def splices(self) -> bool:
        return True

    def deliver(self, kind: FrameKind, data: bytes) -> bool:
        raise AssertionError("nothing may be delivered without room")

    def deliver_from_pipe(self, kind: FrameKind, pipe: int, size: int) -> bool:
        raise AssertionError("nothing may be delivered without room")

    def pump_done(self, pump: OutputPump) -> None:
        self.ended = True

    def pump_failed(self, error: Exception) -> None:
        raise error


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    os.set_blocking(read, False)
    try:
        yield read, write
    finally:
        os.close(read)
        os.close(write)


def test_without_room_a_pipe_that_holds_bytes_is_not_read(pipe: tuple[int, int]) -> None:
    read, write = pipe
    os.write(write, b"in flight")
    pump = OutputPump(NoRoom(), FdSource(read, pipe=True), FrameKind.STDOUT)
    assert pump.step() is Stall.SINK
    assert buffered(read) == len(b"in flight")  # not one byte taken


def test_without_room_an_empty_pipe_still_tells_its_end() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.close(write)
    owner = NoRoom()
    try:
        pump = OutputPump(owner, FdSource(read, pipe=True), FrameKind.STDOUT)
        assert pump.step() is Stall.DONE
        assert owner.ended
    finally:
        os.close(read)
