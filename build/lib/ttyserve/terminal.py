"""The local terminal of `ttyserve exec`: raw mode that is always restored, window size."""

from __future__ import annotations

import contextlib
import os
import termios
import tty
from collections.abc import Iterator

from .protocol.messages import DEFAULT_COLS, DEFAULT_ROWS


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
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
