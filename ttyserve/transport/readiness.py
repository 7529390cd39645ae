"""Readiness callbacks: a descriptor watched by the event loop, its callback run on readiness.

The keystroke-echo path. An `await anyio.wait_readable(fd)` costs an epoll_ctl
pair, a future and a task step each time; a callback registered once and run
by the loop the moment the descriptor is readable costs none of them, and
halves the server's CPU time per keystroke. Only asyncio's selector loops
(and uvloop) call back on readiness; elsewhere (trio) there is no `Watch` and
`ReadableService.serve` says no, and the caller waits the ordinary way.

Two shapes: `ReadableService`, an awaitable for a task that can hand the work to
the loop while it would only wait (a connection's reader, a close's drain), and
`Watch`, started and stopped at will, for work that has no task of its own (a
session's output).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
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


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio)
        return None


class Watch:
    """``fd`` watched by the running loop: ``callback`` runs each time it is readable,
    between `start` and `stop`. The callback must read, or stop the watch: the loop asks
    again at once. Made by `watch_readable`, which starts it."""

    __slots__ = ("_callback", "_context", "_fd", "_loop", "active")

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int,
                 callback: Callable[[], None]) -> None:
        self._loop = loop
        self._fd = fd
        self._callback = callback
        # A copy: a context cannot be entered twice at once (loops in two threads).
        self._context = _CALLBACK_CONTEXT.copy()
        self.active = False

    def start(self) -> None:
        if not self.active:
            self._loop.add_reader(self._fd, self._context.run, self._callback)
            self.active = True

    def stop(self) -> None:
        if self.active:
            self.active = False
            self._loop.remove_reader(self._fd)

    def close(self) -> None:
        """Stop for good, and let go of the callback (which may hold what holds the watch:
        a cycle that would wait for a collection)."""
        self.stop()
        self._callback = _nothing


def _nothing() -> None:
    """The callback of a closed watch."""


def watch_readable(fd: int, callback: Callable[[], None]) -> Watch | None:
    """A started `Watch` of ``fd``, or None where the loop has no readiness callbacks
    (trio, a proactor loop) or will not watch ``fd`` (epoll refuses a regular file)."""
    loop = _running_loop()
    if loop is None:
        return None
    watch = Watch(loop, fd, callback)
    try:
        watch.start()
    except (NotImplementedError, PermissionError):
        return None
    return watch


class ReadableService:
    """A descriptor's reads done by the loop's readiness callback for a task that waits
    meanwhile; one task at a time, and it can be ended from outside (`wake`) or at a
    deadline: the task waiting in it needs no cancel scope for either."""

    __slots__ = ("_done", "_timer")

    def __init__(self) -> None:
        self._done: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def serve(self, fd: int, callback: Callable[[], bool],
                    deadline: float = math.inf) -> bool:
        """Run ``callback`` from the loop each time ``fd`` is readable, until it returns
        False, `wake` is called or ``deadline`` (the loop's clock, anyio's current_time)
        passes, then return True; what the callback raises is raised here, in the waiting
        task. The callback must read, or return False: the loop asks again at once.

        Returns False at once where the running loop has no readiness callbacks: the caller
        then waits the ordinary way. Cancelled, it stops watching before it returns.
        """
        loop = _running_loop()
        if loop is None:
            return False
        done = self._done = loop.create_future()

        def readable() -> None:
            if done.done():  # ended: the task has not removed us yet, and will
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
            loop.add_reader(fd, _CALLBACK_CONTEXT.copy().run, readable)
        except (NotImplementedError, PermissionError):  # a proactor loop; a regular file
            self._done = None
            return False
        self._timer = loop.call_at(deadline, self.wake) if deadline < math.inf else None
        try:
            await done
        finally:
            # The future holds what the callback raised, whose traceback holds this frame:
            # a cycle through the callback's owner, kept until a collection, unless cut.
            self._done = done = None  # type: ignore[assignment]
            loop.remove_reader(fd)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        return True

    @property
    def serving(self) -> bool:
        """Whether a `serve` is under way (and not ended yet)."""
        return self._done is not None and not self._done.done()

    def end_by(self, deadline: float) -> None:
        """End the `serve` under way at ``deadline`` at the latest."""
        if self.serving:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self.wake)

    def wake(self) -> bool:
        """End the `serve` under way; False when none is."""
        done = self._done
        if done is None or done.done():
            return False
        done.set_result(None)
        return True

