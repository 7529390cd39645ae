"""Warm starts: `serve --stdio` and `exec` handed to a ttyserve that has already started.

A carrier runs `ttyserve serve --stdio` once per connection, scripts run `ttyserve exec`
in loops, and most of a new Python process's start is importing the event loop and the
message codec (~150 ms here, 9x `python -c pass`). A warm server is one process per user
and installation, its imports done, waiting on a Unix socket in the runtime directory.
Those two commands try it first: the process passes its stdin, stdout and stderr
(SCM_RIGHTS), its arguments, environment, working directory and umask; the warm server
forks a child that takes them and runs the command as this process would have; this
process waits, passes on the signals it gets, and exits with the child's status. Per
command only this module's imports are paid.

A command that started is never run twice (contracts.md), whatever happens between the
fork and the stub hearing of it: the child waits for the stub's word (GO, on a pipe whose
writing end comes with STARTED) before it runs anything. A stub that has not sent it may
run the command itself (the child then sees the pipe's end and exits, having run
nothing); one that has sent it never does, and without the child's status exits 255.

When none answers, the command runs here as before, and a warm server is started in the
background for the next one; it ends after WARM_IDLE seconds without a command.
`TTYSERVE_WARM=0` turns both off. The socket's name carries a digest of the installed
code and of the caller's context (namespaces, cgroup, limits, login session, credentials:
see `context`), so a changed installation never reaches an old warm server and a command
never runs outside the confinement it was started in; the warm server compares the
caller's context with its own, exactly, before it forks. Both sides check that the other
runs as the same user (SO_PEERCRED).

The stub's imports are the interpreter's own (`_socket`, `_signal`, `zlib`): `socket`,
`signal` and `struct` would import `enum` and more, a third of what it saves.
"""
from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import _socket
import os
import sys
import zlib

from ..defaults import WARM_IDLE
from ..runtime import runtime_path
from ..version import __version__

TYPE_CHECKING = False  # (typing's costs its import; mypy reads any TYPE_CHECKING as true)
if TYPE_CHECKING:
    import selectors
    import socket
    from typing import NoReturn

WARM_ENV = "TTYSERVE_WARM"  # "0": neither use nor start a warm server
MAGIC = b"ttyserve-warm-3"  # the request's first field: the stub and server speak one format
FORWARDED = (_signal.SIGHUP, _signal.SIGINT, _signal.SIGQUIT, _signal.SIGTERM)  # passed on
STOPPING = {_signal.SIGTERM, _signal.SIGINT}  # stop the warm server (WarmServer.stop)
REQUEST_LIMIT = 4 << 20  # bytes of arguments and environment a request may carry
HANDSHAKE_TIMEOUT = 5.0  # seconds a connected stub has to send its request
STARTED = b"P"  # warm server -> stub: the child's pid follows (4 bytes), and GO's pipe
GO = b"G"  # stub -> child, on that pipe: the command is the child's to run, never the stub's
ENDED = b"X"  # warm server -> stub: the exit code to exit with follows (4 bytes)
# What every child would import (or build) again, done once in the warm server:
PRELOADED = ("pwd", "anyio._backends._asyncio", "anyio._core._signals", "ttyserve.server.config",
             "ttyserve.cli.serve", "ttyserve.cli.exec_direct", "ttyserve.cli.exec",
             "ttyserve.cli.exec_many")


UNDIGESTED = ("__pycache__", "static")  # folders of the package that hold no module


def code_digest(package: str | None = None) -> str:
    """Names this installation: the interpreter, the version, each module's size and mtime
    (of ``package``, by default this one), and the site-packages directories' mtimes (which
    every install or upgrade changes)."""
    package = package or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    crc = zlib.crc32(f"{sys.executable}\0{__version__}".encode())
    for entry in sys.path:
        if entry.endswith("-packages") and os.path.isdir(entry):
            crc = zlib.crc32(f"{entry}\0{os.stat(entry).st_mtime_ns}\0".encode(), crc)
    for directory, subdirectories, files in os.walk(package):  # (top-down: in sorted order)
        subdirectories[:] = sorted(name for name in subdirectories if name not in UNDIGESTED)
        for name in sorted(files):
            if name.endswith(".py"):
                info = os.stat(os.path.join(directory, name))
                crc = zlib.crc32(f"{directory}/{name}\0{info.st_size}\0{info.st_mtime_ns}\0"
                                 .encode(), crc)
    return f"{crc:08x}"


