"""Reap the orphans of sessions: a background job that outlives its session leader.

Where pid 1 does not reap orphans (minimal containers do not), a killed
grandchild would stay a zombie for good. The server makes itself a child
subreaper, so such orphans become its children, and reaps them on SIGCHLD.
It never reaps a session leader (its session awaits it through a pidfd) nor
a child in the server's own session (a child the embedding program spawned).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
from collections.abc import Set

import anyio

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants our children (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def reap_orphans(session_leaders: Set[int]) -> int:
    """Reap every waitable orphan; stop at a child that is not ours to reap."""
    reaped = 0
    own_session = os.getsid(0)
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid == 0 or info.si_pid in session_leaders:
            return reaped
        try:
            if os.getsid(info.si_pid) == own_session:
                return reaped
        except ProcessLookupError:
            pass
        try:
            os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        reaped += 1


async def run_orphan_reaper(session_leaders: Set[int]) -> None:
    """Reap orphans whenever a child changes state, until cancelled. On asyncio the loop's own
    signal handler reaps them (no task step for each of the many SIGCHLDs sessions cause);
    elsewhere a task does, on anyio's signal receiver."""
    try:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGCHLD, reap_orphans, session_leaders)
    except (RuntimeError, NotImplementedError):  # not asyncio, or no signals here
        with anyio.open_signal_receiver(signal.SIGCHLD) as signals:
            reap_orphans(session_leaders)
            async for _ in signals:
                reap_orphans(session_leaders)
        return
    try:
        reap_orphans(session_leaders)
        await anyio.sleep_forever()
    finally:
        loop.remove_signal_handler(signal.SIGCHLD)
