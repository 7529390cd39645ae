"""The scrollback ring, with no event loop: order, bound, what was dropped, no copies kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ttyserve.protocol.frames import FrameKind
from ttyserve.server.sessions.scrollback import CHUNK_COST, PIECE, OffsetBeyondOutput, Scrollback

OUT, ERR = FrameKind.STDOUT, FrameKind.STDERR


def joined(ring: Scrollback, kind: FrameKind | None = None) -> bytes:
    return b"".join(data for k, data in ring.since()[1] if kind in (None, k))


def test_output_comes_back_in_order_with_its_stream() -> None:
    ring = Scrollback(1 << 20)
    ring.append(OUT, b"one ")
    ring.append(ERR, b"two ")
    ring.append(OUT, b"three")
    assert ring.since()[1] == [(OUT, b"one "), (ERR, b"two "), (OUT, b"three")]
    assert (len(ring), ring.dropped) == (13, 0)


def test_the_oldest_output_goes_first_and_is_counted_as_dropped() -> None:
    ring = Scrollback(10 + CHUNK_COST)  # room for one chunk of 10 bytes
    ring.append(OUT, b"0123456789")
    ring.append(OUT, b"abcd")  # joined to the small chunk before it: the head is trimmed
    assert joined(ring) == b"456789abcd" and ring.dropped == 4


def test_what_it_gives_does_not_change_with_later_output() -> None:
    ring = Scrollback(1 << 20)
    ring.append(OUT, b"before")
    snapshot = ring.since()[1]
    ring.append(OUT, b" after")
    assert snapshot == [(OUT, b"before")]


def test_large_output_is_kept_in_pieces_of_one_read() -> None:
    ring = Scrollback(4 << 20)
    data = bytes(range(256)) * (3 * PIECE // 256 + 1)
    ring.append(OUT, data)
    assert all(len(piece) <= PIECE for _, piece in ring.since()[1])
    assert joined(ring) == data


@given(size=st.integers(CHUNK_COST + 1, 4096),
       chunks=st.lists(st.tuples(st.sampled_from([OUT, ERR]), st.binary(max_size=600)),
                       max_size=60))
def test_what_it_holds_is_the_tail_of_what_came_within_its_bound(
        size: int, chunks: list[tuple[FrameKind, bytes]]) -> None:
    ring = Scrollback(size)
    for kind, data in chunks:
        ring.append(kind, data)
    everything = b"".join(data for _, data in chunks)
    held = joined(ring)
    assert everything.endswith(held) and ring.dropped == len(everything) - len(held)
    assert len(held) + CHUNK_COST * len(ring.since()[1]) <= size
    for kind in (OUT, ERR):  # each stream's tail, in its own order
        assert b"".join(d for k, d in chunks if k is kind).endswith(joined(ring, kind))


@given(size=st.integers(CHUNK_COST + 1, 2048),
       chunks=st.lists(st.tuples(st.sampled_from([OUT, ERR]), st.binary(min_size=1,
                                                                         max_size=300)),
                       max_size=40),
       asked=st.tuples(st.floats(0, 1), st.floats(0, 1)))
def test_from_offsets_each_stream_goes_on_from_there_in_production_order(
        size: int, chunks: list[tuple[FrameKind, bytes]], asked: tuple[float, float]) -> None:
    """Section 10: from each stream's offset (or the ring's oldest byte of it, if that is
    later), every byte once, in the order produced."""
    ring = Scrollback(size)
    for kind, data in chunks:
        ring.append(kind, data)
    streams = {kind: b"".join(d for k, d in chunks if k is kind) for kind in (OUT, ERR)}
    wanted = {kind: int(fraction * len(streams[kind]))
              for kind, fraction in zip((OUT, ERR), asked, strict=True)}
    begins, replay = ring.since(wanted[OUT], wanted[ERR])
    for kind in (OUT, ERR):
        assert begins[kind] >= wanted[kind]
        assert begins[kind] == max(wanted[kind], len(streams[kind]) - len(joined(ring, kind)))
        assert b"".join(d for k, d in replay if k is kind) == streams[kind][begins[kind]:]
        assert ring.end[kind] == len(streams[kind])
    # In production order: each byte's place in the whole output only ever grows.
    place: dict[tuple[FrameKind, int], int] = {}
    counted = {OUT: 0, ERR: 0}
    for kind, data in chunks:
        for _ in data:
            place[kind, counted[kind]] = len(place)
            counted[kind] += 1
    at = dict(begins)
    places = []
    for kind, data in replay:
        places += [place[kind, at[kind] + i] for i in range(len(data))]
        at[kind] += len(data)
    assert places == sorted(places)


def test_an_offset_beyond_the_output_is_refused() -> None:
    ring = Scrollback(1 << 20)
    ring.append(OUT, b"12345")
    assert ring.since(5, 0) == ({OUT: 5, ERR: 0}, [])
    with pytest.raises(OffsetBeyondOutput, match="stdout offset 6 is beyond the 5 bytes"):
        ring.since(6, 0)
    with pytest.raises(OffsetBeyondOutput, match="stderr offset 1"):
        ring.since(0, 1)
