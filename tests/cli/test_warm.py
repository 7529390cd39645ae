"""Warm starts (cli/warm.py): `serve --stdio` and `exec` handed to a ttyserve that has
already started, with the stub's descriptors, environment, directory and umask; its
signals passed on, its death ending its child; started when none answers, never when
TTYSERVE_WARM=0, never through a socket another user serves; gone when idle."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import (
    SH,
    ServerProcess,
    StdioServer,
    children_of,
    ctrl,
    server_pid,
    split_output,
    start_warm_server,
    stdio_server,
    stop_warm_servers,
    wait_until,
    warm_runtime,
)

from ttyserve.cli.warm import ENDED, GO, MAGIC, STARTED, context, warm_socket_path
from ttyserve.client import connect
from ttyserve.exitcodes import ExecExit, ServeExit
from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Hello, Open

pytestmark = pytest.mark.timeout(60)
NOBODY = 65534


def parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def opened(server: StdioServer, script: str) -> int:
    """Open ``script`` (sh -c, pipes) on a single-session connection; its process's pid."""
    await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
        argv=[SH, "-c", script], pty=False)))
    while True:
        frame = await server.peer.next_frame()
        assert frame is not None, "closed before `opened`"
        if frame.kind is FrameKind.CTRL_OUT and frame.channel == 1:
            message = split_output([frame])[2][0]
            assert message["type"] == "opened", message
            return int(str(message["pid"]))


async def ended_by_eof(server: StdioServer) -> None:
    """stdin's end: the connection ends, and so does the server, exiting 0."""
    await server.peer.transport.send_eof()
    await server.peer.frames_until_eof()
    assert await server.exit_code() == ServeExit.OK


