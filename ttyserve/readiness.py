"""Readiness callbacks: a descriptor watched by the event loop for as long as it is busy.

The keystroke-echo path. An `await anyio.wait_readable(fd)` costs an epoll_ctl
pair, a future and a task step each time; a callback registered once and run
by the loop the moment the descriptor is readable costs none of them, and
halves the server's CPU time per keystroke. Only asyncio's selector loops
(and uvloop) call back on readiness; elsewhere (trio) `watch` says no and the
caller waits the ordinary way.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable


def _asyncio_context() -> contextvars.Context:
    """A context in which anyio knows it runs on asyncio with no task running (sniffio,
    where installed, looks for a task): a callback may then make events and start tasks."""
    context = contextvars.Context()
    try:
        import sniffio
    except ImportError:  # anyio then asks asyncio for the running loop, which works
        return context
    context.run(sniffio.current_async_library_cvar.set, "asyncio")
    return context


_CALLBACK_CONTEXT = _asyncio_context()


class ReadWatch:
    """Calls ``callback`` from the loop each time ``fd`` is readable, between `start` and
    `stop`. The callback must read (or stop the watch): the loop asks again at once."""

    __slots__ = ("_loop", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, callback: Callable[[], None]) -> bool:
        """Watch ``fd``; False where the running loop has no readiness callbacks."""
        try:
            loop = asyncio.get_running_loop()
            loop.add_reader(self.fd, _CALLBACK_CONTEXT.run, callback)
        except (RuntimeError, NotImplementedError):  # not asyncio (trio), or a proactor loop
            return False
        self._loop = loop
        return True

    def stop(self) -> None:
        """Stop watching (idempotent); call before the descriptor is closed or waited on."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.remove_reader(self.fd)
