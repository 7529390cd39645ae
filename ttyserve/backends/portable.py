"""The portable backend: PTYs through ptyprocess, pipes through subprocess.

For platforms whose posix_spawn lacks what the fast path needs (glibc before
2.29 has no chdir file action; macOS). Only the start differs: the handles,
the reaping (a pidfd where there is one, else polling) and the adoption of
orphans are the fast path's (local.py), and so are the cwd and PATH checks,
so spawn errors carry the same errno. What this path cannot guarantee:

- Python code runs in the forked child before exec (ptyprocess forks in
  Python; a preexec_fn turns off subprocess's vfork). A child forked while
  another thread holds a lock (the import lock, logging's, malloc's) can hang
  before exec, so the server must not run other threads while it spawns.
- Signal dispositions and the mask are reset in the child by that Python code,
  one signal at a time, not by libc; a signal arriving in between sees the old
  disposition.
- Under a PTY, argv[0] becomes the resolved path of the command (ptyprocess
  replaces it); in pipe mode it is kept.
- A cwd that vanishes between our check and the child's chdir is reported by
  exception type (ptyprocess does not pass the errno), mapped back to ENOENT,
  EACCES or ENOTDIR.
- fork copies the server's page tables: a start costs more, as the server grows,
  than the fast path's vfork-style one.
- Without pidfds (Linux before 5.3, macOS) an exit is seen by polling, at most
  watch.POLL_MAX late; the orphan subreaper is Linux-only, as on the fast path.
"""

from __future__ import annotations

import errno as errnos
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import ptyprocess  # type: ignore[import-untyped]  # no type information shipped

from ..errors import SpawnError
from ..protocol.messages import Exit
from .base import ProcessSpec
from .cgroups import Containment
from .local import ChildBackend
from .watch import WatchFactory, open_exit_watch

_RESETTABLE = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
# ptyprocess passes the errno of a failed exec, but only the class of an exception
# raised by preexec_fn: our chdir there.
_CLASS_ERRNO: dict[type[OSError], int] = {
    FileNotFoundError: errnos.ENOENT,
    PermissionError: errnos.EACCES,
    NotADirectoryError: errnos.ENOTDIR,
}


def reset_signals() -> None:
    """In the child: every disposition to default, then an empty mask (what
    POSIX_SPAWN_SETSIGDEF and POSIX_SPAWN_SETSIGMASK do on the fast path)."""
    for signum in _RESETTABLE:
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # a signal libc keeps for itself
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _env_mapping(entries: Sequence[bytes]) -> dict[bytes, bytes]:
    """`KEY=VALUE` entries as a mapping, split at the first `=` as getenv() reads them."""
    env: dict[bytes, bytes] = {}
    for entry in entries:
        key, _, value = entry.partition(b"=")
        env[key] = value
    return env


