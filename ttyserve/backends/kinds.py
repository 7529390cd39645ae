"""Which backend starts the processes: the kinds a server can be asked for, and whether
each can serve here.

    posix_spawn  the fast path (local.py): glibc 2.29+ on Linux, no Python in the child
    portable     ptyprocess and subprocess (portable.py): any POSIX system with PTYs
    auto         posix_spawn where spawn_supported(), else portable
"""

from __future__ import annotations

import os
from typing import Literal, get_args

from .cgroups import Containment
from .local import ChildBackend, LocalBackend
from .spawn import spawn_supported

BackendKind = Literal["auto", "posix_spawn", "portable"]
BACKEND_KINDS: tuple[str, ...] = get_args(BackendKind)


def resolve_kind(kind: str) -> str:
    """``kind`` with "auto" decided for this platform; raises ValueError for an unknown kind."""
    if kind not in BACKEND_KINDS:
        raise ValueError(f"unknown backend {kind!r}; expected one of {', '.join(BACKEND_KINDS)}")
    if kind == "auto":
        return "posix_spawn" if spawn_supported() else "portable"
    return kind


def unavailable_reason(kind: str) -> str | None:
    """Why ``kind`` cannot serve here (a server exits 5 then), or None when it can.

    Raises ValueError for an unknown kind.
    """
    kind = resolve_kind(kind)
    if kind == "posix_spawn" and not spawn_supported():
        return "posix_spawn lacks posix_spawn_file_actions_addchdir_np here (glibc 2.29+ needed)"
    if kind == "portable":
        if os.name != "posix":
            return "the portable backend needs a POSIX system"
        try:
            from . import portable  # noqa: F401  # ptyprocess, termios, fcntl
        except ImportError as exc:
            return f"the portable backend cannot be loaded: {exc}"
    return _pty_missing()


def _pty_missing() -> str | None:
    """Whether a pseudo-terminal can be opened at all (no /dev/ptmx in some containers)."""
    try:
        master, slave = os.openpty()
    except OSError as exc:
        return f"no pseudo-terminals here: {exc.strerror}"
    os.close(master)
    os.close(slave)
    return None


def make_backend(kind: str, default_cwd: str | None = None,
                 containment: Containment | None = None) -> ChildBackend:
    """A backend of ``kind`` (see BACKEND_KINDS), starting each session in a cgroup of its
    own under ``containment``; ask `unavailable_reason` first.

    Raises ValueError for an unknown kind.
    """
    if resolve_kind(kind) == "posix_spawn":
        return LocalBackend(default_cwd, containment=containment)
    from .portable import PortableBackend  # imports ptyprocess only when chosen

    return PortableBackend(default_cwd, containment=containment)