# What a process inherits besides its arguments, environment, cwd, umask and descriptors,
# and what a warm child would otherwise take from the warm server instead of its caller:
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time",
              "time_for_children", "user", "uts")  # /proc/self/ns/*
CONTEXT_FILES = ("cgroup", "limits", "loginuid", "sessionid", "oom_score_adj",
                 "attr/current")  # /proc/self/*: the cgroup, rlimits, audit identity, LSM label
STATUS_FIELDS = (b"Uid:", b"Gid:", b"Groups:", b"NoNewPrivs:", b"Seccomp:", b"Seccomp_filters:",
                 b"CapInh:", b"CapPrm:", b"CapEff:", b"CapBnd:", b"CapAmb:",
                 b"Cpus_allowed_list:", b"Mems_allowed_list:")  # from /proc/self/status


def _proc_read(name: str) -> bytes:
    try:
        fd = os.open(f"/proc/self/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # (attr/current without a security module: EINVAL)
        return b""
    finally:
        os.close(fd)


def context() -> bytes:
    """This process's confinement, as a command started here would inherit it: namespaces,
    cgroup, resource limits, login session and audit identity, credentials, capabilities,
    seccomp, CPU and memory placement, niceness. A warm child runs with its warm server's,
    so a warm server serves only callers whose context is exactly its own."""
    parts = []
    for name in NAMESPACES:
        try:
            parts.append(os.readlink(f"/proc/self/ns/{name}").encode())
        except OSError:
            parts.append(b"")
    parts.extend(_proc_read(name) for name in CONTEXT_FILES)
    parts.extend(line for line in _proc_read("status").splitlines()
                 if line.startswith(STATUS_FIELDS))
    parts.append(b"%d" % os.getpriority(os.PRIO_PROCESS, 0))
    return b"\n".join(parts).replace(b"\0", b"")  # (the request's fields end at NUL)


def warm_socket_path(caller: bytes | None = None) -> str:
    """The warm server's socket for this installation and this context (``caller``, else
    this process's): a caller confined otherwise reaches another warm server, or none."""
    crc = zlib.crc32(context() if caller is None else caller)
    return runtime_path(f"ttyserve-warm-{code_digest()}-{crc:08x}.sock")


def _uid_of(sock: _socket.socket) -> int:
    """The peer's uid (struct ucred: pid, uid, gid)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder)


def _receive_exactly(sock: _socket.socket, size: int) -> bytes:
    """``size`` bytes, or fewer when the peer closed first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# --- the stub: the command handing itself over -------------------------------------------


def eligible(args: list[str]) -> bool:
    """`serve --stdio` (with any serve flags but --persist, which relays instead), and `exec`
    in pipe mode with stdin not a terminal (a terminal's signals and size are its process
    group's, which the warm child is not in); not if TTYSERVE_WARM=0."""
    if os.environ.get(WARM_ENV) == "0":
        return False
    flags = set(args[:args.index("--")] if "--" in args else args)
    if flags & {"-h", "--help", "--version"}:
        return False
    if args[:1] == ["serve"]:
        return "--stdio" in flags and "--persist" not in flags
    return (args[:1] == ["exec"] and "-t" not in flags and not os.isatty(0)
            and not _has_terminal())


def _has_terminal() -> bool:
    """Whether this process has a controlling terminal (where ssh asks for a password or a
    host key): the warm child, in a session of its own, would have none."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def handed_over(args: list[str]) -> int | None:
    """Run ``args`` in a warm server's child: its exit status, or None when this process
    must run them itself (then a warm server is started for the next time)."""
    confinement = context()
    path = warm_socket_path(confinement)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except OSError:
            _start_warm_server(path)
            return None
        if _uid_of(sock) != os.getuid():
            _say(f"{path} is served by another user: not using it")
            return None
        return _hand_over(sock, args, confinement)
    finally:
        sock.close()


def _hand_over(sock: _socket.socket, args: list[str], confinement: bytes) -> int | None:
    try:
        cwd = os.getcwdb()
    except OSError:  # gone: the command says so itself, as it would have without us
        return None
    fields = [MAGIC, confinement, cwd, b"%d" % _umask(), b"%d" % len(args),
              *(os.fsencode(arg) for arg in args),
              *(key + b"=" + value for key, value in os.environb.items())]
    request = b"\0".join(fields)
    header = len(request).to_bytes(4, "big")
    fds = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in (0, 1, 2))
    go = None
    try:
        sent = sock.sendmsg([header + request],
                            [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        sock.sendall((header + request)[sent:])
        reply, ancillary, _, _ = sock.recvmsg(5, _socket.CMSG_SPACE(4),
                                              _socket.MSG_CMSG_CLOEXEC)
        for level, kind, data in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
                go = int.from_bytes(data[:4], sys.byteorder, signed=True)
        if reply[:1] == STARTED:
            reply += _receive_exactly(sock, 5 - len(reply))
    except OSError:
        reply = b""
    if go is None or len(reply) < 5 or reply[:1] != STARTED:
        if go is not None:
            os.close(go)
        return None  # no child runs it: none was forked (the warm server was ending, idle,
        # confined otherwise) or it waits for GO, which never comes: run it here
    try:
        os.write(go, GO)  # from here on the command is the child's alone
    except OSError:  # (EPIPE: the child ended before reading it, having run nothing)
        return None
    finally:
        os.close(go)
    child = int.from_bytes(reply[1:], "big")
    # The child has stdin and stdout now; ours must not keep the carrier's pipes open.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        _signal.signal(signum, forward)
    ending = _receive_exactly(sock, 5)
    if len(ending) < 5 or ending[:1] != ENDED:
        from ..exitcodes import ExecExit, ServeExit

        _say(f"the warm server went away: the status of its child {child} is unknown")
        return int(ExecExit.FAILURE if args[0] == "exec" else ServeExit.ERROR)
    return int.from_bytes(ending[1:], "big")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _say(message: str) -> None:
    os.write(2, f"ttyserve: warm start: {message}\n".encode(errors="replace"))


def _start_warm_server(path: str) -> None:
    """A warm server in the background, in a session of its own and not our child, holding
    none of our descriptors: whoever waits for this command (ssh, a shell reading its
    output) must not wait for it, nor its end hang it up."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        import stat  # (the cold path only: the stub imports built-in modules alone)

        info = os.lstat(directory)
        if info.st_uid != os.getuid() or info.st_mode & 0o077 or not stat.S_ISDIR(info.st_mode):
            _say(f"{directory} is not a directory of ours with mode 0700: none started")
            return
        log = os.open(os.path.join(directory, "ttyserve-warm.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        _say(f"cannot start one in {directory}: {exc.strerror}")
        return
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                if os.fork() == 0:
                    null = os.open(os.devnull, os.O_RDWR)
                    os.dup2(null, 0)
                    os.dup2(null, 1)
                    os.dup2(log, 2)
                    os.closerange(3, 65536)
                    os.execv(sys.executable,  # -P: our cwd is not on its import path
                             [sys.executable, "-P", "-m", "ttyserve.cli.warm", path])
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    finally:
        os.close(log)


# --- the warm server -----------------------------------------------------------------------


def serve_warm(path: str, idle: float = WARM_IDLE) -> int:
    """Wait for stubs on ``path``; fork a child running each one's command; end after
    ``idle`` seconds with no child and no connection. 0 also when another one holds it."""
    import fcntl

    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                   0o600)
    try:  # first: the many far sides of a fan-out may each start one, and all but one end here
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return 0
    confinement = context()
    if os.path.basename(path) != os.path.basename(warm_socket_path(confinement)):
        _say(f"{path} names another context than this process's (started from a process "
             "whose children are confined otherwise, as after `unshare --pid`): not serving")
        os.close(lock)
        return 0
    server = WarmServer(path, lock, confinement)
    try:
        return server.serve(idle)
    finally:
        server.remove_socket()
        server.close_all()


class WarmServer:
    """A warm server's listener, lock and wake-up pipe, and its children, each with its stub's
    connection (which hears the child's pid, then its exit code)."""

    def __init__(self, path: str, lock: int, confinement: bytes) -> None:
        """Import what every child would, listen on ``path``, and take the signals."""
        import importlib
        import selectors
        import signal
        import socket
        import time

        from .main import build_parser

        for name in PRELOADED:
            importlib.import_module(name)
        for command in ("serve", "exec"):
            build_parser(command)  # each child parses its command line with it: built once, here
        os.chdir("/")  # holds no directory of the stub that started it (each child takes its own)
        self.path = path
        self.lock = lock
        self.confinement = confinement
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)  # ours to replace: we hold the lock, so its server is gone
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.bound = os.stat(path).st_ino  # the file to remove at the end, if it is still ours
        self.listener.listen(128)
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_write)
        self.handlers = {signum: signal.getsignal(signum)
                         for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)}
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self.ending = False  # told to stop: no new commands; those running finish and hear back
        self.children: dict[int, socket.socket] = {}  # each child's stub connection
        for signum in STOPPING:
            signal.signal(signum, self.stop)
        sys.stdout.write(f"listening {path}\n")  # (to /dev/null when a stub started it)
        sys.stdout.flush()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        self.quiet_since = time.monotonic()

    def stop(self, signum: int, frame: object) -> None:
        """SIGTERM, SIGINT: end once the children have; at once without any, or at a second."""
        if self.ending or not self.children:
            raise SystemExit(0)  # through serve_warm's `finally`: the socket goes with us
        self.ending = True

    def serve(self, idle: float) -> int:
        """Start each stub's command, reap the children; 0 once ending with none left, or
        ``idle`` seconds after the last one."""
        import time

        while True:
            if self.ending and self.listener.fileno() != -1:
                self.selector.unregister(self.listener)
                self.listener.close()
                self.remove_socket()  # meanwhile new commands run by themselves, not queued here
            timeout = None if self.children else self.quiet_since + idle - time.monotonic()
            if (timeout is not None and timeout <= 0) or (self.ending and not self.children):
                return 0
            for key, _ in self.selector.select(timeout):
                self.ready(key)
            self.reap()

    def ready(self, key: selectors.SelectorKey) -> None:
        """One readable descriptor: the listener (a stub), the wake-up pipe, or a stub."""
        import socket

        if key.fileobj is self.listener:
            stub, _ = self.listener.accept()
            self.start(stub)
        elif key.fileobj == self.wake_read:
            try:
                os.read(self.wake_read, 4096)  # the signals' bytes: reap() looks at all
            except BlockingIOError:
                pass
        elif isinstance(key.fileobj, socket.socket):
            # A stub says nothing after its request: readable means it is gone (killed). Its
            # child ends as the stub would have: a far side's server as when its carrier
            # dies (SIGTERM: its sessions end), an `exec` as a killed client (SIGKILL: its
            # connection drops, and a detachable session goes on detached).
            self.selector.unregister(key.fileobj)
            os.kill(*key.data)

    def start(self, stub: socket.socket) -> None:
        """Fork a child running ``stub``'s command, and tell the stub its pid; a caller
        confined otherwise than this server is refused (it runs cold)."""
        import selectors
        import signal
        import socket

        request = _read_request(stub)
        if request is None:
            stub.close()
            return
        caller, fds, args, env, cwd, umask = request
        now = context()
        if caller != now:  # the caller runs cold, confined as it is, rather than here
            _say("a request refused: its caller is confined otherwise than this server")
            for fd in fds:
                os.close(fd)
            stub.close()
            if now != self.confinement:  # moved or re-limited from outside: serve nobody more
                self.ending = True
            return
        sys.stdout.flush()
        sys.stderr.flush()
        go_read, go_write = os.pipe2(os.O_CLOEXEC)  # the stub's GO to the child
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)  # no stop() before the stub knows
        pid = os.fork()
        if pid == 0:
            os.close(go_write)
            self.child(stub, fds, go_read, args, env, cwd, umask)
        os.close(go_read)
        for fd in fds:
            os.close(fd)
        try:  # its stub gone, the child sees GO's pipe end with this process's copy
            socket.send_fds(stub, [STARTED + pid.to_bytes(4, "big")], [go_write])
        except OSError:
            pass
        os.close(go_write)
        self.children[pid] = stub
        self.selector.register(stub, selectors.EVENT_READ, (
            pid, signal.SIGKILL if args[:1] == ["exec"] else signal.SIGTERM))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)

    def child(self, stub: socket.socket, fds: list[int], go: int, args: list[str],
              env: dict[str, str], cwd: str, umask: int) -> NoReturn:
        """The forked child: once its stub said GO (else it exits, having run nothing), the
        stub's descriptors, environment, cwd and umask, then its command, as `ttyserve` run
        there would; exits with its status."""
        import signal

        from .main import main as full_main

        code = 1
        try:
            self.close_all()
            stub.close()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING)
            if os.read(go, len(GO)) != GO:  # the stub runs it itself, or is gone
                os._exit(code)
            os.close(go)
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.environ.clear()
            os.environ.update(env)
            os.chdir(cwd)
            os.umask(umask)
            sys.argv = ["ttyserve", *args]
            full_main(args)
        except SystemExit as exc:  # (sys.exit() is 0, sys.exit("text") 1)
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            try:  # nothing raised here may reach the warm server's own `finally`
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def reap(self) -> None:
        """Each child that ended: its exit code to its stub, as a shell would give it."""
        import time

        from ..exitcodes import ExecExit

        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            stub = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if code < 0:  # a death by a signal: as a shell says it, and exec a remote one
                code = ExecExit.SIGNAL_BASE - code
            try:
                self.selector.unregister(stub)
            except KeyError:
                pass  # its stub had gone
            try:
                stub.sendall(ENDED + code.to_bytes(4, "big"))
            except OSError:
                pass  # the stub was killed: nobody waits for the status
            stub.close()
            self.quiet_since = time.monotonic()

    def remove_socket(self) -> None:
        """The socket's file, if it is still the one bound here."""
        try:
            if os.stat(self.path).st_ino == self.bound:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close_all(self) -> None:
        """What the child must not keep: the listener, the stubs, the wake-up pipe, the lock."""
        import signal

        signal.set_wakeup_fd(-1)
        for signum, handler in self.handlers.items():
            signal.signal(signum, handler)
        self.selector.close()
        self.listener.close()
        for stub in self.children.values():
            stub.close()
        os.close(self.wake_read)
        os.close(self.wake_write)
        os.close(self.lock)


