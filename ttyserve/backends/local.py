"""Processes on this host, under a PTY or plain pipes: the handles, and the posix_spawn backend.

Each child is awaited through a watch (a pidfd where the kernel has them: no
thread per child, unlike asyncio's default child watcher on 3.11), and every
descriptor is non-blocking and owned here until `aclose`. `ChildBackend` is
what every backend of children of this server shares (see portable.py).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import signal
import struct
import termios
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import anyio

from ..defaults import KILL_GRACE
from ..errors import SpawnError
from ..exitcodes import exit_from_wait_error, exit_from_wait_status
from ..protocol.messages import Exit
from ..transport.readiness import Watch, watch_readable
from ..transport.splice import CAN_SPLICE, buffered
from .base import ChildState, ProcessSpec
from .cgroups import Containment, SessionCgroup
from .groups import group_alive, signal_group
from .reaper import become_subreaper, reap_orphans, run_orphan_reaper
from .spawn import Stdio, check_cwd, resolve_executable, spawn
from .watch import ExitWatch, PidfdWatch, WatchFactory, open_exit_watch

PIPE_SIZE = 1 << 20  # what a busy output pipe grows to (fs.pipe-max-size by default)
_PIPE_DEFAULT = 64 * 1024
_CAN_GROW = hasattr(fcntl, "F_SETPIPE_SZ")  # Linux only
_SHORT_READ = 4095  # a PTY hands out at most ~4 KiB per read even when more is queued
_POLL = 0.02  # group members that are not our children can only be polled
log = logging.getLogger("ttyserve")

OnReaped = Callable[[int, Exit], None]  # (pid, status) of a session leader just reaped


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """TIOCSWINSZ: the kernel sends SIGWINCH to the terminal's foreground group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class FdSource:
    """Non-blocking reads from one descriptor; EIO (a PTY whose slave closed) is EOF, once
    a second read says it too: Linux may answer EIO while the last of the terminal's output
    is still on its way into the buffer a read takes from, and the next read waits for it
    (issue 38: 3 PTY sessions in 135,000 lost their last 1.6 to 5.7 KB; the read after the
    first EIO returned it).

    A pipe that fills up is grown once to PIPE_SIZE: fewer wake-ups for a
    process that writes a lot, no extra kernel memory for the many that do not
    (the per-user pipe budget is counted in full pipe sizes).
    """

    read = staticmethod(os.read)

    def __init__(self, fd: int, pipe: bool = False) -> None:
        self.fd = fd
        self.eof = False
        self._pipe = pipe
        self._growable = pipe and _CAN_GROW

    def _read(self, limit: int) -> bytes | None:
        """Up to ``limit`` bytes now; None when nothing is buffered."""
        chunks: list[bytes] = []
        size = 0
        ended = False  # a read said EIO: the next one says whether that was all
        while size < limit and not self.eof:
            try:
                chunk = self.read(self.fd, limit - size)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.EIO:
                    raise
                if not ended:
                    ended = True
                    continue
                chunk = b""
            if not chunk:
                self.eof = True
                break
            ended = False
            chunks.append(chunk)
            size += len(chunk)
            if len(chunk) < _SHORT_READ:
                break  # the pipe or terminal is empty for now: spare the EAGAIN read
        if not chunks:
            return b"" if self.eof else None
        if self._growable and size >= _PIPE_DEFAULT:
            self._grow()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _grow(self) -> None:
        self._growable = False
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass  # over the user's pipe budget: keep the default size

    @property
    def pipe(self) -> int | None:
        return self.fd if self._pipe and CAN_SPLICE else None

    def buffered(self, limit: int) -> int:
        size = buffered(self.fd)
        if self._growable and size >= _PIPE_DEFAULT:
            self._grow()
        return min(size, limit)

    @property
    def at_eof(self) -> bool:
        return self.eof

    async def wait_readable(self) -> None:
        """Raises anyio.ClosedResourceError if the process is closed meanwhile."""
        if not self.eof:
            await anyio.wait_readable(self.fd)

    def receive_nowait(self, limit: int) -> bytes:
        """Raises OSError on a read error other than a PTY's EIO (its end-of-file)."""
        return self._read(limit) or b""

    def watch(self, callback: Callable[[], None]) -> Watch | None:
        return watch_readable(self.fd, callback)


