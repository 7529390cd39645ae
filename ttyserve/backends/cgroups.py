"""One cgroup v2 per session: entered before the process runs, killed as a whole, limited.

Entry: the server moves itself into the session's new cgroup, starts the child
there (posix_spawn or fork: a child is born in its parent's cgroup), and moves
back. The child never runs an instruction outside its cgroup, so nothing it
forks can escape. (clone3's CLONE_INTO_CGROUP would spare the two moves, and with
them the wait a quiet host's first move pays; Python cannot call it without running
Python code in the child, and glibc's posix_spawn offers it from 2.39 on.) The cost is
measured in docs/containment.md.

Layout: under a base (`--cgroup DIR`, or a `ttyserve` child of the server's own
cgroup), each server has a directory of its own, named by its pid and start
time, so servers never share one and a dead server's can be told from a live
one's. In it: one cgroup per session, named by its id, and, when limits are
set, `server`, the leaf the server itself lives in (cgroup v2 hands
controllers to the children of a cgroup only while it holds no process).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anyio

from ..errors import ConfigError
from .groups import process_start_time

log = logging.getLogger("ttyserve")

BASE_NAME = "ttyserve"  # auto: the base is this child of the server's own cgroup
SERVER_LEAF = "server"  # the server's own leaf, when limits are set
CPU_PERIOD = 100_000  # µs: cpu.max's period for --session-cpu-max
EMPTY_POLL_FIRST = 0.001  # seconds: how a wait for an empty cgroup polls, doubling...
EMPTY_POLL_MAX = 0.05  # ...up to this
LEFT_SWEEP = 1.0  # seconds between looks at cgroups whose leftovers were left running
_INSTANCE = re.compile(r"(\d+)-(\d+)")  # a server's directory: PID-STARTTIME
# The server's threads count toward a session's pids.max while it spawns in its cgroup (up
# to anyio's 40 worker threads): a lower limit would refuse spawns now and then.
MIN_PIDS_MAX = 64
GONE = (errno.ENOENT, errno.ENODEV)  # a cgroup removed, or being removed, when its file is read


@dataclass(frozen=True, slots=True)
class Limits:
    """What each session's cgroup may use; None: no limit."""

    memory_max: int | None = None  # bytes
    pids_max: int | None = None
    cpu_max: float | None = None  # CPUs

    def files(self) -> dict[str, str]:
        """Each limit as the cgroup file that sets it, and what is written there."""
        files = {}
        if self.memory_max is not None:
            files["memory.max"] = str(self.memory_max)
        if self.pids_max is not None:
            files["pids.max"] = str(self.pids_max)
        if self.cpu_max is not None:
            files["cpu.max"] = f"{max(1000, round(self.cpu_max * CPU_PERIOD))} {CPU_PERIOD}"
        return files

    def controllers(self) -> list[str]:
        """The controllers the limits need, in the order of `files`."""
        return [name.split(".")[0] for name in self.files()]


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def cgroup2_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on a
    hybrid system), or None where there is none."""
    try:
        text = _read("/proc/self/mountinfo")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        separator = fields.index("-") if "-" in fields else -1
        if separator > 0 and fields[separator + 1] == "cgroup2":
            return fields[4].replace("\\040", " ")
    return None


def cgroup_of(pid: int | str = "self") -> str | None:
    """The directory of ``pid``'s cgroup v2 (this process's by default), or None where it
    has none (or is gone)."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    try:
        text = _read(f"/proc/{pid}/cgroup")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            path = line[3:].removesuffix(" (deleted)")
            return os.path.normpath(mount + path)
    return None


def own_cgroup() -> str | None:
    """The directory of this process's cgroup v2, or None where it has none."""
    return cgroup_of()


def _count(directory: str) -> int:
    """The processes in ``directory`` and every cgroup below it."""
    count = 0
    for top, _, _ in os.walk(directory):
        try:
            count += len(_read(os.path.join(top, "cgroup.procs")).split())
        except OSError:
            continue  # removed meanwhile
    return count


def populated(directory: str) -> bool:
    """Whether a process lives in ``directory`` or below (its `cgroup.events`)."""
    try:
        return "populated 1" in _read(os.path.join(directory, "cgroup.events"))
    except OSError as exc:
        if exc.errno in GONE:
            return False
        raise


def remove_tree(directory: str) -> bool:
    """rmdir ``directory`` and every cgroup below it, deepest first; whether it is gone
    (a populated one stays, with what is above it)."""
    gone = True
    for top, _, _ in os.walk(directory, topdown=False):
        try:
            os.rmdir(top)
        except FileNotFoundError:
            pass
        except OSError:
            gone = False
    return gone


def kill_tree(directory: str) -> int:
    """SIGKILL every process in ``directory`` and below, at once (`cgroup.kill`, Linux
    5.14, which forks cannot race); how many there were."""
    count = _count(directory)
    if count:
        _write(os.path.join(directory, "cgroup.kill"), "1")
    return count


