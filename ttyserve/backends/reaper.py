"""Reap the orphans of sessions: a background job that outlives its session leader.

Where pid 1 does not reap orphans (minimal containers do not), a killed
grandchild would stay a zombie for good. The server makes itself a child
subreaper, so such orphans become its children, and reaps them when a session's
leader is reaped and every ORPHAN_SWEEP seconds (not on SIGCHLD: that woke the
loop for every child sessions start, 8% of the session rate, measured).
It never reaps a session leader (its session awaits it through a pidfd) nor
a child in the server's own session (a child the embedding program spawned).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Set

import anyio

_PR_SET_CHILD_SUBREAPER = 36
ORPHAN_SWEEP = 0.25  # seconds: the longest an orphan that died stays a zombie


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
    """Reap orphans every ORPHAN_SWEEP seconds, until cancelled (besides the reaping when a
    session's leader is reaped, which its backend does)."""
    while True:
        reap_orphans(session_leaders)
        await anyio.sleep(ORPHAN_SWEEP)
