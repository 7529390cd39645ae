"""asciicast v3 to v2 (`recording convert`, contracts.md): absolute times from the intervals,
the header's terminal in v2's members, markers kept, the exit as a last marker `exit CODE`,
and a line naming what is wrong with anything that is not a v3 recording."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ttyserve.asciicast import ToV2, v2_header
from ttyserve.errors import RecordingError

HEADER = {"version": 3, "term": {"cols": 80, "rows": 24, "type": "xterm-256color"},
          "timestamp": 1796082464, "command": "/bin/bash -l"}  # as serve --record writes it


def convert(*lines: str, header: dict[str, Any] | None = None) -> list[str]:
    """The v2 lines (without newlines) for HEADER (or ``header``) and ``lines``."""
    conversion = ToV2()
    converted = [conversion.feed(line) for line in
                 [json.dumps(header or HEADER) + "\n", *(line + "\n" for line in lines)]]
    conversion.finish()
    assert all(line is None or (line.endswith("\n") and line.count("\n") == 1)
               for line in converted)
    return [line.rstrip("\n") for line in converted if line is not None]


def events(*lines: str) -> list[list[Any]]:
    return [json.loads(line) for line in convert(*lines)[1:]]


def failure(*lines: str) -> RecordingError:
    """The error for a file of ``lines`` (each with its newline)."""
    conversion = ToV2()
    with pytest.raises(RecordingError) as caught:
        for line in lines:
            conversion.feed(line)
        conversion.finish()
    return caught.value


def test_the_header_of_serve_record_in_v2s_members() -> None:
    head = json.loads(convert()[0])
    assert head == {"version": 2, "width": 80, "height": 24, "timestamp": 1796082464,
                    "command": "/bin/bash -l", "env": {"TERM": "xterm-256color"}}


def test_a_full_header_keeps_all_v2_has_a_place_for() -> None:
    full = {"version": 3, "term": {"cols": 100, "rows": 30, "type": "screen",
                                   "version": "VTE(7802)",
                                   "theme": {"fg": "#d0d0d0", "bg": "#212121",
                                             "palette": "#151515:#ac4142"}},
            "timestamp": 5, "idle_time_limit": 2.5, "title": "Demo",
            "env": {"SHELL": "/bin/zsh", "TERM": "ignored"}, "tags": ["a"]}
    assert v2_header(full) == {
        "version": 2, "width": 100, "height": 30, "timestamp": 5, "idle_time_limit": 2.5,
        "title": "Demo", "tags": ["a"], "env": {"SHELL": "/bin/zsh", "TERM": "screen"},
        "theme": {"fg": "#d0d0d0", "bg": "#212121", "palette": "#151515:#ac4142"}}
    assert "env" not in v2_header({"version": 3, "term": {"cols": 1, "rows": 1}})


def test_intervals_become_seconds_since_the_start() -> None:
    converted = convert('[0.012, "o", "$ "]', '[1.204, "i", "ls\\r"]',
                        '[0.003, "o", "ls\\r\\n"]', '[2.519, "r", "100x30"]',
                        '[0, "o", "same time"]', '[0.871, "o", "exit\\r\\n"]')
    assert converted[1:] == ['[0.012000, "o", "$ "]', '[1.216000, "i", "ls\\r"]',
                             '[1.219000, "o", "ls\\r\\n"]', '[3.738000, "r", "100x30"]',
                             '[3.738000, "o", "same time"]', '[4.609000, "o", "exit\\r\\n"]']


@given(st.lists(st.integers(0, 10**7), max_size=50))
def test_times_are_the_exact_sums_of_the_intervals(ms: list[int]) -> None:
    """Whole microseconds added up: 10 000 intervals of 1 ms end at 10 s, not 9.99999..."""
    times = [event[0] for event in events(*(f'[{m / 1000}, "o", "x"]' for m in ms))]
    assert times == [sum(ms[:i + 1]) / 1000 for i in range(len(ms))]


def test_ten_thousand_milliseconds_end_at_ten_seconds() -> None:
    assert convert(*['[0.001, "o", "."]'] * 10_000)[-1] == '[10.000000, "o", "."]'


def test_markers_stay_markers_and_the_exit_becomes_the_last_one() -> None:
    assert events('[0.5, "o", "pw: "]', '[1.0, "m", "input hidden"]',
                  '[0.25, "x", "-9"]') == [[0.5, "o", "pw: "], [1.5, "m", "input hidden"],
                                           [1.75, "m", "exit -9"]]
    assert events('[0.1, "x", "0"]') == [[0.1, "m", "exit 0"]]


def test_codes_v2_does_not_know_are_kept_as_they_are() -> None:
    assert events('[0.1, "z", "future"]') == [[0.1, "z", "future"]]


def test_comments_and_blank_lines_are_dropped() -> None:
    assert events("# event stream follows the header", "", '[0.5, "o", "a"]',
                  "  # indented") == [[0.5, "o", "a"]]


def test_output_is_ascii_json_with_every_control_character_escaped() -> None:
    data = "caf\u00e9 \u001b[1m\x7f\u2603\U0001f600\r\n"
    line = convert(f'[0.1, "o", {json.dumps(data, ensure_ascii=False)}]')[1]
    assert line.isascii() and "\x7f" not in line and "\x1b" not in line
    assert json.loads(line)[2] == data


def test_a_cut_last_line_is_dropped_and_told() -> None:
    conversion = ToV2()
    lines = [json.dumps(HEADER) + "\n", '[0.1, "o", "a"]\n', '[0.2, "o", "b']
    converted = [conversion.feed(line) for line in lines]
    conversion.finish()
    assert converted[1:] == ['[0.100000, "o", "a"]\n', None] and conversion.cut == 3


def test_a_last_line_without_its_newline_that_parses_is_kept() -> None:
    conversion = ToV2()
    conversion.feed(json.dumps(HEADER) + "\n")
    assert conversion.feed('[0.1, "o", "a"]') == '[0.100000, "o", "a"]\n'
    assert conversion.cut is None


@pytest.mark.parametrize(("lines", "line", "says"), [
    ([], None, "empty: not an asciicast recording"),
    (["\n"], 1, "not JSON: not a header"),
    (["# a comment\n"], 1, "not JSON: not a header"),
    (["hello world\n"], 1, "not JSON: not a header"),
    (['[0.1, "o", "x"]\n'], 1, "not a JSON object"),
    (['{"version": 2, "width": 80, "height": 24}\n'], 1, "already asciicast v2"),
    (['{"version": 1, "width": 80, "height": 24, "stdout": []}\n'], 1, "version 1, not 3"),
    (['{"term": {"cols": 80, "rows": 24}}\n'], 1, "version null, not 3"),
    (['{"version": 3, "width": 80, "height": 24}\n'], 1, "no term.cols and term.rows"),
    (['{"version": 3, "term": {"cols": 0, "rows": 24}}\n'], 1, "no term.cols"),
    (['{"version": 3, "term": {"cols": "80", "rows": 24}}\n'], 1, "no term.cols"),
    (['{"version": 3, "term": {"cols": true, "rows": 24}}\n'], 1, "no term.cols"),
    (["{}\n", '[1, "o", "x"]\n', "broken\n", '[1, "o", "y"]\n'], 3, "not JSON: not an event"),
    (["{}\n", "{}\n"], 2, "not an event [interval, code, data]"),
    (["{}\n", '[1, "o"]\n'], 2, "not an event [interval, code, data]"),
    (["{}\n", '[1, "o", "x", 4]\n'], 2, "not an event [interval, code, data]"),
    (["{}\n", '[-0.5, "o", "x"]\n'], 2, "the interval -0.5 is not a number of seconds"),
    (["{}\n", '["1", "o", "x"]\n'], 2, 'the interval "1" is not'),
    (["{}\n", '[true, "o", "x"]\n'], 2, "the interval true is not"),
    (["{}\n", '[NaN, "o", "x"]\n'], 2, "the interval NaN is not"),
    (["{}\n", '[1, "", "x"]\n'], 2, "code and data are strings"),
    (["{}\n", '[1, "x", 3]\n'], 2, "code and data are strings"),
], ids=lambda value: None)
def test_what_is_not_a_v3_recording_is_named_with_its_line(
        lines: list[str], line: int | None, says: str) -> None:
    lines = [json.dumps(HEADER) + "\n" if text == "{}\n" else text for text in lines]
    error = failure(*lines)
    assert says in error.message and error.line == line, (error.message, error.line)