async def until_empty(directory: str, timeout: float) -> bool:
    """Wait until no process lives in ``directory`` (zombies do not count); whether it
    emptied within ``timeout``. (cgroup.events is pollable only for POLLPRI, which anyio
    cannot wait for: it is polled, 1 ms doubling to 50 ms; killed processes go in ~1 ms.)"""
    delay = 0.0
    deadline = time.monotonic() + timeout
    while populated(directory):
        if time.monotonic() >= deadline:
            return False
        await anyio.sleep(delay)
        delay = min(max(delay * 2, EMPTY_POLL_FIRST), EMPTY_POLL_MAX)
    return True


class SessionCgroup:
    """One session's cgroup: what its process tree runs in."""

    def __init__(self, path: str, containment: Containment) -> None:
        self.path = path
        self._containment = containment

    def populated(self) -> bool:
        return populated(self.path)

    def kill(self) -> int:
        """`kill_tree`; how many processes were killed."""
        try:
            return kill_tree(self.path)
        except FileNotFoundError:
            return 0

    async def until_empty(self, timeout: float) -> bool:
        return await until_empty(self.path, timeout)

    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process here (memory.events `oom_kill`)."""
        if self._containment.limits.memory_max is None:
            return False
        try:
            text = _read(os.path.join(self.path, "memory.events"))
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return value.strip() != "0"
        return False

    def removed(self) -> bool:
        """Remove the directory if nothing is left in it (the common end: one rmdir); whether
        it is gone."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: populated, or holding cgroups of its own
            return False
        return True

    def remove(self) -> None:
        """Remove the directory; one still populated (leftovers left, or not dead yet) is
        removed by the containment once it empties."""
        if not remove_tree(self.path):
            self._containment.left.add(self.path)


class Containment:
    """This server's cgroups: its directory, the cgroup it returns to after each spawn, the
    limits every session gets, and the directories of leftovers left running."""

    def __init__(self, root: str, home: str, limits: Limits) -> None:
        self.root = root  # this server's directory
        self.home = home  # the cgroup the server lives in
        self.limits = limits
        self.left: set[str] = set()  # session cgroups removed once they empty
        self._home_procs = os.open(os.path.join(home, "cgroup.procs"),
                                   os.O_WRONLY | os.O_CLOEXEC)

    def create(self, name: str) -> SessionCgroup:
        """A new cgroup for a session, with the limits. Raises OSError."""
        path = os.path.join(self.root, name)
        os.mkdir(path)
        try:
            for file, value in self.limits.files().items():
                _write(os.path.join(path, file), value)
        except OSError:
            os.rmdir(path)
            raise
        return SessionCgroup(path, self)

    @contextlib.contextmanager
    def entered(self, cgroup: SessionCgroup) -> Iterator[None]:
        """The server runs in ``cgroup`` within the block: a child started there is born in
        it. Raises OSError when the server cannot move."""
        _write(os.path.join(cgroup.path, "cgroup.procs"), "0")
        try:
            yield
        finally:
            os.write(self._home_procs, b"0")

    def sweep_left(self) -> None:
        """Remove the session cgroups whose leftovers have all gone."""
        for path in list(self.left):
            if remove_tree(path):
                self.left.discard(path)

    async def tend(self) -> None:
        """`sweep_left` every LEFT_SWEEP seconds, until cancelled."""
        while True:
            await anyio.sleep(LEFT_SWEEP)
            self.sweep_left()

    def close(self) -> None:
        """Remove this server's directory where it is empty (the server's own leaf stays
        while the server lives in it), and the base when no other server uses it."""
        os.close(self._home_procs)
        self.sweep_left()
        base = os.path.dirname(self.root)
        for path in (self.root, base):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def instance_name(pid: int | None = None) -> str | None:
    """This server's directory name, PID-STARTTIME; None where /proc does not say."""
    pid = os.getpid() if pid is None else pid
    started = process_start_time(pid)
    return None if started is None else f"{pid}-{started}"


def server_gone(directory: str) -> bool:
    """Whether ``directory`` is the directory of a server (PID-STARTTIME) that is gone: or
    of a worker of one (`serve --workers`: SUPERVISOR/WORKER), whose supervisor is gone
    (the worker dies with it, and may not have yet)."""
    match = _INSTANCE.fullmatch(os.path.basename(directory))
    if match is None or not os.path.isdir(directory):
        return False
    if process_start_time(int(match[1])) != int(match[2]):
        return True
    above = _INSTANCE.fullmatch(os.path.basename(os.path.dirname(directory)))
    return above is not None and process_start_time(int(above[1])) != int(above[2])


