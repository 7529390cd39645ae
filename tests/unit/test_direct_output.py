"""Output read in process (transport/direct.py, connections/output.py): a stream's chunks go
to its reader, never framed, each taking the channel's credit as a framed one would, and the
channel's end still framed after them."""

from __future__ import annotations

import pytest
from helpers import ctrl
from test_server_core import WINDOWED, controls, events, ready

from ttyserve.errors import LocalProtocolError
from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Exit, Offsets, Window
from ttyserve.server.connections.output import DirectOutput
from ttyserve.transport.streams import Buffer


class Reader:
    """An OutputReader that keeps what it was handed."""

    def __init__(self) -> None:
        self.items: list[tuple[int, object, object]] = []

    def output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        self.items.append((channel, kind, bytes(data)))

    def skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self.items.append((channel, size, offsets))


def test_output_goes_to_the_reader_unframed_and_spends_the_credit() -> None:
    core, reader = ready(WINDOWED, 1), Reader()
    output = DirectOutput(core, reader)
    assert output.limit(1) == 100
    output.send(1, FrameKind.STDOUT, b"x" * 60)
    output.send(1, FrameKind.STDERR, b"e" * 40)
    assert reader.items == [(1, FrameKind.STDOUT, b"x" * 60), (1, FrameKind.STDERR, b"e" * 40)]
    assert core.data_to_send() == []  # nothing framed for the connection
    assert output.limit(1) == 0
    with pytest.raises(LocalProtocolError, match="exceed its credit"):
        output.send(1, FrameKind.STDOUT, b"y")  # a grant first, as for framed output
    events(core, ctrl(1, Window(bytes=100)))  # the reader's grant, on the connection
    assert output.limit(1) == 100
    assert core.send_exit(1, Exit(code=0))  # the end is framed, after the output
    assert controls(core) == [(1, {"type": "exit", "code": 0})]
    output.send(1, FrameKind.STDOUT, b"late")  # an ended channel's: dropped
    assert len(reader.items) == 2


def test_skips_go_to_the_reader_in_their_place() -> None:
    core, reader = ready(WINDOWED, 1), Reader()
    output = DirectOutput(core, reader)
    output.send(1, FrameKind.STDOUT, b"ab")
    output.skipped(1, 10, Offsets(stdout=12, stderr=0))
    output.send(1, FrameKind.STDOUT, b"cd")
    assert [item[1] for item in reader.items] == [FrameKind.STDOUT, 10, FrameKind.STDOUT]
    assert core.data_to_send() == []
