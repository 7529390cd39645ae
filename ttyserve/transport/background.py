"""Work that runs beside a block and ends with it: the one shape the library's context
managers share (a connection's reader, a carrier's stderr, a fan-out's targets)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc


@asynccontextmanager
async def beside() -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group for work beside the block: when the block ends, however it ends, the
    group is cancelled, and what the block raised is raised as it was (not wrapped in an
    exception group, as a task group would)."""
    failure: BaseException | None = None
    async with anyio.create_task_group() as group:
        try:
            yield group
        except BaseException as exc:  # re-raised below, unwrapped by the task group
            failure = exc
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
