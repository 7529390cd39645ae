"""Readiness callbacks: a descriptor watched by the event loop for as long as it is busy.

The keystroke-echo path. An `await anyio.wait_readable(fd)` costs an epoll_ctl
pair, a future and a task step each time; a callback registered once and run
by the loop the moment the descriptor is readable costs none of them, and
halves the server's CPU time per keystroke. Only asyncio's selector loops
(and uvloop) call back on readiness; elsewhere (trio) `serve` says no and the
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


async def serve_readable(fd: int, callback: Callable[[], bool]) -> bool:
    """Run ``callback`` from the loop each time ``fd`` is readable, until it returns False
    (then return True) or raises (then raise it here, in the waiting task). The callback
    must read, or return False: the loop asks again at once.

    Returns False at once where the running loop has no readiness callbacks: the caller
    then waits the ordinary way. Cancelled, it stops watching before it returns.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio)
        return False
    done = loop.create_future()

    def readable() -> None:
        if done.done():  # cancelled: the task has not removed us yet, and will
            loop.remove_reader(fd)
            return
        try:
            if callback():
                return
        except Exception as exc:  # raised in the task, as if it had met it there
            loop.remove_reader(fd)
            if not done.done():
                done.set_exception(exc)
            return
        loop.remove_reader(fd)
        if not done.done():
            done.set_result(None)

    try:
        # A copy each: a context cannot be entered twice at once (loops in two threads).
        loop.add_reader(fd, _CALLBACK_CONTEXT.copy().run, readable)
    except (NotImplementedError, PermissionError):  # a proactor loop; a regular file
        return False
    try:
        await done
    finally:
        loop.remove_reader(fd)
    return True
