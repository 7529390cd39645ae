"""The local terminal of `ttyserve exec`: raw mode that is always restored, window size."""

from __future__ import annotations

import contextlib
import os
import termios
import tty
from collections.abc import Iterator

from ..protocol.messages import DEFAULT_COLS, DEFAULT_ROWS


def window_size(fd: int) -> tuple[int, int]:
    """(rows, cols) of the terminal on ``fd``, or `open`'s default size when it has none."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return DEFAULT_ROWS, DEFAULT_COLS
    return max(size.lines, 1) or 24, max(size.columns, 1) or 80


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """Put the terminal on ``fd`` in raw mode; restore it on every way out of the block."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        with contextlib.suppress(termios.error):  # a terminal that went away keeps nothing
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


DEFAULT_DETACH_KEY = "^\\d"  # Ctrl-\ then d, as abduco


def parse_key(text: str) -> bytes:
    """Keys in caret notation as bytes: `^\\d` is Ctrl-\\ then d, `^?` is DEL; raises
    ValueError naming what is wrong."""
    keys = bytearray()
    chars = iter(text)
    for char in chars:
        if char != "^":
            keys += char.encode()
            continue
        control = next(chars, None)
        if control is None:
            raise ValueError(f"{text!r} ends with ^ and no key after it")
        if control == "?":
            keys.append(0x7F)
        elif "@" <= control.upper() <= "_":
            keys.append(ord(control.upper()) ^ 0x40)
        else:
            raise ValueError(f"^{control} in {text!r} is not a control key")
    if not keys:
        raise ValueError("an empty detach key")
    return bytes(keys)


class DetachKey:
    """Finds the detach sequence in what is typed; everything else passes through unchanged.

    A key that begins the sequence is held back until the next one says whether the
    sequence goes on; if it does not, the held keys are sent as typed.
    """

    def __init__(self, sequence: bytes) -> None:
        self.sequence = sequence
        self._held = b""

    @property
    def holding(self) -> bool:
        """Whether keys that may begin the sequence are held back."""
        return bool(self._held)

    def release(self) -> bytes:
        """The held keys, to send as typed (no more came, or input ended)."""
        held, self._held = self._held, b""
        return held

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """(what to send on, whether the sequence was typed: then the rest is dropped)."""
        data = self._held + data
        self._held = b""
        found = data.find(self.sequence)
        if found >= 0:
            return data[:found], True
        for size in range(min(len(self.sequence) - 1, len(data)), 0, -1):
            if data.endswith(self.sequence[:size]):
                self._held = data[-size:]
                return data[:-size], False
        return data, False
