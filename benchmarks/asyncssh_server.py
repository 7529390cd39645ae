"""The asyncssh peer's server, run in its own process by peers.py.

It listens on 127.0.0.1 (port 0: it prints `listening PORT`), accepts the one
generated client key, and runs each session's command the way ttyserve does:
split like a shell would, without a shell, started with posix_spawn under a
new PTY when the client asked for one, else with pipes. Output is read in
256 KiB reads and written to the channel with flow control; the exit status
follows the output (with the same 2 s linger as ttyserve); a closed channel
hangs up the command's process group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import shlex
import signal
import sys
import termios
from typing import Any

import asyncssh

from . import procs

LINGER = 2.0
READ_SIZE = 256 * 1024


async def _wait_fd(fd: int, writable: bool = False) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    add, remove = ((loop.add_writer, loop.remove_writer) if writable
                   else (loop.add_reader, loop.remove_reader))

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


async def _pump_out(fd: int, writer: Any) -> None:
    """The command's output to the channel until end-of-file (EIO on a PTY master)."""
    while True:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            await _wait_fd(fd)
            continue
        except OSError as exc:
            if exc.errno == errno.EIO:
                return
            raise
        if not data:
            return
        writer.write(data)
        await writer.drain()


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await _wait_fd(fd, writable=True)


class Child:
    """One session's command, its descriptors and its exit."""

    def __init__(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        argv = shlex.split(process.command or "") or ["sh"]
        self.pty = process.get_terminal_type() is not None
        if self.pty:
            cols, rows = process.get_terminal_size()[:2]
            self.pid, master = procs.spawn_pty(argv, rows or 24, cols or 80,
                                               process.get_terminal_type() or "xterm")
            self.stdin, self.outputs = master, [(master, process.stdout)]
            self.fds = [master]
        else:
            child = procs.spawn_pipes(argv)
            self.pid, self.stdin = child.pid, child.stdin
            self.outputs = [(child.stdout, process.stdout), (child.stderr, process.stderr)]
            self.fds = [child.stdin, child.stdout, child.stderr]
        for fd in self.fds:
            os.set_blocking(fd, False)
        self.pidfd = os.pidfd_open(self.pid)
        self.reaped = False

    async def wait(self) -> int:
        while True:
            await _wait_fd(self.pidfd)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.reaped = True
                return os.waitstatus_to_exitcode(status)

    async def end_input(self) -> None:
        if self.pty:
            veof = termios.tcgetattr(self.stdin)[6][termios.VEOF]
            await _write_all(self.stdin, veof if isinstance(veof, bytes) else bytes([veof]))
        elif self.stdin in self.fds:
            self.fds.remove(self.stdin)
            os.close(self.stdin)

    def hang_up(self) -> None:
        if not self.reaped:
            procs.kill_group(self.pid, signal.SIGHUP)
            procs.kill_group(self.pid, signal.SIGCONT)

    def close(self) -> None:
        if not self.reaped:
            procs.kill_group(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.reaped = True
        for fd in [*self.fds, self.pidfd]:
            with contextlib.suppress(OSError):
                os.close(fd)


async def _pump_in(process: asyncssh.SSHServerProcess[bytes], child: Child) -> None:
    """Channel data to the command's stdin; EOF closes it (or types VEOF on a PTY)."""
    try:
        while True:
            data = await process.stdin.read(READ_SIZE)
            if not data:
                break
            if child.stdin in child.fds:
                await _write_all(child.stdin, data)
    except (asyncssh.Error, OSError, asyncio.IncompleteReadError, BrokenPipeError):
        pass
    if process.is_closing():
        child.hang_up()
    else:
        with contextlib.suppress(OSError):
            await child.end_input()


async def handle(process: asyncssh.SSHServerProcess[bytes]) -> None:
    """Run one session to its exit status."""
    try:
        child = Child(process)
    except OSError as exc:
        process.stderr.write(f"cannot start: {exc}\n".encode())
        process.exit(127 if exc.errno == errno.ENOENT else 126)
        return
    tasks: list[asyncio.Task[None]] = []
    try:
        tasks.append(asyncio.create_task(_pump_in(process, child)))
        outputs = [asyncio.create_task(_pump_out(fd, writer)) for fd, writer in child.outputs]
        closed = asyncio.create_task(process.wait_closed())
        waiter = asyncio.create_task(child.wait())
        tasks += [*outputs, closed]
        await asyncio.wait([waiter, closed], return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():  # the client went away first
            child.hang_up()
            waiter.cancel()
            return
        code = waiter.result()
        with contextlib.suppress(TimeoutError, OSError, asyncssh.Error, BrokenPipeError):
            await asyncio.wait_for(asyncio.gather(*outputs), LINGER)
        if process.is_closing():
            return
        if code >= 0:
            process.exit(code)
        else:
            process.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))
    finally:
        for task in tasks:
            task.cancel()
        child.close()


async def serve(host_key: str, authorized_keys: str) -> None:
    acceptor = await asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[host_key], authorized_client_keys=authorized_keys,
        process_factory=handle, encoding=None, line_editor=False, allow_pty=True,
        agent_forwarding=False, x11_forwarding=False, allow_scp=False, sftp_factory=None,
    )
    sys.stdout.write(f"listening {acceptor.get_port()}\n")
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    acceptor.close()
    await acceptor.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host-key", required=True)
    parser.add_argument("--authorized-keys", required=True)
    args = parser.parse_args()
    procs.raise_nofile_limit()
    asyncio.run(serve(args.host_key, args.authorized_keys))


if __name__ == "__main__":
    main()
