"""Local processes and /proc: spawn under a PTY or pipes, read CPU, memory and descriptors.

Used by the raw-limit measurements (no server in between) and by the asyncssh
peer's server process, so that both start commands the way ttyserve does: with
posix_spawn, in a new session, the terminal as the controlling terminal.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import resource
import signal
import struct
import termios
import time
from dataclasses import dataclass
from pathlib import Path

READ_SIZE = 256 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (children inherit it); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def session_env(term: str | None = None) -> dict[str, str]:
    """This process's environment, with TERM for a terminal session."""
    env = dict(os.environ)
    if term is not None:
        env["TERM"] = term
    return env


def set_window_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def spawn_pty(argv: list[str], rows: int = 24, cols: int = 80,
              term: str = "xterm-256color") -> tuple[int, int]:
    """Start ``argv`` on a new PTY as its controlling terminal; return (pid, master fd)."""
    master, slave = os.openpty()
    try:
        set_window_size(slave, rows, cols)
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.ttyname(slave), os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1),
            (os.POSIX_SPAWN_DUP2, 0, 2),
        ]
        pid = os.posix_spawnp(argv[0], argv, session_env(term), file_actions=actions,
                              setsid=True)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return pid, master


@dataclass
class PipeChild:
    """A child whose stdin, stdout and stderr are pipes held by us."""

    pid: int
    stdin: int
    stdout: int
    stderr: int

    def close(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)


def spawn_pipes(argv: list[str]) -> PipeChild:
    """Start ``argv`` in its own session with three pipes as stdio."""
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    child_ends = (stdin_r, stdout_w, stderr_w)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(child_ends)]
        pid = os.posix_spawnp(argv[0], argv, session_env(), file_actions=actions, setsid=True)
    except BaseException:
        for fd in (stdin_w, stdout_r, stderr_r):
            os.close(fd)
        raise
    finally:
        for fd in child_ends:
            os.close(fd)
    return PipeChild(pid, stdin_w, stdout_r, stderr_r)


def read_to_eof(fd: int, size: int = READ_SIZE) -> int:
    """Blocking reads until end-of-file (EIO on a PTY master counts as one); bytes read."""
    total = 0
    read = os.read
    while True:
        try:
            chunk = read(fd, size)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return total
            raise
        if not chunk:
            return total
        total += len(chunk)


def read_until(fd: int, marker: bytes) -> bytes:
    """Blocking reads until ``marker`` has been seen; everything read."""
    data = b""
    while marker not in data:
        chunk = os.read(fd, 4096)
        if not chunk:
            raise EOFError(f"end of output before {marker!r}")
        data += chunk
    return data


def wait_status(pid: int) -> int:
    """Reap ``pid``; its exit code, or -N for a death by signal N."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def reap_quietly(pid: int, timeout: float = 5.0) -> None:
    """Hang up ``pid``'s group, kill it if it lingers, and reap it."""
    kill_group(pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if time.monotonic() > deadline:
            kill_group(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return
        time.sleep(0.005)


# --- /proc ------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat", encoding="ascii") as file:
        text = file.read()
    return text[text.rindex(")") + 2:].split()  # fields from the 3rd (state) on


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` itself (not of its children), in seconds."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14, 15


def parent_pid(pid: int) -> int:
    return int(_stat_fields(pid)[1])


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid: int) -> int:
    """Open descriptors of ``pid`` (entries of /proc/PID/fd)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def children(pid: int) -> list[int]:
    """The live children of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_pid(int(entry)) == pid:
                    found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def is_server(pid: int) -> bool:
    """Whether ``pid`` runs `ttyserve serve` (a worker, beside its supervisor)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"ttyserve" in b" ".join(argv) and b"serve" in argv


def command_name(pid: int) -> str:
    with open(f"/proc/{pid}/comm", encoding="utf-8") as file:
        return file.read().strip()


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (a scan of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            children.setdefault(parent_pid(int(entry)), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@dataclass(frozen=True)
class Usage:
    """What a server holds at one moment: resident memory and open descriptors."""

    rss_kib: int | None
    fds: int

    @staticmethod
    def of(pids: list[int]) -> Usage:
        return Usage(sum(rss_kib(pid) for pid in pids), sum(fd_count(pid) for pid in pids))
