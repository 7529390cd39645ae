"""Start a child with posix_spawn(3): no Python-side fork, exec errors as errno.

Why not subprocess or ptyprocess: a PTY child needs a new session that
acquires the terminal as its controlling terminal before exec, the session's
cwd, every signal disposition and the signal mask reset to defaults (a server
under `nohup` must not hand out an ignored SIGHUP), and exec failures reported
with their errno. glibc's posix_spawn does all of that in a vfork-style child
that runs no Python code, so it is safe in a threaded process and fast; os.posix_spawn
lacks only the chdir file action, so we call libc directly.

Descriptors: with glibc 2.34+ the child closes every descriptor from 3 up
(posix_spawn_file_actions_addclosefrom_np). With glibc 2.29-2.33 only those
marked close-on-exec are closed at exec; Python opens every descriptor that
way (PEP 446), so only one made inheritable on purpose (os.set_inheritable)
would reach the child there. `closes_every_descriptor` says which holds.
"""

from __future__ import annotations

import ctypes
import errno as errnos
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import SpawnError

# glibc <spawn.h> flag values (Linux).
_SETSIGDEF = 0x04
_SETSIGMASK = 0x08
_SETSID = 0x80
# Opaque glibc types, over-allocated: posix_spawnattr_t is 336 bytes and
# posix_spawn_file_actions_t 80 bytes on x86-64; sigset_t is 128 bytes.
_OPAQUE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class Stdio:
    """What the child gets as fds 0, 1, 2: either a terminal path or three fds."""

    tty_path: str | None = None
    fds: tuple[int, int, int] | None = None


_P = ctypes.c_void_p  # posix_spawnattr_t *, posix_spawn_file_actions_t *, sigset_t *
_INT = ctypes.c_int
# The prototype of every libc function called here: (argument types, result type).
_PROTOTYPES: dict[str, tuple[list[Any], Any]] = {
    "posix_spawn": ([ctypes.POINTER(_INT), ctypes.c_char_p, _P, _P,
                     ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)], _INT),
    "posix_spawnp": ([ctypes.POINTER(_INT), ctypes.c_char_p, _P, _P,
                      ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)], _INT),
    "posix_spawn_file_actions_init": ([_P], _INT),
    "posix_spawn_file_actions_destroy": ([_P], _INT),
    "posix_spawn_file_actions_addchdir_np": ([_P, ctypes.c_char_p], _INT),
    "posix_spawn_file_actions_addopen": ([_P, _INT, ctypes.c_char_p, _INT, ctypes.c_uint], _INT),
    "posix_spawn_file_actions_adddup2": ([_P, _INT, _INT], _INT),
    "posix_spawn_file_actions_addclosefrom_np": ([_P, _INT], _INT),  # glibc 2.34+
    "posix_spawnattr_init": ([_P], _INT),
    "posix_spawnattr_setsigdefault": ([_P, _P], _INT),
    "posix_spawnattr_setsigmask": ([_P, _P], _INT),
    "posix_spawnattr_setflags": ([_P, ctypes.c_short], _INT),
    "sigfillset": ([_P], _INT),
    "sigemptyset": ([_P], _INT),
}
_OPTIONAL = {"posix_spawn_file_actions_addclosefrom_np"}


