"""The one table from a process's wait status to the wire `exit` and to CLI exit codes.

Wire: 0..255 for a normal exit, ``-S`` for a death by signal S (with its name
and the core-dump flag), ``-1`` with ``error`` when the status could not be
learned. CLI: the `ttyserve serve` and `ttyserve exec` tables of contracts.md, and
`recording convert`'s two codes.
"""

from __future__ import annotations

import enum
import errno as errnos
import os
import signal

from .protocol.messages import Exit

WAIT_FAILED = -1


class ServeExit(enum.IntEnum):
    """Exit codes of `ttyserve serve` (contracts.md)."""

    OK = 0  # clean shutdown
    ERROR = 1  # unhandled error, or a forced shutdown (second signal, watchdog)
    USAGE = 2  # bad arguments
    CONFIG = 3  # unusable configuration: file, token, TLS, listen address
    LEASE = 4  # socket or journal held by another live ttyserve
    UNAVAILABLE = 5  # this platform cannot serve


class ExecExit(enum.IntEnum):
    """Exit codes of `ttyserve exec` and `attach` beyond the remote status 0..125
    (contracts.md)."""

    DETACHED = 0  # the session goes on: detached (the key, or another client stole it)
    CANNOT_EXECUTE = 126  # spawn errno EACCES or ENOEXEC
    NOT_FOUND = 127  # spawn errno ENOENT
    SIGNAL_BASE = 128  # 128 + S for a remote death by signal S
    INTERRUPTED = 130  # a second SIGINT cancelled the session
    FAILURE = 255  # ttyserve itself failed, or the remote status is unknown


class RecordingExit(enum.IntEnum):
    """Exit codes of `ttyserve recording convert` (contracts.md)."""

    OK = 0  # converted (a cut last line, what a crash leaves, dropped with a warning)
    NOT_CONVERTED = 2  # bad arguments, FILE not a recording or unreadable, OUT not writable


def signal_name(signum: int) -> str:
    """`KILL` for 9: the name without its `SIG` prefix, or the number as text."""
    try:
        return signal.Signals(signum).name.removeprefix("SIG")
    except ValueError:
        return str(signum)


def exit_from_wait_status(status: int) -> Exit:
    """The wire `exit` for a raw status from waitpid()."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        return Exit(code=-signum, signal=signal_name(signum), core_dumped=os.WCOREDUMP(status))
    return Exit(code=os.waitstatus_to_exitcode(status))


def exit_from_wait_error(error: BaseException) -> Exit:
    """The wire `exit` when waiting for the process failed (ECHILD, ...)."""
    return Exit(code=WAIT_FAILED, error=f"waitpid failed: {error}")


def exec_exit_code(status: Exit) -> int:
    """What `ttyserve exec` exits with for a remote `exit` message."""
    if status.error is not None:
        return ExecExit.FAILURE
    if status.code < 0:
        return ExecExit.SIGNAL_BASE + (-status.code)
    return status.code & 0xFF


def exec_spawn_failure_code(errno: int | None) -> int:
    """What `ttyserve exec` exits with when the remote spawn failed with ``errno``."""
    if errno == errnos.ENOENT:
        return ExecExit.NOT_FOUND
    if errno in (errnos.EACCES, errnos.ENOEXEC, errnos.EPERM):
        return ExecExit.CANNOT_EXECUTE
    return ExecExit.FAILURE