def _kill_and_reap(pid: int) -> None:
    """For a child whose start failed half-way: it is dead or dies now, so waiting is brief."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class _Adopted(ptyprocess.PtyProcess):  # type: ignore[misc]  # an untyped base
    """What ptyprocess's spawn builds: only the pid and the master, which we own.

    ptyprocess's own object wraps the master in a file object, and its close()
    and __del__ sleep, kill and reap the child; ours is born closed, so neither
    ever runs. ``started`` (one list per spawn) keeps the pid and master even
    when spawn fails after the fork.
    """

    started: list[tuple[int, int]]

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.closed = True
        self.started.append((pid, fd))


def start_on_terminal(executable: str, argv: Sequence[str], env: Mapping[bytes, bytes],
                      cwd: str, rows: int, cols: int) -> tuple[int, int]:
    """Start ``executable`` as the leader of a new session on a new PTY; (pid, master).

    Raises SpawnError with the errno of a failed exec or chdir.
    """
    started: list[tuple[int, int]] = []
    adopted: Any = type("_AdoptedChild", (_Adopted,), {"started": started})
    encoded_cwd = os.fsencode(cwd)

    def enter_child() -> None:
        os.chdir(encoded_cwd)
        reset_signals()

    parent = os.getpid()
    try:
        # The resolved path as argv[0]: ptyprocess would look a bare name up in the
        # server's PATH, not the session's.
        adopted.spawn([executable, *argv[1:]], env=dict(env), preexec_fn=enter_child,
                      dimensions=(rows, cols))
    except BaseException as exc:
        if os.getpid() != parent:
            os._exit(127)  # ptyprocess's child failed before exec: never run the server's code
        for pid, fd in started:
            os.close(fd)
            _kill_and_reap(pid)
        if isinstance(exc, OSError) and not isinstance(exc, SpawnError):
            raise _spawn_error(exc, argv, cwd) from exc
        raise
    pid, master = started[0]
    os.set_inheritable(master, False)
    return pid, master


def _spawn_error(exc: OSError, argv: Sequence[str], cwd: str) -> SpawnError:
    if exc.errno:
        return SpawnError(exc.errno, f"{argv[0]}: {os.strerror(exc.errno)}")
    code = _CLASS_ERRNO.get(type(exc), errnos.EIO)  # raised by enter_child's chdir
    return SpawnError(code, f"cwd {cwd!r}: {os.strerror(code)}")


def start_on_pipes(executable: str, argv: Sequence[str], env: Mapping[bytes, bytes], cwd: str,
                   stdio: tuple[int, int, int]) -> subprocess.Popen[bytes]:
    """Start ``executable`` with ``stdio`` as fds 0-2, leading a new session.

    Raises SpawnError with the errno of a failed exec or chdir (naming the cwd).
    """
    try:
        return subprocess.Popen(
            list(argv), executable=executable, stdin=stdio[0], stdout=stdio[1],
            stderr=stdio[2], cwd=cwd, env=env, close_fds=True, start_new_session=True,
            restore_signals=True, preexec_fn=reset_signals)
    except OSError as exc:
        code = exc.errno or errnos.EIO
        what = f"cwd {cwd!r}" if exc.filename == cwd else argv[0]
        raise SpawnError(code, f"{what}: {os.strerror(code)}") from exc
    except (ValueError, subprocess.SubprocessError) as exc:  # e.g. a NUL byte in argv
        raise SpawnError(errnos.EINVAL, f"{argv[0]}: {exc}") from exc


class PortableBackend(ChildBackend):
    """Children started by ptyprocess (PTY) and subprocess (pipes); see the module docstring.

    ``watch`` chooses how exits are noticed (tests force polling with watch.PollWatch).
    """

    def __init__(self, default_cwd: str | None = None, *,
                 watch: WatchFactory = open_exit_watch,
                 containment: Containment | None = None) -> None:
        super().__init__(default_cwd, watch=watch, containment=containment)
        # Kept until reaped: a Popen dropped with returncode None would be polled,
        # and our child reaped, by subprocess's _cleanup().
        self._popens: dict[int, subprocess.Popen[bytes]] = {}

    def _start_on_terminal(self, spec: ProcessSpec, executable: str, env: list[bytes],
                           cwd: str) -> tuple[int, int]:
        return start_on_terminal(executable, spec.argv, _env_mapping(env), cwd, spec.rows,
                                 spec.cols)

    def _start_on_pipes(self, spec: ProcessSpec, executable: str, env: list[bytes], cwd: str,
                        stdio: tuple[int, int, int]) -> int:
        popen = start_on_pipes(executable, spec.argv, _env_mapping(env), cwd, stdio)
        self._popens[popen.pid] = popen
        return popen.pid

    def _leader_reaped(self, pid: int, status: Exit) -> None:
        popen = self._popens.pop(pid, None)
        if popen is not None:
            popen.returncode = status.code  # reaped by us: Popen never waits for the pid again
        super()._leader_reaped(pid, status)
