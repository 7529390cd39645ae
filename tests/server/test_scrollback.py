"""The scrollback ring, with no event loop: order, bound, what was dropped, no copies kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ttyserve.protocol.frames import FrameKind
from ttyserve.server.scrollback import CHUNK_COST, PIECE, Scrollback

OUT, ERR = FrameKind.STDOUT, FrameKind.STDERR


def joined(ring: Scrollback, kind: FrameKind | None = None) -> bytes:
    return b"".join(data for k, data in ring.snapshot() if kind in (None, k))


def test_output_comes_back_in_order_with_its_stream() -> None:
    ring = Scrollback(1 << 20)
    ring.append(OUT, b"one ")
    ring.append(ERR, b"two ")
    ring.append(OUT, b"three")
    assert ring.snapshot() == [(OUT, b"one "), (ERR, b"two "), (OUT, b"three")]
    assert (len(ring), ring.dropped) == (13, 0)


def test_the_oldest_output_goes_first_and_is_counted_as_dropped() -> None:
    ring = Scrollback(10 + CHUNK_COST)  # room for one chunk of 10 bytes
    ring.append(OUT, b"0123456789")
    ring.append(OUT, b"abcd")  # joined to the small chunk before it: the head is trimmed
    assert joined(ring) == b"456789abcd" and ring.dropped == 4


def test_a_snapshot_does_not_change_with_later_output() -> None:
    ring = Scrollback(1 << 20)
    ring.append(OUT, b"before")
    snapshot = ring.snapshot()
    ring.append(OUT, b" after")
    assert snapshot == [(OUT, b"before")]


def test_large_output_is_kept_in_pieces_of_one_read() -> None:
    ring = Scrollback(4 << 20)
    data = bytes(range(256)) * (3 * PIECE // 256 + 1)
    ring.append(OUT, data)
    assert all(len(piece) <= PIECE for _, piece in ring.snapshot())
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
    assert len(held) + CHUNK_COST * len(ring.snapshot()) <= size
    for kind in (OUT, ERR):  # each stream's tail, in its own order
        assert b"".join(d for k, d in chunks if k is kind).endswith(joined(ring, kind))
