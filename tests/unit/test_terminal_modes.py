"""The terminal modes a PTY's output set, kept for `attached.prologue` (section 10): each
mode, a reset, and sequences split at every byte."""

from __future__ import annotations

import itertools

import pyte
from hypothesis import given
from hypothesis import strategies as st

from ttyserve.protocol.terminal_modes import CARRY_LIMIT, TerminalModes

VIM_LIKE = (b"\x1b[?1049h\x1b[22;0;0t\x1b[?1h\x1b=\x1b[H\x1b[2J\x1b]2;notes.txt - VIM\x07"
            b"\x1b[?2004h\x1b[?1000h\x1b[?1006h\x1b[?25l\x1b[31mtext\x1b[m\x1b[?12l")


def fed(*chunks: bytes) -> TerminalModes:
    modes = TerminalModes()
    for chunk in chunks:
        modes.feed(chunk)
    return modes


def test_a_fresh_terminal_needs_no_prologue() -> None:
    assert fed(b"plain output\r\n\x1b[1;31mcolour\x1b[0m").prologue() == ""


def test_each_mode_a_full_screen_program_sets_is_set_again() -> None:
    assert fed(VIM_LIKE).prologue() == (
        "\x1b[?1049h\x1b[?1h\x1b[?25l\x1b[?2004h\x1b[?1000h\x1b[?1006h\x1b="
        "\x1b]2;notes.txt - VIM\x07")


def test_modes_unset_again_and_a_full_reset_leave_nothing() -> None:
    assert fed(VIM_LIKE, b"\x1b[?1049l\x1b[?1l\x1b>\x1b[?2004;1000;1006l\x1b[?25h"
               ).prologue() == "\x1b]2;notes.txt - VIM\x07"
    assert fed(VIM_LIKE, b"\x1bc").prologue() == ""


def emulated(text: str) -> tuple[set[int], bool, str]:
    """What a terminal emulator (pyte) holds after ``text``: its modes, whether the cursor
    is hidden, its title."""
    screen = pyte.Screen(80, 24)
    pyte.Stream(screen).feed(text)
    return set(screen.mode), screen.cursor.hidden, screen.title


def test_the_prologue_leaves_a_fresh_emulator_as_the_whole_output_did() -> None:
    """pyte plays both terminals: one saw the program's whole output, the other only the
    prologue, after the ring had long lost the sequences."""
    output = VIM_LIKE + b"x" * 100_000
    modes = fed(output[:5000], output[5000:])
    assert emulated(modes.prologue()) == emulated(output.decode())


@given(cuts=st.lists(st.integers(0, len(VIM_LIKE)), max_size=6))
def test_sequences_split_anywhere_are_read_whole(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(VIM_LIKE)]
    pieces = [VIM_LIKE[a:b] for a, b in itertools.pairwise(bounds)]
    assert fed(*pieces).prologue() == fed(VIM_LIKE).prologue()


def test_split_at_every_byte() -> None:
    assert fed(*(VIM_LIKE[i:i + 1] for i in range(len(VIM_LIKE)))).prologue() == (
        fed(VIM_LIKE).prologue())


def test_an_unterminated_sequence_costs_a_bounded_carry() -> None:
    modes = fed(b"\x1b]2;" + b"t" * (10 * CARRY_LIMIT))  # a title that never ends
    assert len(modes._carry) <= CARRY_LIMIT
    modes.feed(b"\x1b[?1049h")
    assert modes.prologue() == "\x1b[?1049h"


def test_output_with_no_question_mark_or_bracket_is_passed_over_but_smkx_is_read() -> None:
    """The fast path (no `?`, no `]`: colour output) keeps the state; the keypad sequence
    terminfo sends right after `ESC [ ? 1 h` is read even in the next read."""
    modes = fed(b"\x1b[?1h", b"\x1b=", b"\x1b[1;31mred\x1b[0m" * 100)
    assert modes.keypad and modes.modes[1]
    assert fed(b"\x1b[?1h\x1b=", b"x" * 100, b"\x1b>").keypad  # a lone `ESC >`: not read


def test_the_epilogue_puts_a_terminal_back_as_it_was() -> None:
    """What a client writes when it leaves a session that set modes (a detach, a lost
    connection): a terminal emulator is as fresh again, its main screen shown."""
    modes = fed(VIM_LIKE)
    screen_modes, hidden, _ = emulated(modes.prologue() + modes.epilogue())
    assert (screen_modes, hidden) == emulated("")[:2]
    assert modes.epilogue().endswith("\x1b[?1049l") and fed(b"plain").epilogue() == ""


def test_a_title_cut_right_after_its_closing_escape_is_kept() -> None:
    assert fed(b"\x1b]2;split title\x1b", b"\\text").title == b"split title"


def test_mouse_tracking_is_one_setting_as_in_xterm() -> None:
    assert fed(b"\x1b[?1000h\x1b[?1003h").prologue() == "\x1b[?1003h"
    assert fed(b"\x1b[?1000h\x1b[?1003h\x1b[?1003l").prologue() == ""
