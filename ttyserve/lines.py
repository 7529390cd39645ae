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
    MAX_LINE bytes: a longer line is cut, so memory stays bounded whatever comes."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        *lines, pending = (self._pending + data).split(b"\n")
        while len(pending) > MAX_LINE:
            lines.append(pending[:MAX_LINE])
            pending = pending[MAX_LINE:]
        self._pending = pending
        return lines

    def flush(self) -> bytes | None:
        """The last line, which had no newline, if there is one."""
        pending, self._pending = self._pending, b""
        return pending or None