class LocalProcess:
    """A child of this server: reaping, signals, stdin. Subclasses add the stdio kind.

    ``live`` is the backend's set of unreaped session leaders (the orphan reaper
    leaves them alone); ``on_reaped`` is told the pid and status once, when they
    are known; ``sweep`` reaps the group's members that were orphaned to us (where
    we adopt orphans); ``watch`` makes what wakes `wait` (a pidfd, else polling).
    """

    def __init__(self, pid: int, stdin_fd: int | None, stdout: FdSource, stderr: FdSource | None,
                 live: set[int], on_reaped: OnReaped | None = None, *,
                 sweep: Callable[[], object] | None = None,
                 watch: WatchFactory = open_exit_watch, status: Exit | None = None) -> None:
        self.pid = pid
        self._live = live
        self._on_reaped = on_reaped
        self._sweep = sweep
        live.add(pid)
        self.stdout = stdout
        self.stderr = stderr
        self._stdin_fd: int | None = stdin_fd
        self._stdin_waited = False  # an input pump waited for stdin to take more
        self._status: Exit | None = None
        self._watch: ExitWatch | None = None
        self._watching = False  # a task waits on the watch now
        self._watched: anyio.Event | None = None  # made when a second task waits for that one
        self._closed = False
        self.cgroup: SessionCgroup | None = None  # its tree's, where the server contains it
        self.leftovers: int | None = None  # processes of its tree killed after it, once known
        self.oom: bool | None = None  # its cgroup's memory limit killed one of them, once known
        if status is not None:  # reaped before it was handed over
            self._reaped(status)
            return
        try:
            self._watch = watch(pid)
        except ProcessLookupError as exc:  # already reaped behind our back (SIGCHLD ignored)
            self._reaped(exit_from_wait_error(exc))

    # --- status -------------------------------------------------------------

    def _collect_status(self) -> int | None:
        """waitpid() without blocking: the raw status, or None while running."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return status if pid else None

    def _reaped(self, status: Exit) -> None:
        self._status = status
        self._live.discard(self.pid)
        if self._on_reaped is not None:
            self._on_reaped(self.pid, status)

    async def wait(self) -> Exit:
        while self._status is None:
            if self._watching:  # another task watches the child: wait until it is done
                self._watched = self._watched or anyio.Event()
                await self._watched.wait()
                continue
            self._watching = True
            try:
                assert self._watch is not None
                await self._watch.wait()
                self._poll()
            finally:
                self._watching = False
                watched, self._watched = self._watched, None
                if watched is not None:
                    watched.set()
        return self._status

    def _poll(self) -> None:
        """Reap the child if it has exited (without waiting)."""
        try:
            raw = self._collect_status()
        except OSError as exc:
            self._reaped(exit_from_wait_error(exc))
        else:
            if raw is not None:
                self._reaped(exit_from_wait_status(raw))

    def watch_exit(self, reaped: Callable[[Exit], None]) -> Watch | None:
        """Have the loop reap the child the moment it exits (its pidfd's readiness) and hand
        ``reaped`` its status; None where it cannot (no pidfd, no readiness callbacks, or
        reaped already): `wait` then. Stop the watch before awaiting `wait`."""
        fd = self._watch.fd if isinstance(self._watch, PidfdWatch) else None
        if fd is None or self._status is not None:
            return None

        def exited() -> None:
            self._poll()
            if self._status is not None:
                assert watch is not None
                watch.stop()
                reaped(self._status)

        watch = watch_readable(fd, exited)
        return watch

    @property
    def returned(self) -> bool:
        return self._status is not None

    @property
    def status(self) -> Exit | None:
        return self._status

    # --- control ------------------------------------------------------------

    def send_signal(self, signum: int) -> None:
        signal_group(self.pid, signum)

    def hang_up(self) -> bool:
        """What a terminal hang-up does: SIGHUP, then SIGCONT so stopped jobs see it.
        Whether the leader was still running (asked of the kernel without reaping it)."""
        running = self._status is None and self._running()
        signal_group(self.pid, signal.SIGHUP)
        signal_group(self.pid, signal.SIGCONT)
        return running

    def kill(self) -> None:
        if self.cgroup is not None:
            self.cgroup.kill()
        elif not self.returned or group_alive(self.pid):  # (its jobs, after it returned)
            signal_group(self.pid, signal.SIGKILL)

    def _running(self) -> bool:
        """Whether the child has not exited yet (a zombie has); it is not reaped here."""
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return info is None

    def resize(self, rows: int, cols: int) -> None:
        return None

    def terminal_flags(self) -> tuple[bool, bool] | None:
        return None  # (pipes: no terminal)

    def write_nowait(self, data: bytes | memoryview) -> int:
        fd = self._stdin_fd
        if fd is None:
            raise anyio.BrokenResourceError("stdin is closed")
        try:
            return os.write(fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def send_stdin(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self.write_nowait(view)
            if not written:
                assert self._stdin_fd is not None
                self._stdin_waited = True  # aclose must tell a waiter that it closed
                await anyio.wait_writable(self._stdin_fd)
            view = view[written:]

    async def send_eof(self) -> None:
        fd, self._stdin_fd = self._stdin_fd, None
        if fd is not None:
            anyio.notify_closing(fd)
            os.close(fd)

    async def end_group(self, grace: float = KILL_GRACE) -> Exit:
        """SIGHUP and SIGCONT to the group (a hang-up), SIGKILL after ``grace``; reap. In a
        cgroup, the SIGKILL goes to the whole cgroup (what left the group too), and the end
        waits until it is empty."""
        deadline = time.monotonic() + grace
        if not self.returned or group_alive(self.pid):  # (its jobs, after it returned)
            self.hang_up()
        with anyio.move_on_after(grace):
            await self.wait()
            while self._tree_alive() and time.monotonic() < deadline:
                self._sweep_orphans()  # members orphaned to us hold the group until reaped
                await anyio.sleep(_POLL)
        if self.cgroup is not None:
            await self.settle(kill=True)
            return await self.wait()
        signal_group(self.pid, signal.SIGKILL)
        status = await self.wait()
        with anyio.move_on_after(grace):  # killed members vanish once reaped
            while group_alive(self.pid):
                self._sweep_orphans()
                await anyio.sleep(_POLL)
        return status

    @property
    def cgroup_path(self) -> str | None:
        return self.cgroup.path if self.cgroup is not None else None

    def _tree_alive(self) -> bool:
        return self.cgroup.populated() if self.cgroup is not None else group_alive(self.pid)

    def settle_nowait(self, kill: bool) -> bool:
        """The process ended by itself and its output is over: what is left of its tree (its
        cgroup) is killed (``kill``) or left running. True when that is done now; False:
        await `settle`."""
        cgroup = self.cgroup
        if cgroup is None:
            return True
        oom = cgroup.oom_killed()  # (read before the rmdir takes memory.events away)
        gone = cgroup.removed()  # nothing was left: the common end, one rmdir
        if not gone and kill and cgroup.populated():
            return False
        self._cgroup_done(cgroup, 0, oom, gone)
        return True

    async def settle(self, kill: bool = True) -> None:
        """`settle_nowait`, waiting for the cgroup to empty after the kill."""
        cgroup = self.cgroup
        if cgroup is None or not kill:
            self.settle_nowait(kill)
            return
        with anyio.CancelScope(shield=True):
            killed = cgroup.kill()
            if not await cgroup.until_empty(KILL_GRACE):
                log.warning("cgroup %s: processes still alive %g s after cgroup.kill",
                            cgroup.path, KILL_GRACE)
            self._sweep_orphans()  # the killed are zombies of ours until reaped
        self._cgroup_done(cgroup, killed)

    def _cgroup_done(self, cgroup: SessionCgroup, killed: int, oom: bool | None = None,
                     gone: bool = False) -> None:
        """The tree is settled: what was killed and whether the memory limit did it counted,
        the directory removed (unless ``gone`` already)."""
        if self.cgroup is not cgroup:
            return  # settled by another way meanwhile (a cancel while it settled)
        self.cgroup = None
        self.leftovers = killed
        self.oom = cgroup.oom_killed() if oom is None else oom
        if not gone:
            cgroup.remove()

    def _sweep_orphans(self) -> None:
        if self._sweep is not None:
            self._sweep()

    def handover(self, dry: bool = False) -> ChildState:
        """What new code in this process needs to go on with the child; its descriptors are
        its from now on (made inheritable), and nothing here closes them. ``dry``: only
        what that would be, changing nothing."""
        pty = isinstance(self, PtyProcess)
        state = ChildState(pid=self.pid, pty=pty, output=self.stdout.fd,
                           stderr=self.stderr.fd if self.stderr is not None else None,
                           stdin=None if pty else self._stdin_fd, status=self._status,
                           cgroup=self.cgroup_path)
        if not dry:
            self._closed = True
            if self._watch is not None:
                self._watch.close()
            for fd in self._fds():
                os.set_inheritable(fd, True)
        return state

    async def aclose(self) -> None:
        if not self.returned or self.cgroup is not None:
            with anyio.CancelScope(shield=True):
                await self.end_group()
        self.release()

    def release(self) -> None:
        """Release the descriptors of a child that was reaped (idempotent)."""
        assert self.returned, "release() before the child was reaped: aclose() it"
        if self.cgroup is not None:  # its tree is left running (a session that was not over)
            self._cgroup_done(self.cgroup, 0)
        if not self._closed:
            self._closed = True
            if self._watch is not None:
                self._watch.close()
            stdin = self._stdin_fd
            if stdin is not None and self._stdin_waited:  # an input pump may wait to write
                anyio.notify_closing(stdin)
            # Nothing waits on the others now: the output is read from readiness callbacks
            # the session has stopped, or by pumps that ended with it.
            for fd in self._fds():
                os.close(fd)

    def _fds(self) -> list[int]:
        fds = {self.stdout.fd}
        if self.stderr is not None:
            fds.add(self.stderr.fd)
        if self._stdin_fd is not None:
            fds.add(self._stdin_fd)
        self._stdin_fd = None
        return sorted(fds)


class PipeProcess(LocalProcess):
    """stdin, stdout and stderr are three pipes; the process leads its own group."""


class PtyProcess(LocalProcess):
    """stdio is a terminal; the master is both the input and the output."""

    def __init__(self, pid: int, master: int, live: set[int],
                 on_reaped: OnReaped | None = None, *, sweep: Callable[[], object] | None = None,
                 watch: WatchFactory = open_exit_watch, status: Exit | None = None) -> None:
        super().__init__(pid, master, FdSource(master), None, live, on_reaped, sweep=sweep,
                         watch=watch, status=status)
        self._master = master

    def resize(self, rows: int, cols: int) -> None:
        set_window_size(self._master, rows, cols)

    def terminal_flags(self) -> tuple[bool, bool] | None:
        """Read from the master: on Linux it answers for the terminal's line discipline."""
        if self._closed:  # (its number may be another terminal's by now)
            return None
        try:
            flags = termios.tcgetattr(self._master)[3]
        except (OSError, termios.error):
            return None
        return bool(flags & termios.ECHO), bool(flags & termios.ICANON)

    def send_signal(self, signum: int) -> None:
        try:
            group = os.tcgetpgrp(self._master)
        except OSError:
            group = self.pid
        signal_group(group, signum)

    async def send_eof(self) -> None:
        veof = termios.tcgetattr(self._master)[6][termios.VEOF]
        await self.send_stdin(veof if isinstance(veof, bytes) else bytes([veof]))

    def _fds(self) -> list[int]:
        self._stdin_fd = None
        return [self._master]


class BaseEnvironment:
    """The server's environment, encoded once: a session's adds TERM and the client's env."""

    def __init__(self) -> None:
        self.entries = {k: k + b"=" + v for k, v in os.environb.items()}
        self.path = os.environ.get("PATH", os.defpath)

    def for_session(self, spec: ProcessSpec) -> tuple[list[bytes], str]:
        """The `KEY=VALUE` entries for ``spec``, and the PATH its command is looked up in."""
        extra = dict(spec.env)
        if spec.pty:
            extra.setdefault("TERM", spec.term)
        if not extra:
            return list(self.entries.values()), self.path
        entries = dict(self.entries)
        for key, value in extra.items():
            encoded = os.fsencode(key)
            entries[encoded] = encoded + b"=" + os.fsencode(value)
        return list(entries.values()), extra.get("PATH", self.path)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


class ChildBackend(ABC):
    """Runs sessions as children of this server; subclasses say how a child is started.

    Shared by every such backend: the cwd and PATH checks (so spawn errors carry
    the same errno), the environment, the set of live session leaders, and the
    reaping of orphans they leave behind.
    """

    pipe_process: type[PipeProcess] = PipeProcess
    pty_process: type[PtyProcess] = PtyProcess

    def __init__(self, default_cwd: str | None = None, *,
                 watch: WatchFactory = open_exit_watch,
                 containment: Containment | None = None) -> None:
        self.default_cwd = default_cwd or os.getcwd()
        self.containment = containment  # each session's tree in a cgroup of its own
        self.environment = BaseEnvironment()
        self.live: set[int] = set()  # session leaders not yet reaped
        self.watch = watch
        self._adopting = False
        self._names = itertools.count(1)  # cgroups of specs with no name

    async def reap_orphans(self) -> None:
        """Adopt and reap what sessions leave behind, until cancelled (see reaper.py)."""
        if become_subreaper():
            self._adopting = True
            try:
                await run_orphan_reaper(self.live)
            finally:
                self._adopting = False

    def _leader_reaped(self, pid: int, status: Exit) -> None:
        # A sweep stops at a leader that its session had not reaped yet; orphans queued
        # behind it are reaped now.
        self._sweep_orphans()

    def _sweep_orphans(self) -> None:
        """Reap orphans now, where this server adopts them (it is their subreaper): never
        another program's children, when the server is embedded in one."""
        if self._adopting:
            reap_orphans(self.live)

    def _prepare(self, spec: ProcessSpec) -> tuple[str, list[bytes], str]:
        cwd = spec.cwd or self.default_cwd
        check_cwd(cwd)
        env, path = self.environment.for_session(spec)
        return self._executable(spec.argv[0], path, cwd), env, cwd

    def _executable(self, name: str, path: str, cwd: str) -> str:
        """What the child executes for ``name``: found as execvp would, with the session's
        PATH and cwd (SpawnError when nothing is)."""
        return resolve_executable(name, path, cwd)

    async def spawn(self, spec: ProcessSpec) -> LocalProcess:
        """Start ``spec``; raises errors.SpawnError with an errno on failure."""
        return self.spawn_nowait(spec)

    def spawn_nowait(self, spec: ProcessSpec) -> LocalProcess:
        """`spawn`, which waits for nothing here (posix_spawn returns once the child runs),
        for callers that cannot wait (a connection's readiness callback)."""
        executable, env, cwd = self._prepare(spec)
        containment = self.containment
        if containment is None:
            return self._start(spec, executable, env, cwd)
        try:
            cgroup = containment.create(spec.name or f"{os.getpid()}.{next(self._names)}")
        except OSError as exc:
            raise SpawnError(exc.errno or errno.EIO, f"cannot create the session's cgroup: "
                             f"{exc.strerror}") from exc
        try:
            with containment.entered(cgroup):
                process = self._start(spec, executable, env, cwd)
        except BaseException:
            cgroup.remove()
            raise
        process.cgroup = cgroup
        return process

    def _start(self, spec: ProcessSpec, executable: str, env: list[bytes],
               cwd: str) -> LocalProcess:
        if not spec.pty:
            return self._spawn_pipe(spec, executable, env, cwd)
        pid, master = self._start_on_terminal(spec, executable, env, cwd)
        os.set_blocking(master, False)
        return self.pty_process(pid, master, self.live, self._leader_reaped,
                                sweep=self._sweep_orphans, watch=self.watch)

    def adopt(self, state: ChildState) -> LocalProcess:
        """A child that code before an upgrade started and handed over (`handover`)."""
        process: LocalProcess
        if state.pty:
            process = self.pty_process(state.pid, state.output, self.live, self._leader_reaped,
                                       sweep=self._sweep_orphans, watch=self.watch,
                                       status=state.status)
        else:
            assert state.stderr is not None
            process = self.pipe_process(state.pid, state.stdin, FdSource(state.output, pipe=True),
                                        FdSource(state.stderr, pipe=True), self.live,
                                        self._leader_reaped, sweep=self._sweep_orphans,
                                        watch=self.watch, status=state.status)
        if state.cgroup is not None and self.containment is not None:
            process.cgroup = SessionCgroup(state.cgroup, self.containment)
        for fd in (state.output, state.stderr, state.stdin):
            if fd is not None:
                os.set_inheritable(fd, False)
        return process

    def _spawn_pipe(self, spec: ProcessSpec, executable: str, env: list[bytes],
                    cwd: str) -> PipeProcess:
        fds: list[int] = []
        try:
            for _ in range(3):
                fds.extend(os.pipe())
            stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w = fds
            child_ends = [stdin_r, stdout_w, stderr_w]
            pid = self._start_on_pipes(spec, executable, env, cwd, (stdin_r, stdout_w, stderr_w))
        except BaseException:
            _close_all(fds)
            raise
        _close_all(child_ends)
        for fd in (stdin_w, stdout_r, stderr_r):
            os.set_blocking(fd, False)
        return self.pipe_process(pid, stdin_w, FdSource(stdout_r, pipe=True),
                                 FdSource(stderr_r, pipe=True), self.live, self._leader_reaped,
                                 sweep=self._sweep_orphans, watch=self.watch)

    @abstractmethod
    def _start_on_terminal(self, spec: ProcessSpec, executable: str, env: list[bytes],
                           cwd: str) -> tuple[int, int]:
        """Start ``executable`` as the leader of a new session whose controlling terminal is
        a new PTY of ``spec``'s size; (pid, master). Raises SpawnError."""

    @abstractmethod
    def _start_on_pipes(self, spec: ProcessSpec, executable: str, env: list[bytes], cwd: str,
                        stdio: tuple[int, int, int]) -> int:
        """Start ``executable`` with ``stdio`` as fds 0-2, leading a new session; its pid.
        Raises SpawnError."""


class LocalBackend(ChildBackend):
    """The fast path: children started by posix_spawn with no Python code in the child."""

    def _start_on_terminal(self, spec: ProcessSpec, executable: str, env: list[bytes],
                           cwd: str) -> tuple[int, int]:
        master, slave = os.openpty()
        try:
            set_window_size(slave, spec.rows, spec.cols)
            pid = spawn(executable, spec.argv, env, cwd, Stdio(tty_path=os.ttyname(slave)))
        except BaseException:
            _close_all([master, slave])
            raise
        os.close(slave)
        return pid, master

    def _start_on_pipes(self, spec: ProcessSpec, executable: str, env: list[bytes], cwd: str,
                        stdio: tuple[int, int, int]) -> int:
        return spawn(executable, spec.argv, env, cwd, Stdio(fds=stdio))

    def _executable(self, name: str, path: str, cwd: str) -> str:
        """A command on the server's own PATH is looked for by posix_spawnp in the child (no
        stat per PATH entry here); any other as every backend finds it."""
        if name and "/" not in name and path == self.environment.path:
            return name
        return resolve_executable(name, path, cwd)
