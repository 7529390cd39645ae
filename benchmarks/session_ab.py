"""Session rate side by side: two checkouts of ttyserve (or one and a bare asyncio server),
alternating with raw `posix_spawn`, sequential `true` sessions on the wire client.

    python -m benchmarks.session_ab BEFORE_DIR AFTER_DIR [--mux] [--sessions N] [--reps N]
    git worktree add /tmp/before d582afe   # the code to compare with, for example

A checkout runs as `ttyserve serve` with PYTHONPATH set to it. `bare` instead of a
directory is the least an asyncio server does for a session (accept, read, posix_spawn with
pipes, readiness callbacks on the pipes and the pidfd, waitpid, the `exit` frame, the close;
no protocol checks, no anyio): the raw limit of a Python server here. Prints each repetition
and the medians of the ratios to raw and of B to A.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .stats import median
from .wire import WireSession

BARE = '''
import asyncio, json, os, socket, struct, sys
from ttyserve.backends.spawn import Stdio, spawn
header = struct.Struct(">BII")
def frame(channel, message):
    body = json.dumps(message).encode()
    return [header.pack(4, channel, len(body)), body]
def main(path):
    loop = asyncio.new_event_loop()
    listener = socket.socket(socket.AF_UNIX); listener.bind(path); listener.listen(1024)
    listener.setblocking(False)
    def accepted():
        conn, _ = listener.accept(); conn.setblocking(False)
        def hello_and_open():
            conn.recv(65536); loop.remove_reader(conn.fileno())
            fds = [fd for _ in range(3) for fd in os.pipe()]
            pid = spawn("/bin/true", ["true"], [b"PATH=/bin"], "/tmp",
                        Stdio(fds=(fds[0], fds[3], fds[5])))
            for fd in (fds[0], fds[3], fds[5]): os.close(fd)
            ours = (fds[1], fds[2], fds[4]); pidfd = os.pidfd_open(pid); state = [2, None]
            def over():
                if state[0] or state[1] is None: return
                conn.sendmsg(frame(1, {"type": "exit", "code": state[1]}))
                for fd in (*ours, pidfd): os.close(fd)
                conn.shutdown(socket.SHUT_WR)
                def drained():
                    if not conn.recv(65536): loop.remove_reader(conn.fileno()); conn.close()
                loop.add_reader(conn.fileno(), drained)
            def output(fd):
                def readable():
                    if not os.read(fd, 65536):
                        loop.remove_reader(fd); state[0] -= 1; over()
                return readable
            for fd in ours[1:]: os.set_blocking(fd, False); loop.add_reader(fd, output(fd))
            def exited():
                loop.remove_reader(pidfd); state[1] = os.waitstatus_to_exitcode(
                    os.waitpid(pid, 0)[1]); over()
            loop.add_reader(pidfd, exited)
            conn.sendmsg(frame(0, {"type": "welcome", "protocol": 1, "server": "bare",
                                   "max_frame": 1 << 20}) + frame(1, {"type": "opened",
                                                                      "pid": pid}))
        loop.add_reader(conn.fileno(), hello_and_open)
    loop.add_reader(listener.fileno(), accepted)
    print("listening", flush=True)
    loop.run_forever()
main(sys.argv[1])
'''


def start(root: str, socket_path: str) -> subprocess.Popen[bytes]:
    """A server to measure: a checkout's `ttyserve serve`, or the bare one."""
    if root == "bare":
        argv = [sys.executable, "-c", BARE, socket_path]
        env = dict(os.environ)
    else:
        argv = [sys.executable, "-m", "ttyserve", "serve", f"--listen=unix:{socket_path}",
                "--max-sessions-per-connection", "100000"]
        env = {**os.environ, "PYTHONPATH": root}
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, cwd="/tmp")
    assert server.stdout is not None
    if not server.stdout.readline().startswith(b"listening"):
        server.kill()
        raise SystemExit(f"{root}: the server did not start")
    return server


def raw_rate(count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        pid = os.posix_spawn("/bin/true", ["true"], os.environ)
        os.waitpid(pid, 0)
    return count / (time.perf_counter() - started)


def served_rate(socket_path: str, count: int, mux: bool) -> float:
    started = time.perf_counter()
    if mux:
        with WireSession(f"unix:{socket_path}") as wire:
            wire.start(["true"], pty=False, multiplex=True)
            wire.count_until_exit()
            for _ in range(count - 1):
                wire.open_next(["true"], pty=False)
                wire.count_until_exit()
    else:
        for _ in range(count):
            with WireSession(f"unix:{socket_path}") as wire:
                wire.start(["true"], pty=False)
                wire.count_until_exit()
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.session_ab",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="a checkout's directory, or bare")
    parser.add_argument("b", help="a checkout's directory, or bare")
    parser.add_argument("--mux", action="store_true", help="one multiplexed connection")
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="ab-"))
    servers = []
    try:
        paths = [str(directory / f"{name}.sock") for name in ("a", "b")]
        servers = [start(root, path) for root, path in zip((args.a, args.b), paths,
                                                             strict=True)]
        for path in paths:
            served_rate(path, 50, args.mux)  # warm up
        to_raw: tuple[list[float], list[float]] = ([], [])
        b_to_a = []
        for _ in range(args.reps):
            before = raw_rate(args.sessions)
            a, b = (served_rate(path, args.sessions, args.mux) for path in paths)
            raw = (before + raw_rate(args.sessions)) / 2
            to_raw[0].append(a / raw)
            to_raw[1].append(b / raw)
            b_to_a.append(b / a)
            print(f"raw {raw:,.0f}/s  A {a:,.0f}/s ({a / raw:.3f}x)  "
                  f"B {b:,.0f}/s ({b / raw:.3f}x)  B/A {b / a:.3f}", flush=True)
        print(f"medians: A {median(to_raw[0]):.3f}x raw, B {median(to_raw[1]):.3f}x raw, "
              f"B/A {median(b_to_a):.3f}")
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()


if __name__ == "__main__":
    main()
