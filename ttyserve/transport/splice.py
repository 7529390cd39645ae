"""A pipe's bytes moved into a Unix socket by the kernel (splice(2)), never read by us.

Linux only (`CAN_SPLICE`). The caller knows how many bytes the pipe holds
(`buffered`) before it frames them, so a frame's header can go first; what the
socket does not take at once stays in the pipe until it does (the outbox's
`PipeTail`).
"""

from __future__ import annotations

import array
import fcntl
import os
import termios

import anyio

CAN_SPLICE = hasattr(os, "splice")
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


def buffered(pipe: int) -> int:
    """How many bytes the pipe holds now (FIONREAD)."""
    count = array.array("i", [0])
    fcntl.ioctl(pipe, termios.FIONREAD, count)
    return count[0]


def splice_some(pipe: int, sock: int, size: int) -> int:
    """Move up to ``size`` bytes (all in the pipe now) into the socket: how many it took.

    Raises anyio.BrokenResourceError when the socket is broken.
    """
    moved = 0
    while moved < size:
        try:
            step = os.splice(pipe, sock, size - moved, flags=_FLAGS)
        except BlockingIOError:
            break
        except OSError as exc:
            raise anyio.BrokenResourceError(f"the connection is broken: {exc}") from exc
        if not step:
            break
        moved += step
    return moved


def discard(pipe: int, size: int) -> None:
    """Drop up to ``size`` bytes the pipe holds now (a frame whose connection broke)."""
    while size > 0:
        try:
            chunk = os.read(pipe, size)
        except OSError:
            return
        if not chunk:
            return
        size -= len(chunk)
