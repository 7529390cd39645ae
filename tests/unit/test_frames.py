"""The frame codec: round trips, any split of the stream, limits enforced early."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttyserve.errors import RemoteProtocolError as ProtocolError
from ttyserve.protocol.frames import (
    HEADER_SIZE,
    Frame,
    FrameDecoder,
    FrameKind,
    encode_frame,
)

frames_strategy = st.lists(
    st.builds(
        Frame,
        kind=st.sampled_from(list(FrameKind)),
        channel=st.integers(0, 2**32 - 1),
        payload=st.binary(max_size=300),
    ),
    max_size=20,
)


def test_header_layout_is_the_contract() -> None:
    frame = encode_frame(FrameKind.CTRL_IN, 0x01020304, b"xy")
    assert frame == b"\x03" + b"\x01\x02\x03\x04" + b"\x00\x00\x00\x02" + b"xy"
    assert HEADER_SIZE == 9


@pytest.mark.parametrize("kind", list(FrameKind))
def test_round_trip_every_kind(kind: FrameKind) -> None:
    data = encode_frame(kind, 7, b"payload")
    assert FrameDecoder().feed(data) == [Frame(kind, 7, b"payload")]


def test_empty_payload() -> None:
    assert FrameDecoder().feed(encode_frame(FrameKind.STDIN, 1)) == [Frame(FrameKind.STDIN, 1, b"")]


@given(frames_strategy, st.lists(st.integers(1, 64), max_size=50))
@settings(max_examples=300)
def test_any_split_yields_the_same_frames(frames: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(encode_frame(f.kind, f.channel, f.payload) for f in frames)
    whole = FrameDecoder().feed(stream)
    decoder = FrameDecoder()
    pieces: list[Frame] = []
    pos = 0
    for cut in cuts:
        pieces += decoder.feed(stream[pos : pos + cut])
        pos += cut
    pieces += decoder.feed(stream[pos:])
    assert whole == frames
    assert pieces == frames
    assert decoder.buffered == 0


def test_one_byte_at_a_time_and_trailing_bytes() -> None:
    stream = encode_frame(FrameKind.STDOUT, 1, b"abc") + encode_frame(FrameKind.CTRL_OUT, 2, b"{}")
    decoder = FrameDecoder()
    got = [f for i in range(len(stream)) for f in decoder.feed(stream[i : i + 1])]
    assert [f.payload for f in got] == [b"abc", b"{}"]
    assert decoder.feed(b"\x01\x00") == []
    assert decoder.buffered == 2


def test_oversize_frame_is_refused_from_its_header() -> None:
    decoder = FrameDecoder(max_frame=1024)
    header = bytes([1]) + (1).to_bytes(4, "big") + (1025).to_bytes(4, "big")
    assert decoder.feed(header) == []  # refused before any payload arrives
    with pytest.raises(ProtocolError, match="exceeds max_frame"):
        decoder.check()
    assert decoder.buffered == 0


def test_frames_before_a_bad_header_are_delivered_then_nothing_more() -> None:
    decoder = FrameDecoder()
    good = encode_frame(FrameKind.STDIN, 1, b"first")
    frames = decoder.feed(good + b"\x09" + bytes(8) + good)
    assert [f.payload for f in frames] == [b"first"]
    assert decoder.error is not None and "unknown frame kind 9" in str(decoder.error)
    assert decoder.feed(good) == []  # a stream that broke once stays broken


def test_max_frame_itself_is_accepted() -> None:
    decoder = FrameDecoder(max_frame=16)
    assert decoder.feed(encode_frame(FrameKind.STDIN, 1, b"x" * 16))[0].payload == b"x" * 16


def test_unknown_kind_is_a_protocol_error() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x09" + bytes(8))
    with pytest.raises(ProtocolError, match="unknown frame kind 9"):
        decoder.check()


@given(st.binary(max_size=2000), st.integers(1, 50))
@settings(max_examples=500)
def test_garbage_never_hangs_or_overallocates(garbage: bytes, step: int) -> None:
    decoder = FrameDecoder(max_frame=4096)
    for i in range(0, len(garbage), step):
        for frame in decoder.feed(garbage[i : i + step]):
            assert len(frame.payload) <= 4096
    if decoder.error is not None:
        assert decoder.buffered == 0  # a broken stream keeps nothing
        return
    # Whatever was not decoded waits in a buffer no larger than one frame plus a header.
    assert decoder.buffered <= 4096 + HEADER_SIZE
