"""The terminal modes a PTY session's output has set, so a fresh terminal can be put back in
them (`attached.prologue`, section 10 and contracts.md), and a client's terminal put back
to its own when it leaves a session that set them (`epilogue`).

A program switches a terminal into the alternate screen, application cursor keys or mouse
reporting once, at its start; a ring that has since dropped that sequence cannot replay
it. This tracker reads the output as it passes and keeps what the sequences said: the DEC
private modes of the list below, the keypad mode, and the window title. A full reset
(`ESC c`) forgets them. A sequence split across reads is carried to the next read.

It must cost the output path nothing: every sequence it keeps but the keypad's and the
reset's holds a `?` (`ESC [ ? ...`) or a `]` (`ESC ] ...`), which a memchr finds at
memory speed, while a regular expression over output full of colour sequences runs at
a few hundred MB/s. So output with neither `?` nor `]` is passed over unread, and the
keypad (`ESC =`, `ESC >`) and the reset are read where they come as programs send them:
with a mode change (terminfo's smkx is `ESC [ ? 1 h ESC =`; `reset` sends `ESC c` with an
`ESC ] 104`), in the same read or the next.
"""

from __future__ import annotations

import re

# DEC private modes kept, with their state on a fresh terminal.
SCREEN_MODES = (1049, 1047, 47)  # alternate screen (set before the others: it switches)
DEC_MODES: dict[int, bool] = {
    **{mode: False for mode in SCREEN_MODES},
    1: False,  # application cursor keys
    25: True,  # cursor visible
    2004: False,  # bracketed paste
    9: False, 1000: False, 1001: False, 1002: False, 1003: False,  # mouse reporting (one
    # setting, as xterm keeps it: setting one clears the others, resetting any clears all)
    1004: False,  # focus events
    1005: False, 1006: False, 1015: False,  # mouse encodings
}
MOUSE_TRACKING = (9, 1000, 1001, 1002, 1003)
TITLE_LIMIT = 1024  # a longer title is not kept
CARRY_LIMIT = TITLE_LIMIT + 8  # the most of a split sequence carried to the next read

_SEQUENCE = re.compile(
    rb"\x1b(?:\[\?([0-9;]*)([hl])"  # DECSET / DECRST
    rb"|\][02];([^\x07\x1b]*)(?:\x07|\x1b\\)"  # OSC 0 / 2: the title
    rb"|([=>c]))")  # keypad application / numeric, full reset
_PREFIX = re.compile(  # what a read may end with, part of one of those sequences
    rb"\x1b(?:\[(?:\?[0-9;]*)?|\](?:[02](?:;[^\x07\x1b]*\x1b?)?)?)?")


class TerminalModes:
    """Feed it a PTY's output; `prologue` sets a fresh terminal to the same modes."""

    __slots__ = ("_carry", "_near", "keypad", "modes", "title")

    def __init__(self) -> None:
        self._carry = b""
        self._near = False  # the last read held a sequence: the next is read whole too
        self._reset()

    def _reset(self) -> None:
        self.modes = dict(DEC_MODES)
        self.keypad = False  # application keypad (ESC =)
        self.title: bytes | None = None

    def feed(self, data: bytes) -> None:
        """Read ``data``, the next output of the terminal."""
        if not data:
            return
        if self._carry:
            data = self._carry + data
            self._carry = b""
        elif not self._near and b"?" not in data and b"]" not in data:
            if data.endswith((b"\x1b", b"\x1b[")):  # what may begin `ESC [ ?`, `ESC ]`
                self._carry = bytes(data[-2:] if data.endswith(b"\x1b[") else data[-1:])
            return
        end = 0
        self._near = False
        for match in _SEQUENCE.finditer(data):
            self._near = True
            end = match.end()
            params, action, title, single = match.groups()
            if action is not None:
                self._dec(params, action == b"h")
            elif title is not None:
                self.title = title if len(title) <= TITLE_LIMIT else self.title
            elif single == b"=":
                self.keypad = True
            elif single == b">":
                self.keypad = False
            else:
                self._reset()  # ESC c: a full reset
        start = data.rfind(b"\x1b", end)
        title = data.rfind(b"\x1b]", end)  # a title cut after its closing ESC: from its start
        if 0 <= title < start and _PREFIX.fullmatch(data, title):
            start = title
        if start >= 0 and len(data) - start <= CARRY_LIMIT and _PREFIX.fullmatch(data, start):
            self._carry = bytes(data[start:])

    def _dec(self, params: bytes, on: bool) -> None:
        for param in params.split(b";"):
            if param.isdigit() and (mode := int(param)) in self.modes:
                if mode in MOUSE_TRACKING:
                    for other in MOUSE_TRACKING:
                        self.modes[other] = False
                self.modes[mode] = on

    def epilogue(self) -> str:
        """Escape sequences that put a terminal in these modes back to a fresh one's (the
        alternate screen left last; a title cannot be taken back)."""
        parts = [f"\x1b[?{mode}{'h' if DEC_MODES[mode] else 'l'}"
                 for mode, on in reversed(self.modes.items()) if on != DEC_MODES[mode]]
        if self.keypad:
            parts.insert(0, "\x1b>")
        return "".join(parts)

    def prologue(self) -> str:
        """Escape sequences that put a fresh terminal in these modes ("" for a fresh one's)."""
        parts = [f"\x1b[?{mode}{'h' if on else 'l'}" for mode, on in self.modes.items()
                 if on != DEC_MODES[mode]]
        if self.keypad:
            parts.append("\x1b=")
        if self.title is not None:
            parts.append("\x1b]2;" + self.title.decode("utf-8", "replace") + "\x07")
        return "".join(parts)