@pytest.fixture
def runtime(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime directory of the test's own, the warm far side allowed; warm servers the
    test's stubs start there are stopped after it."""
    directory = warm_runtime(short_dir, monkeypatch)
    yield directory
    stop_warm_servers(directory)


@pytest.mark.asyncio
async def test_the_server_is_a_child_of_the_warm_server_with_the_stubs_env_cwd_and_umask(
        short_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with start_warm_server(short_dir, monkeypatch) as warm:
        async with stdio_server(env={"WARM_TEST": "from the stub"}, cwd=tmp_path,
                                umask=0o027) as server:
            pid = await opened(server, 'echo "$WARM_TEST"; pwd; umask; exec cat')
            served_by = parent_of(pid)
            assert served_by != server.process.pid
            assert parent_of(served_by) == warm.pid
            output = b""
            while output.count(b"\n") < 3:
                frame = await server.peer.next_frame()
                assert frame is not None
                if frame.kind is FrameKind.STDOUT:
                    output += frame.payload
            assert output.decode().splitlines() == ["from the stub", str(tmp_path), "0027"]
            await ended_by_eof(server)
            assert not alive(pid) and not alive(served_by)


@pytest.mark.asyncio
async def test_a_signal_to_the_stub_reaches_its_server(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with start_warm_server(short_dir, monkeypatch):
        async with stdio_server() as server:
            pid = await opened(server, "exec cat")
            server.process.send_signal(signal.SIGTERM)
            rest = await server.peer.frames_until_eof()  # a graceful shutdown: the exit
            ending = split_output(rest)[2]
            assert ending and ending[-1]["type"] == "exit", ending
            # Passed on, not suffered: the stub waited for its server and says its status.
            assert await server.exit_code() == ServeExit.OK
            assert not alive(pid)


@pytest.mark.asyncio
async def test_a_killed_stub_ends_its_server_and_its_sessions(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with start_warm_server(short_dir, monkeypatch):
        async with stdio_server() as server:
            pid = await opened(server, "exec sleep 600")
            served_by = parent_of(pid)
            server.process.kill()
            rest = await server.peer.frames_until_eof()
            assert split_output(rest)[2][-1]["type"] == "exit"
            assert await wait_until(lambda: not alive(pid) and not alive(served_by), 10)


@pytest.mark.asyncio
async def test_with_none_answering_it_serves_alone_and_starts_one(runtime: Path) -> None:
    path = warm_socket_path()
    async with stdio_server() as server:
        pid = await opened(server, "exec cat")
        assert parent_of(pid) == server.process.pid  # served by the stub itself
        await ended_by_eof(server)
    # (a socket that does not exist yet has no event to wait for)
    assert await wait_until(lambda: server_pid(Path(path)) is not None, 30)
    warm = server_pid(Path(path))
    async with stdio_server() as server:
        pid = await opened(server, "exec cat")
        assert parent_of(parent_of(pid)) == warm  # the next one is served warm
        await ended_by_eof(server)


@pytest.mark.asyncio
async def test_warm_off_neither_starts_one_nor_uses_one(
        runtime: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTYSERVE_WARM", "0")
    async with stdio_server() as server:
        await server.peer.send(ctrl(0, Hello(protocol=1)) + ctrl(1, Open(
            argv=[SH, "-c", "exit 0"], pty=False)))
        await server.peer.frames_until_eof()
        assert await server.exit_code() == ServeExit.OK
    assert list(runtime.iterdir()) == []  # no socket, lock or log: nothing was started
    with start_warm_server(short_dir, monkeypatch):
        monkeypatch.setenv("TTYSERVE_WARM", "0")
        async with stdio_server() as server:
            pid = await opened(server, "exec cat")
            assert parent_of(pid) == server.process.pid
            await ended_by_eof(server)


def test_an_idle_warm_server_ends_and_takes_its_socket(short_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with start_warm_server(short_dir, monkeypatch, idle=0.2) as warm:  # (it checks the socket)
        assert warm.wait(20) == 0


def test_a_socket_another_user_serves_never_gets_the_descriptors(
        runtime: Path, short_dir: Path) -> None:
    """A squatter on the warm path (here: a process that became `nobody`) is not handed
    stdin and stdout: the stub serves alone, and says why on stderr."""
    short_dir.chmod(0o711)  # so that `nobody` can bind there
    runtime.chmod(0o777)
    path = warm_socket_path()
    told_read, told_write = os.pipe()
    squatter = os.fork()
    if squatter == 0:  # pragma: no cover (the child)
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(path)
                listener.listen(1)
                os.write(told_write, b"r")
                conn, _ = listener.accept()
                _, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(12))
                os.write(told_write, b"%d" % len(ancillary))
        finally:
            os._exit(0)
    os.close(told_write)
    try:
        assert os.read(told_read, 1) == b"r"
        done = subprocess.run([sys.executable, "-m", "ttyserve", "serve", "--stdio"],
                              input=b"", capture_output=True, timeout=30)
        assert done.returncode == ServeExit.OK  # EOF before `hello`: served alone, exit 0
        assert b"served by another user" in done.stderr
        assert os.read(told_read, 16) == b"0"  # no descriptors crossed
    finally:
        os.close(told_read)
        os.waitpid(squatter, 0)


def test_none_is_started_in_a_runtime_directory_others_may_write(runtime: Path) -> None:
    """Another user could put their socket or a link to our log there: the command is served
    alone, no warm server is started, and it says why."""
    runtime.chmod(0o733)
    done = subprocess.run([sys.executable, "-m", "ttyserve", "serve", "--stdio"],
                          input=b"", capture_output=True, timeout=30)
    assert done.returncode == ServeExit.OK
    assert b"not a directory of ours with mode 0700" in done.stderr
    assert not (runtime / "ttyserve-warm.log").exists()


def test_a_stub_of_another_user_is_refused(short_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket is the user's alone (0600); even opened to all, the warm server forks for
    no other user (SO_PEERCRED)."""
    with start_warm_server(short_dir, monkeypatch):
        path = warm_socket_path()
        assert os.stat(path).st_mode & 0o777 == 0o600
        short_dir.chmod(0o711)
        (short_dir / "rt").chmod(0o711)
        os.chmod(path, 0o666)
        told_read, told_write = os.pipe()
        intruder = os.fork()
        if intruder == 0:  # pragma: no cover (the child)
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.connect(path)
                    request = b"\0".join([MAGIC, context(), b"/", b"18", b"2", b"serve",
                                          b"--stdio"])
                    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
                    try:
                        sock.sendmsg([len(request).to_bytes(4, "big") + request],
                                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                        answer = sock.recv(5)
                    except (BrokenPipeError, ConnectionResetError):  # closed on us
                        answer = b""
                    os.write(told_write, answer or b"closed")
            except BaseException as exc:
                os.write(told_write, repr(exc).encode()[:200])
            finally:
                os._exit(0)
        os.close(told_write)
        try:
            assert os.read(told_read, 16) == b"closed"  # no child was started for it
        finally:
            os.close(told_read)
            os.waitpid(intruder, 0)


# --- exec --------------------------------------------------------------------------------


@contextlib.contextmanager
def exec_stub(server: ServerProcess, *argv: str, stdin: Any = subprocess.PIPE
              ) -> Iterator[subprocess.Popen[bytes]]:
    """`ttyserve exec` of ``argv`` on ``server``; killed (if need be) and reaped after."""
    process = subprocess.Popen([sys.executable, "-m", "ttyserve", "exec", "--connect",
                                server.addresses[0], "--", *argv],
                               stdin=stdin, stdout=subprocess.PIPE)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


def test_exec_runs_in_a_warm_child_with_its_stdin_stdout_and_status(
        server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with start_warm_server(short_dir, monkeypatch) as warm, \
            exec_stub(server_process, SH, "-c", "cat; exit 7") as stub:
        assert stub.stdin is not None and stub.stdout is not None
        stub.stdin.write(b"through the warm child\n")
        stub.stdin.flush()
        assert stub.stdout.readline() == b"through the warm child\n"
        assert children_of(warm.pid), "the exec runs in no child of the warm server"
        stub.stdin.close()
        assert stub.stdout.read() == b""
        assert stub.wait(20) == 7


@pytest.mark.parametrize("warm", ["0", "1"])
def test_ctrl_c_to_exec_means_the_same_warm_or_not(
        warm: str, server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT goes to the remote process (exec's contract): the warm stub passes it on."""
    with start_warm_server(short_dir, monkeypatch):
        monkeypatch.setenv("TTYSERVE_WARM", warm)
        with exec_stub(server_process, SH, "-c", "echo up; exec sleep 600",
                       stdin=subprocess.DEVNULL) as stub:
            assert stub.stdout is not None
            assert stub.stdout.readline() == b"up\n"
            stub.send_signal(signal.SIGINT)
            assert stub.wait(20) == 128 + signal.SIGINT  # sleep died of it, remotely


@pytest.mark.asyncio
@pytest.mark.parametrize("warm", ["0", "1"])
async def test_a_killed_exec_leaves_its_detachable_session_detached_warm_or_not(
        warm: str, server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGKILLed client's connection drops, and a detachable session goes on detached
    (section 9): the warm server ends the child of a killed `exec` stub as killed too,
    never by a SIGTERM it would pass on to the remote process."""
    address = server_process.addresses[0]
    with start_warm_server(short_dir, monkeypatch) as warm_server:
        monkeypatch.setenv("TTYSERVE_WARM", warm)
        process = subprocess.Popen(
            [sys.executable, "-m", "ttyserve", "exec", "--connect", address, "--detachable",
             "--json", "--", SH, "-c", "echo up; exec sleep 600"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        with process:
            assert process.stdout is not None
            session_id = json.loads(process.stdout.readline())["session"]
            assert json.loads(process.stdout.readline())["event"] == "stdout"  # "up"
            process.kill()
        assert process.wait(20) == -signal.SIGKILL
        assert await wait_until(lambda: not children_of(warm_server.pid), 10)
        async with connect(address) as conn:
            while True:  # (no event tells another client of a detach)
                (info,) = [i for i in await conn.list_sessions() if i.session == session_id]
                if not info.attached:
                    break
                await anyio.sleep(0.05)
    assert info.exit is None, info  # still running: the client's TERM was not passed on


def test_exec_with_a_terminal_on_stdin_is_not_handed_over(
        server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal's signals and size belong to its foreground process group: exec with a
    terminal for stdin runs where it was started."""
    with start_warm_server(short_dir, monkeypatch) as warm:
        master, slave = os.openpty()
        try:
            with exec_stub(server_process, SH, "-c", "echo up; exit 5", stdin=slave) as stub:
                assert stub.stdout is not None
                assert stub.stdout.readline() == b"up\r\n"  # (a PTY: stdin is a terminal)
                assert not children_of(warm.pid)
                assert stub.wait(20) == 5
        finally:
            os.close(master)
            os.close(slave)



def test_exec_with_a_controlling_terminal_is_not_handed_over(
        server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ssh asks for passwords and host keys on the controlling terminal, which a warm child
    (in a session of its own) would not have: with one, even with stdin a pipe, exec runs
    where it was started. (`setsid -c` makes the PTY on its stdin the controlling one.)"""
    with start_warm_server(short_dir, monkeypatch) as warm:
        master, slave = os.openpty()
        fifo = short_dir / "stdin"
        os.mkfifo(fifo)
        command = shlex.join([sys.executable, "-m", "ttyserve", "exec", "--connect",
                              server_process.addresses[0], "--", SH, "-c",
                              "echo up; read line; exit 4"])
        stub = subprocess.Popen(["setsid", "-c", SH, "-c", f"exec {command} < {fifo}"],
                                stdin=slave, stdout=subprocess.PIPE)
        try:
            with open(fifo, "wb", buffering=0) as feed:  # (opened once the shell reads it)
                assert stub.stdout is not None
                assert stub.stdout.readline() == b"up\n"
                assert not children_of(warm.pid)
                feed.write(b"go\n")
            assert stub.wait(20) == 4
        finally:
            if stub.poll() is None:
                stub.kill()
            stub.wait()
            assert stub.stdout is not None
            stub.stdout.close()
            os.close(master)
            os.close(slave)


def test_a_stopped_warm_server_lets_its_commands_finish(
        server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM to a warm server with a command running: it takes no new one (its socket is
    gone), the running one finishes and its caller hears its status, then it ends."""
    with start_warm_server(short_dir, monkeypatch) as warm, \
            exec_stub(server_process, SH, "-c", "cat; exit 6") as stub:
        assert stub.stdin is not None and stub.stdout is not None
        stub.stdin.write(b"before\n")
        stub.stdin.flush()
        assert stub.stdout.readline() == b"before\n"
        warm.terminate()
        stub.stdin.write(b"after\n")
        stub.stdin.flush()
        assert stub.stdout.readline() == b"after\n"
        stub.stdin.close()
        assert stub.wait(20) == 6  # its status came back: the warm server outlived the command
        assert warm.wait(20) == 0


def test_exec_says_failure_when_the_warm_server_dies_and_a_signal_death_is_128_plus_n(
        server_process: ServerProcess, short_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """exec's contract holds warm: a warm server killed under a command leaves its status
    unknown (255, not 1, which would read as the remote's), and a warm child killed by a
    signal is 128 + N, as a shell says it."""
    with start_warm_server(short_dir, monkeypatch) as warm:  # (killed below: as it may)
        with exec_stub(server_process, SH, "-c", "echo up; exec cat") as stub:
            assert stub.stdout is not None
            assert stub.stdout.readline() == b"up\n"
            (child,) = children_of(warm.pid)
            os.kill(child, signal.SIGKILL)
            assert stub.wait(20) == ExecExit.SIGNAL_BASE + signal.SIGKILL
        with exec_stub(server_process, SH, "-c", "echo up; exec cat") as stub:
            assert stub.stdout is not None
            assert stub.stdout.readline() == b"up\n"
            (child,) = children_of(warm.pid)
            warm.kill()
            assert stub.wait(20) == ExecExit.FAILURE
            os.kill(child, signal.SIGTERM)  # (its exec, ours to end: the warm one is gone)


# --- never twice: the child waits for its stub's word ----------------------------------------


def warm_request(argv: list[str], fds: tuple[int, int, int]) -> tuple[bytes, bytes]:
    """A stub's request to run ``argv`` (ttyserve's arguments) with ``fds`` as its stdio,
    as cli/warm.py sends it: the bytes, and the descriptors as SCM_RIGHTS data."""
    fields = [MAGIC, context(), os.getcwdb(), b"18", b"%d" % len(argv),
              *(arg.encode() for arg in argv),
              *(key + b"=" + value for key, value in os.environb.items())]
    request = b"\0".join(fields)
    return (len(request).to_bytes(4, "big") + request,
            b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds))


def started(sock: socket.socket) -> tuple[int, int]:
    """The warm server's STARTED: the child's pid, and GO's pipe (its writing end)."""
    reply, fds, _, _ = socket.recv_fds(sock, 5, 1)
    assert reply[:1] == STARTED and len(reply) == 5 and len(fds) == 1, (reply, fds)
    return int.from_bytes(reply[1:], "big"), fds[0]


def ended(sock: socket.socket) -> int:
    """The warm server's ENDED: the exit code its child's stub is to exit with."""
    reply = sock.recv(5)
    assert reply[:1] == ENDED and len(reply) == 5, reply
    return int.from_bytes(reply[1:], "big")


def test_a_warm_child_runs_nothing_until_its_stub_says_go(
        server_process: ServerProcess, short_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of a stub that never hears of its child (the warm server killed, the reply
    lost) forced: this test is the stub, and hears STARTED. Without its GO the child ends
    having run nothing (the stub would run the command itself); with it, the command runs
    once."""
    ran = tmp_path / "ran"
    argv = ["exec", "--connect", server_process.addresses[0], "--", SH, "-c",
            f"echo ran >> {ran}; exit 3"]
    with start_warm_server(short_dir, monkeypatch), open(os.devnull, "r+b") as null:
        request, fds = warm_request(argv, (null.fileno(),) * 3)
        for say_go in (False, True):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(20)
                sock.connect(warm_socket_path())
                sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                _, go = started(sock)
                if say_go:
                    os.write(go, GO)
                os.close(go)
                code = ended(sock)
            if say_go:
                assert code == 3 and ran.read_text() == "ran\n"
            else:
                assert not ran.exists(), "the child ran the command without its stub's GO"


def scripted_warm_server(directory: Path, monkeypatch: pytest.MonkeyPatch) -> socket.socket:
    """A listener where the stubs of this test look for their warm server: the test plays
    it."""
    warm_runtime(directory, monkeypatch)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(warm_socket_path())
    listener.listen()
    listener.settimeout(20)
    return listener


@pytest.mark.parametrize("answer", ["closed", "child gone", "went away after GO"])
def test_a_stub_runs_the_command_itself_only_while_no_child_can(
        answer: str, server_process: ServerProcess, short_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stub runs the command itself when its warm server closes before STARTED, or when
    the child ended before reading GO (EPIPE); once it has said GO, never: without the
    child's status it exits 255."""
    ran = tmp_path / "ran"
    with scripted_warm_server(short_dir, monkeypatch) as listener, \
            exec_stub(server_process, SH, "-c", f"echo ran >> {ran}; exit 3",
                      stdin=subprocess.DEVNULL) as stub:
        with listener.accept()[0] as sock:
            sock.settimeout(20)
            _, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            for fd in fds:
                os.close(fd)
            if answer != "closed":
                go_read, go_write = os.pipe()
                if answer == "child gone":
                    os.close(go_read)
                socket.send_fds(sock, [STARTED + (1).to_bytes(4, "big")], [go_write])
                os.close(go_write)
                if answer != "child gone":
                    assert os.read(go_read, 8) == GO
                    os.close(go_read)
        if answer == "went away after GO":
            assert stub.wait(20) == ExecExit.FAILURE
            assert not ran.exists(), "the stub ran the command after its GO"
        else:
            assert stub.wait(20) == 3
            assert ran.read_text() == "ran\n"


# --- the caller's confinement --------------------------------------------------------------

# What the far side sees of its confinement (the cgroup its server started from: the
# session's own, less the `ttyserve/SERVER/SESSION` its server made below it; never the
# server's, which is the session's own while the server spawns and moves back), then its
# grandparent: the process that ran `serve --stdio` (a warm server, or the `exec` that ran it
# cold).
CONFINEMENT = ("readlink /proc/self/ns/net; wc -l < /proc/net/dev; "
               "sed 's,/ttyserve/[^/]*/[^/]*$,,' /proc/self/cgroup; "
               "ulimit -Hn; cat /proc/self/loginuid /proc/self/sessionid; echo; "
               "awk '/^PPid/ {print $2}' /proc/$PPID/status")
REMOTE = str(Path(sys.executable).parent / "ttyserve")


@contextlib.contextmanager
def confined(how: str) -> Iterator[list[str]]:
    """A command prefix that runs what follows confined as ``how`` says: in a network
    namespace of its own, under a lower limit, or in another cgroup (made and removed here)."""
    if how == "netns":
        yield ["unshare", "--net"]
    elif how == "ulimit":
        yield [SH, "-c", 'ulimit -n 1111 && exec "$@"', "sh"]
    else:
        from ttyserve.backends.cgroups import kill_tree, own_cgroup, until_empty

        own = own_cgroup()
        if own is None or not os.access(own, os.W_OK):
            pytest.skip("a writable cgroup v2 hierarchy is not installed here (CI has one)")
        cgroup = Path(own) / f"ttyserve-warm-test-{os.getpid()}"
        cgroup.mkdir()
        try:
            yield [SH, "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"]
        finally:
            kill_tree(str(cgroup))  # (what a failed test left there)
            assert anyio.run(until_empty, str(cgroup), 10.0)
            cgroup.rmdir()


def far_side_contexts(prefix: list[str], *warm: str) -> list[tuple[list[str], int]]:
    """`exec --via env` once per ``warm`` (TTYSERVE_WARM), one after the other inside one
    ``prefix``: what each far side's command sees, and the pid of the process that ran it."""
    run = (f"TTYSERVE_WARM=$1 {REMOTE} exec --via env --remote-command {REMOTE} -T -- "
           f"{SH} -c {shlex.quote(CONFINEMENT)} && echo --- && shift")
    script = "\n".join([f"{run} || exit"] * len(warm))
    result = subprocess.run([*prefix, SH, "-c", script, "sh", *warm], stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    contexts = []
    for block in result.stdout.decode().split("---\n")[:-1]:
        *lines, runner = block.splitlines()
        contexts.append((lines, int(runner)))
    assert len(contexts) == len(warm), result.stdout
    return contexts


@pytest.mark.parametrize("how", ["netns", "ulimit", "cgroup"])
def test_a_command_started_warm_keeps_its_callers_confinement(
        how: str, short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm server started elsewhere never runs a confined caller's command: it runs cold,
    then in a warm server of its own confinement, seeing what it sees cold."""
    with start_warm_server(short_dir, monkeypatch) as unconfined, confined(how) as prefix:
        try:
            [(outside, runner)] = far_side_contexts([], "1")
            assert runner == unconfined.pid  # (a warm start, from the test's own context)
            (cold, _), (first, _), (second, runner) = far_side_contexts(prefix, "0", "1", "1")
            assert cold != outside, "the confinement changed nothing to see"
            assert first == cold and second == cold
            ours = warm_socket_path()
            theirs = [path for path in (short_dir / "rt").glob("ttyserve-warm-*.sock")
                      if str(path) != ours]
            assert len(theirs) == 1, theirs  # the second ran warm, confined as it is
            assert runner == server_pid(theirs[0]) != unconfined.pid
        finally:
            stopped = stop_warm_servers(short_dir / "rt")
        assert stopped == 2


def refused(path: str, confinement: bytes) -> bool:
    """Whether the warm server on ``path`` closes on a request from ``confinement`` without
    starting a child for it."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        request = b"\0".join([MAGIC, confinement, b"/", b"18", b"2", b"serve", b"--stdio"])
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        sock.sendmsg([len(request).to_bytes(4, "big") + request],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        return sock.recv(5) == b""


def test_the_warm_server_compares_its_callers_confinement_with_its_own_at_each_request(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly, beside the socket's name: a caller confined otherwise is refused (it runs
    cold); a warm server whose own limits were changed from outside serves nobody more."""
    import resource

    with start_warm_server(short_dir, monkeypatch) as warm:
        path = warm_socket_path()
        assert refused(path, context() + b"\nelsewhere")
        assert not children_of(warm.pid) and os.path.exists(path)
        soft, hard = resource.prlimit(warm.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(warm.pid, resource.RLIMIT_NOFILE, (min(soft, 999), min(hard, 999)))
        assert refused(path, context())
        assert warm.wait(10) == 0 and not os.path.exists(path)


def test_a_warm_server_started_for_another_confinement_does_not_serve(runtime: Path) -> None:
    """Its socket's name is its starter's context: a process whose own differs (its starter's
    children are confined otherwise) ends at once and binds nothing."""
    path = warm_socket_path(context() + b"\nelsewhere")
    result = subprocess.run([sys.executable, "-m", "ttyserve.cli.warm", path], timeout=30,
                            capture_output=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and b"not serving" in result.stderr
    assert not os.path.exists(path)