def _read_request(stub: _socket.socket) -> tuple[bytes, list[int], list[str], dict[str, str],
                                                  str, int] | None:
    """A stub's request: its context, three descriptors, arguments, environment, cwd,
    umask; None (its descriptors closed) when it is not one, or not from this user."""
    import socket

    stub.settimeout(HANDSHAKE_TIMEOUT)
    fds: list[int] = []
    try:
        if _uid_of(stub) != os.getuid():
            return None
        head, fds, _, _ = socket.recv_fds(stub, 4 + 65536, 3)  # type: ignore[arg-type]
        if len(fds) != 3:
            raise ValueError("no descriptors")
        head += _receive_exactly(stub, 4 - len(head)) if len(head) < 4 else b""
        size = int.from_bytes(head[:4], "big")
        if size > REQUEST_LIMIT:
            raise ValueError(f"{size} bytes")
        body = head[4:] + _receive_exactly(stub, size - (len(head) - 4))
        fields = body.split(b"\0")
        if fields[0] != MAGIC:
            raise ValueError("not a request of this version")
        count = int(fields[4])
        args = [os.fsdecode(arg) for arg in fields[5:5 + count]]
        env = dict(os.fsdecode(entry).partition("=")[::2] for entry in fields[5 + count:])
        return fields[1], fds, args, env, os.fsdecode(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError) as exc:
        _say(f"a request refused: {exc}")
        for fd in fds:
            os.close(fd)
        return None
    finally:
        stub.settimeout(None)


if __name__ == "__main__":
    sys.exit(serve_warm(sys.argv[1] if len(sys.argv) > 1 else warm_socket_path(),
                        float(sys.argv[2]) if len(sys.argv) > 2 else WARM_IDLE))
