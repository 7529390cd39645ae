"""How a session learns that its child may have ended: a pidfd, or polling where none exists.

Either way the status itself comes from waitpid(WNOHANG) on the child, so it
is the raw wait status (signal, core dump) whichever watch woke us.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import anyio

# Polling delays: the first check is at once, then 1 ms doubling up to 50 ms, so an
# exit is noticed at most ~50 ms late and a long-running child costs 20 wake-ups a second.
POLL_FIRST = 0.001
POLL_MAX = 0.05


class ExitWatch(Protocol):
    """Wakes the waiter when the child may have changed state."""

    async def wait(self) -> None:
        """Until the child may be waitable; waitpid(WNOHANG) then says whether it is."""
        ...

    def close(self) -> None:
        """Release what the watch holds (idempotent)."""
        ...


WatchFactory = Callable[[int], ExitWatch]


class PidfdWatch:
    """A pidfd (Linux 5.3+): readable once the process has exited, no polling, no thread."""

    def __init__(self, pid: int) -> None:
        """Raises ProcessLookupError when ``pid`` was already reaped, OSError when
        the kernel refuses pidfds (ENOSYS before 5.3, EPERM under some seccomp filters)."""
        self.fd: int | None = os.pidfd_open(pid)

    async def wait(self) -> None:
        assert self.fd is not None, "the watch is closed"
        await anyio.wait_readable(self.fd)

    def close(self) -> None:
        """Nothing may wait on it any more (`LocalProcess.aclose` closes it once reaped)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class PollWatch:
    """No pidfd: wake after a delay that backs off from POLL_FIRST to POLL_MAX."""

    def __init__(self, pid: int) -> None:
        self._delay = 0.0

    async def wait(self) -> None:
        await anyio.sleep(self._delay)
        self._delay = min(max(self._delay * 2, POLL_FIRST), POLL_MAX)

    def close(self) -> None:
        return None


def open_exit_watch(pid: int) -> ExitWatch:
    """A pidfd where the kernel gives one, else polling.

    Raises ProcessLookupError when ``pid`` was already reaped (SIGCHLD ignored).
    """
    if hasattr(os, "pidfd_open"):
        try:
            return PidfdWatch(pid)
        except ProcessLookupError:
            raise
        except OSError:
            pass  # ENOSYS or EPERM: fall back to polling
    return PollWatch(pid)
