"""Whole lines: split a byte stream into lines, bounded, and write bytes out whole."""

from __future__ import annotations

import os

MAX_LINE = 64 * 1024  # a longer line comes out in pieces of this size, each as a line


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a blocking descriptor (os.write may write less)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LineBuffer:
    """Bytes in, whole lines out (without their newline). What is held is at most
    ``max_line`` bytes: a longer line is cut, so memory stays bounded whatever comes."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._pending = b""
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        """The lines ``data`` completes; every line is cut at each MAX_LINE bytes from its
        start, so the lines are the same however the stream was split."""
        most = self._max
        *lines, pending = (self._pending + data).split(b"\n")
        if any(len(line) > most for line in lines):
            lines = [line[at:at + most] for line in lines
                     for at in range(0, len(line) or 1, most)]
        while len(pending) > most:
            lines.append(pending[:most])
            pending = pending[most:]
        self._pending = pending
        return lines

    def flush(self) -> bytes | None:
        """The last line, which had no newline, if there is one."""
        pending, self._pending = self._pending, b""
        return pending or None
