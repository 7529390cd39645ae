"""The status table: wait status -> wire `exit` -> `ttyserve exec` exit code."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from ttyserve.exitcodes import (
    ExecExit,
    exec_exit_code,
    exec_spawn_failure_code,
    exit_from_wait_error,
    exit_from_wait_status,
)
from ttyserve.protocol.messages import Exit


def test_normal_exit_codes() -> None:
    for code in (0, 1, 7, 255):
        assert exit_from_wait_status(code << 8) == Exit(code=code)


def test_signal_death_carries_name_and_core_flag() -> None:
    assert exit_from_wait_status(signal.SIGKILL) == Exit(code=-9, signal="KILL", core_dumped=False)
    dumped = exit_from_wait_status(signal.SIGSEGV | 0x80)
    assert dumped == Exit(code=-11, signal="SEGV", core_dumped=True)
    assert exit_from_wait_status(signal.SIGHUP) == Exit(code=-1, signal="HUP", core_dumped=False)


def test_wait_failure_is_minus_one_with_error() -> None:
    status = exit_from_wait_error(ChildProcessError(errno.ECHILD, os.strerror(errno.ECHILD)))
    assert status.code == -1 and status.signal is None and "waitpid failed" in str(status.error)


@pytest.mark.parametrize("status, code", [
    (Exit(code=0), 0),
    (Exit(code=7), 7),
    (Exit(code=126), 126),
    (Exit(code=-9, signal="KILL", core_dumped=False), 137),
    (Exit(code=-1, signal="HUP", core_dumped=False), 129),
    (Exit(code=-1, error="waitpid failed"), ExecExit.FAILURE),
])
def test_exec_exit_code(status: Exit, code: int) -> None:
    assert exec_exit_code(status) == code


def test_spawn_failure_codes() -> None:
    assert exec_spawn_failure_code(errno.ENOENT) == 127
    assert exec_spawn_failure_code(errno.EACCES) == 126
    assert exec_spawn_failure_code(errno.ENOEXEC) == 126
    assert exec_spawn_failure_code(errno.EMFILE) == 255
