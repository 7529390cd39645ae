"""Process groups: signal one, ask whether it has members; when a process started. For
sessions, their cgroups and the journal."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("ttyserve")


def signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to group ``pgid``; a group that is gone is not an error."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
    except OSError as exc:  # e.g. EPERM: every member switched to another uid
        log.warning("cannot send signal %d to process group %d: %s", signum, pgid, exc.strerror)


def group_alive(pgid: int) -> bool:
    """Whether group ``pgid`` has any member (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start_time(pid: int) -> int | None:
    """Clock ticks after boot at which ``pid`` started (tells a pid from its reuse)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            text = file.read()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[19])