def sweep_dead_servers(base: str) -> list[str]:
    """Remove what servers that are gone left under ``base``: their empty cgroups. A
    populated one (leftovers left running, or sessions of a server that died without a
    journal to say so) stays; the directories of those that stay."""
    kept: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return kept
    for name in names:
        path = os.path.join(base, name)
        if not server_gone(path):
            continue
        for child in os.listdir(path):
            child_path = os.path.join(path, child)
            if os.path.isdir(child_path) and not remove_tree(child_path):
                kept.append(child_path)
        with contextlib.suppress(OSError):
            os.rmdir(path)
    return kept


def _controllers(directory: str) -> set[str]:
    try:
        return set(_read(os.path.join(directory, "cgroup.controllers")).split())
    except OSError:
        return set()


def _check_available(directory: str, controllers: list[str]) -> None:
    """ConfigError naming the first of ``controllers`` that ``directory`` cannot hand on."""
    have = _controllers(directory)
    missing = [c for c in controllers if c not in have]
    if missing:
        raise ConfigError(
            f"the {missing[0]} controller is not available in cgroup {directory} (it has: "
            f"{' '.join(sorted(have)) or 'none'}): --session-{missing[0]}-max cannot be "
            "enforced")


def _enable(directory: str, controllers: list[str]) -> None:
    """Hand ``controllers`` to the children of ``directory``. Raises ConfigError."""
    _check_available(directory, controllers)
    try:
        _write(os.path.join(directory, "cgroup.subtree_control"),
               " ".join("+" + c for c in controllers))
    except OSError as exc:
        why = ("it holds processes besides this server (cgroup v2's no-internal-process "
               "rule; run the server in a cgroup of its own, e.g. a systemd unit with "
               "Delegate=yes)" if exc.errno == errno.EBUSY else exc.strerror)
        raise ConfigError(f"cannot enable {' '.join(controllers)} for the sessions in "
                          f"{directory}: {why}") from None


class Unavailable(Exception):
    """Containment cannot be on here (auto goes on without it); the message says why."""


def open_containment(setting: str, limits: Limits) -> Containment:
    """This server's containment for ``setting`` (`auto` or a directory). Raises
    Unavailable when there is no writable cgroup v2 (fatal for a directory named or with
    limits: the caller decides), ConfigError when the limits cannot be set."""
    home = own_cgroup()  # where the server returns after each spawn (without limits)
    if home is None:
        raise Unavailable("no cgroup v2 hierarchy is mounted, or this server is in none")
    if setting == "auto":
        base = os.path.join(home, BASE_NAME)
    else:
        base = os.path.abspath(setting)
        if not os.path.exists(os.path.join(os.path.dirname(base), "cgroup.procs")) and \
                not os.path.exists(os.path.join(base, "cgroup.procs")):
            raise Unavailable(f"{setting} is not in a cgroup v2 hierarchy")
    name = instance_name()
    if name is None:
        raise Unavailable("/proc does not give this server's start time")
    root = os.path.join(base, name)
    for attempt in range(3):
        try:
            os.makedirs(root, exist_ok=True)
            break
        except FileNotFoundError:  # another server removed the base as it left: again
            if attempt == 2:
                raise Unavailable(f"cannot create {root}: the base keeps vanishing") from None
        except OSError as exc:
            raise Unavailable(f"cannot create {root}: {exc.strerror}") from None
    if not os.path.exists(os.path.join(root, "cgroup.kill")):
        with contextlib.suppress(OSError):
            os.rmdir(root)
        raise Unavailable("this kernel has no cgroup.kill (Linux 5.14 or later is needed)")
    try:  # as each spawn will: into this server's directory and back
        _write(os.path.join(root, "cgroup.procs"), "0")
        _write(os.path.join(home, "cgroup.procs"), "0")
    except OSError as exc:
        raise Unavailable(f"cannot move between {home} and {root}: {exc.strerror}") from None
    controllers = limits.controllers()
    if controllers:
        home = _settle_in_leaf(base, root, home, controllers)
    return Containment(root, home, limits)


def _settle_in_leaf(base: str, root: str, home: str, controllers: list[str]) -> str:
    """With limits: move the server from ``home`` into a leaf of its own (ROOT/server), then
    hand the controllers down to the sessions' cgroups; the leaf. Raises ConfigError (the
    server back in ``home``)."""
    parent = os.path.dirname(base)
    _check_available(parent, controllers)  # before anything moves
    leaf = os.path.join(root, SERVER_LEAF)
    os.makedirs(leaf, exist_ok=True)
    _write(os.path.join(leaf, "cgroup.procs"), "0")
    try:
        for directory in (parent, base, root):
            _enable(directory, controllers)
    except ConfigError:
        with contextlib.suppress(OSError):
            _write(os.path.join(home, "cgroup.procs"), "0")
            os.rmdir(leaf)
        raise
    return leaf