def _load_libc() -> ctypes.CDLL | None:
    """glibc with every function above declared, or None where one that is needed lacks."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    for name, (argtypes, restype) in _PROTOTYPES.items():
        if not hasattr(libc, name):
            if name in _OPTIONAL:
                continue
            return None  # glibc before 2.29 has no addchdir_np
        function = getattr(libc, name)
        function.argtypes = argtypes
        function.restype = restype
    return libc


_libc = _load_libc()
_HAS_CLOSEFROM = _libc is not None and hasattr(_libc, "posix_spawn_file_actions_addclosefrom_np")


def spawn_supported() -> bool:
    """Whether this platform has the posix_spawn features the backends need."""
    return _libc is not None


def closes_every_descriptor() -> bool:
    """Whether `spawn` closes descriptors 3 and up even when inheritable (glibc 2.34+)."""
    return _HAS_CLOSEFROM


def _check(result: int, what: str) -> None:
    """posix_spawn* return an errno."""
    if result != 0:
        raise SpawnError(result, f"{what}: {os.strerror(result)}")


def _check_errno(result: int, what: str) -> None:
    """sigfillset and sigemptyset return -1 and set errno."""
    if result != 0:
        code = ctypes.get_errno()
        raise SpawnError(code, f"{what}: {os.strerror(code)}")


def resolve_executable(name: str, path: str, cwd: str) -> str:
    """Find argv[0] as execvp would for the session: its PATH, its cwd.

    Raises SpawnError(ENOENT) when nothing is found and SpawnError(EACCES)
    when only non-executable candidates exist.
    """
    if not name:
        raise SpawnError(errnos.ENOENT, "empty command name")
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d or ".", name) for d in path.split(os.pathsep)]
    denied = False
    for candidate in candidates:
        full = candidate if os.path.isabs(candidate) else os.path.join(cwd, candidate)
        try:
            st = os.stat(full)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(full, os.X_OK):
            return full
        denied = True
    if denied:
        raise SpawnError(errnos.EACCES, f"{name}: Permission denied")
    raise not_found(name)


def not_found(name: str) -> SpawnError:
    """A command that no PATH entry holds (or no file at its path)."""
    return SpawnError(errnos.ENOENT, f"{name}: command not found")


def check_cwd(cwd: str) -> None:
    """Refuse a cwd the child could not enter, naming it."""
    try:
        st = os.stat(cwd)
    except OSError as exc:
        raise SpawnError(exc.errno or errnos.ENOENT, f"cwd {cwd!r}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise SpawnError(errnos.ENOTDIR, f"cwd {cwd!r}: Not a directory")
    if not os.access(cwd, os.X_OK):
        raise SpawnError(errnos.EACCES, f"cwd {cwd!r}: Permission denied")


def encode_environment(env: Mapping[str, str]) -> list[bytes]:
    """`KEY=VALUE` entries, as execve wants them."""
    return [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]


def spawn(
    executable: str, argv: Sequence[str], env: Sequence[bytes], cwd: str, stdio: Stdio
) -> int:
    """Start ``executable`` in a new session with default signals; return its pid.

    ``env`` holds `KEY=VALUE` entries (see `encode_environment`).
    With ``stdio.tty_path`` the child opens the terminal as fds 0-2 after
    setsid(), which makes it the controlling terminal. Descriptors from 3 up are
    closed in the child where glibc has addclosefrom_np; elsewhere only those
    marked close-on-exec are (see the module docstring). An ``executable`` with
    no slash is looked for on this process's PATH by the child, as execvp does
    (posix_spawnp). Raises SpawnError with the errno of a failed exec or chdir.
    """
    if _libc is None:
        raise SpawnError(errnos.ENOSYS, "posix_spawn with chdir is not available here")
    libc = _libc
    attr = _attributes(libc)
    actions = ctypes.create_string_buffer(_OPAQUE_SIZE)
    _check(libc.posix_spawn_file_actions_init(actions), "file actions")
    try:
        _check(libc.posix_spawn_file_actions_addchdir_np(actions, os.fsencode(cwd)), "chdir")
        if stdio.tty_path is not None:
            _check(libc.posix_spawn_file_actions_addopen(
                actions, 0, os.fsencode(stdio.tty_path), os.O_RDWR, 0), "open tty")
            _check(libc.posix_spawn_file_actions_adddup2(actions, 0, 1), "dup2")
            _check(libc.posix_spawn_file_actions_adddup2(actions, 0, 2), "dup2")
        else:
            assert stdio.fds is not None
            for target, fd in enumerate(stdio.fds):
                _check(libc.posix_spawn_file_actions_adddup2(actions, fd, target), "dup2")
        if _HAS_CLOSEFROM:
            _check(libc.posix_spawn_file_actions_addclosefrom_np(actions, 3), "closefrom")
        c_argv = (ctypes.c_char_p * (len(argv) + 1))(*[os.fsencode(a) for a in argv], None)
        c_env = (ctypes.c_char_p * (len(env) + 1))(*env, None)
        pid = ctypes.c_int(0)
        searched = "/" not in executable
        start = libc.posix_spawnp if searched else libc.posix_spawn
        result = start(ctypes.byref(pid), os.fsencode(executable), actions, attr, c_argv, c_env)
        if result != 0:
            name = argv[0] if argv else executable
            if searched and result == errnos.ENOENT:
                raise not_found(name)
            raise SpawnError(result, f"{name}: {os.strerror(result)}")
        return pid.value
    finally:
        libc.posix_spawn_file_actions_destroy(actions)


_attr: ctypes.Array[ctypes.c_char] | None = None


def _attributes(libc: ctypes.CDLL) -> ctypes.Array[ctypes.c_char]:
    """The spawn attributes, the same for every child: built once, read by posix_spawn."""
    global _attr
    if _attr is None:
        attr = ctypes.create_string_buffer(_OPAQUE_SIZE)
        sigset = ctypes.create_string_buffer(_OPAQUE_SIZE)
        _check(libc.posix_spawnattr_init(attr), "spawn attributes")
        _check_errno(libc.sigfillset(sigset), "sigfillset")
        _check(libc.posix_spawnattr_setsigdefault(attr, sigset), "signal defaults")
        _check_errno(libc.sigemptyset(sigset), "sigemptyset")
        _check(libc.posix_spawnattr_setsigmask(attr, sigset), "signal mask")
        _check(libc.posix_spawnattr_setflags(
            attr, ctypes.c_short(_SETSID | _SETSIGDEF | _SETSIGMASK)), "flags")
        _attr = attr
    return _attr
