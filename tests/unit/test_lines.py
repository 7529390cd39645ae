"""LineBuffer: whole lines, each at most max_line bytes, the same however the stream is cut."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ttyserve.lines import LineBuffer

MOST = 8


def lines_of(chunks: list[bytes]) -> list[bytes]:
    buffer = LineBuffer(MOST)
    lines = [line for chunk in chunks for line in buffer.feed(chunk)]
    last = buffer.flush()
    return lines + ([last] if last is not None else [])


@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\0", b"\n")), max_size=8))
def test_the_lines_do_not_depend_on_how_the_stream_was_cut(chunks: list[bytes]) -> None:
    whole = b"".join(chunks)
    lines = lines_of(chunks)
    assert lines == lines_of([whole]) == lines_of([bytes([b]) for b in whole])
    assert all(len(line) <= MOST and b"\n" not in line for line in lines)


def test_a_long_line_is_cut_at_each_max_line_bytes_from_its_start() -> None:
    assert lines_of([b"0123456789abcdefXY\nshort\n"]) == [
        b"01234567", b"89abcdef", b"XY", b"short"]
    assert lines_of([b"0123456789", b"abcdefXY\n"]) == [b"01234567", b"89abcdef", b"XY"]
    assert lines_of([b"\n\n"]) == [b"", b""]
