"""Interactive first (server/sessions/typing_first.py): while anyone types, the sessions nobody
types into read small; the typed-into session, and everyone once nobody types, whole."""

from __future__ import annotations

from ttyserve.defaults import OUTPUT_CHUNK
from ttyserve.server.sessions.typing_first import BULK_GRAIN, TYPING_WINDOW, Typing


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_nobody_typing_leaves_every_read_whole() -> None:
    typing = Typing(Clock())
    assert typing.limit(OUTPUT_CHUNK, 0.0) == OUTPUT_CHUNK


def test_while_someone_types_the_others_read_small_and_the_typist_whole() -> None:
    clock = Clock()
    typing = Typing(clock)
    typed_at = typing.typed()
    clock.now += TYPING_WINDOW / 2
    assert typing.limit(OUTPUT_CHUNK, 0.0) == BULK_GRAIN  # a session nobody typed into
    assert typing.limit(OUTPUT_CHUNK, typed_at) == OUTPUT_CHUNK  # the one typed into
    assert typing.limit(100, 0.0) == 100  # credit smaller than the grain stays as it is


def test_once_the_typing_stops_the_reads_are_whole_again() -> None:
    clock = Clock()
    typing = Typing(clock)
    typing.typed()
    clock.now += TYPING_WINDOW
    assert typing.limit(OUTPUT_CHUNK, 0.0) == OUTPUT_CHUNK


def test_once_the_typing_stopped_the_output_pump_reads_no_clock() -> None:
    """`limit` runs for every read of every session: with nobody typing it costs a check."""
    clock = Clock()
    typing = Typing(clock)
    typing.typed()
    clock.now += TYPING_WINDOW
    assert typing.limit(OUTPUT_CHUNK, 0.0) == OUTPUT_CHUNK  # (this look finds it over)
    clock.now = float("nan")  # a clock read from here on would break every comparison
    assert typing.limit(OUTPUT_CHUNK, 0.0) == OUTPUT_CHUNK
