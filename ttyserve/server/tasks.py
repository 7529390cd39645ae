"""The server's many small tasks (a connection's, a session's where it needs one, a session's
end where it has to wait), at the loop's price.

anyio 4.16's task groups make a cancel scope, an event and a task handle for every task
they start: 32 µs and 4.6 KiB a task against 5.5 µs and 1.2 KiB for a task of asyncio's
own (docs/performance.md). On asyncio these tasks are the loop's own, each run inside an
anyio cancel scope of its own, so that shields and anyio's cancellation hold in them as in
any anyio task; elsewhere (trio) they are the task group's. Either way the group owns
them: leaving it cancels every task still running and waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc

log = logging.getLogger("ttyserve")

Work = Callable[..., Coroutine[Any, Any, None]]


class Tasks:
    """Starts tasks that the enclosing `open_tasks` block owns."""

    def __init__(self, group: anyio.abc.TaskGroup) -> None:
        self._group = group
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio: the task group starts them
            self._loop = None
        self._scopes: set[anyio.CancelScope] = set()
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False

    def start_soon(self, work: Work, *args: object,
                   scope: anyio.CancelScope | None = None) -> None:
        """Run ``work(*args)`` in a task of its own, within ``scope`` (a new cancel scope if
        none is given: the one that cancels the task); what it raises is logged (the work of a
        session or a connection catches its own faults: this is a last resort)."""
        scope = scope or anyio.CancelScope()
        if self._loop is None:
            self._group.start_soon(self._run, work, args, scope)
            return
        task = self._loop.create_task(self._run(work, args, scope))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, work: Work, args: tuple[object, ...], scope: anyio.CancelScope,
                   ) -> None:
        with scope:
            if self._closed:
                scope.cancel()
            self._scopes.add(scope)
            try:
                await work(*args)
            except Exception:
                log.exception("task %s failed", getattr(work, "__qualname__", work))
            finally:
                self._scopes.discard(scope)

    def cancel(self) -> None:
        """Cancel every task, and those started from now on."""
        self._closed = True
        for scope in list(self._scopes):
            scope.cancel()

    async def _wait(self) -> None:
        while self._running:
            await asyncio.wait(list(self._running))


@asynccontextmanager
async def open_tasks(group: anyio.abc.TaskGroup) -> AsyncIterator[Tasks]:
    """Tasks owned by this block (and by ``group``, where the loop has no tasks of its own):
    on the way out, every one still running is cancelled and waited for."""
    tasks = Tasks(group)
    try:
        yield tasks
    finally:
        tasks.cancel()
        with anyio.CancelScope(shield=True):
            await tasks._wait()
