"""Carriers: a far side reached through a child process (ssh, `kubectl exec -i`, `docker exec
-i`) that runs `ttyserve serve --stdio` and carries the protocol on its pipes.

The carrier is the client's child and is reaped on every way out: leaving closes its
stdin (the far side sees EOF and cancels its sessions), then it has EXIT_GRACE to end
before SIGTERM, and TERM_GRACE more before SIGKILL. Its stderr is shown line by line,
never parsed; if it ends before `welcome`, its exit status is classified by remedy
(contracts.md, "One ttyserve, many hosts").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import anyio
import anyio.abc

from ..addresses import Address
from ..defaults import (
    CARRIER_STDERR_READ,
    DEFAULT_REMOTE_COMMAND,
    PERSIST_ARGUMENTS,
    STDIO_ARGUMENTS,
)
from ..errors import CARRIER_FAILURES, CarrierError, CarrierFailure, OutOfResources
from ..exitcodes import ExecExit, ServeExit, signal_name
from ..lines import LineBuffer, write_all
from ..transport.background import beside
from ..transport.streams import PipeTransport, close_gracefully
from .local import PIPE_SIZE
from .watch import open_exit_watch

EXIT_GRACE = 5.0  # seconds a carrier has to end once its stdin is closed
NO_WELCOME_GRACE = 0.5  # the same, before `welcome`: the far side has nothing to finish
TERM_GRACE = 1.0  # seconds between a carrier's SIGTERM and SIGKILL
STDERR_GRACE = 1.0  # seconds to wait for the rest of its stderr once it ended
# exec's answers that mean "no such program here"; others (EMFILE, EAGAIN) are this
# machine's limits, not a missing carrier
CANNOT_EXECUTE = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOEXEC,
                            errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})
SSH_FAILED = 255  # what ssh exits with when it could not connect or authenticate
# Typed at a terminal, these go to the whole foreground process group. Blocked in the
# carrier, they reach the remote command as protocol signals instead of cutting the link.
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT})
_BY_SERVE_EXIT: dict[int, CarrierFailure] = {
    ServeExit.USAGE: CarrierFailure.USAGE,
    ServeExit.CONFIG: CarrierFailure.CONFIG,
    ServeExit.LEASE: CarrierFailure.LEASE,
    ServeExit.UNAVAILABLE: CarrierFailure.UNSUPPORTED,
}

StderrLine = Callable[[bytes], Awaitable[None]]  # given each line, without its newline


def show_on_stderr(target: str) -> StderrLine:
    """Show a carrier's stderr on ours, a whole line at a time, prefixed `TARGET: `."""
    prefix = f"{target}: ".encode()

    async def show(line: bytes) -> None:
        with contextlib.suppress(OSError):
            write_all(2, prefix + line + b"\n")

    return show


def carrier_argv(address: Address, remote_command: str = DEFAULT_REMOTE_COMMAND,
                 persist: bool = False) -> list[str]:
    """The carrier's command line: `ssh [-p PORT] [USER@]HOST -- CMD serve --stdio`, or the
    `via:` command followed by `CMD serve --stdio`; with ``persist``, `--persist` too (the
    far side relays to the user's own server there, so sessions outlive the carrier)."""
    remote = [remote_command, *(PERSIST_ARGUMENTS if persist else STDIO_ARGUMENTS)]
    if address.scheme == "ssh":
        port = ["-p", str(address.port)] if address.port else []
        user = f"{address.user}@" if address.user else ""
        return ["ssh", *port, f"{user}{address.host}", "--", *remote]
    if address.scheme == "via":
        return [*address.command, *remote]
    raise ValueError(f"{address} is not reached through a carrier")


def counts_as_ssh(address: Address) -> bool:
    """An `ssh://` address, or a `via:` carrier whose program is named ssh."""
    return address.scheme == "ssh" or (
        address.scheme == "via" and os.path.basename(address.command[0]) == "ssh")


def classify(returncode: int, ssh: bool) -> CarrierFailure:
    """The contract's table: a carrier's exit status before `welcome`, by remedy
    (``returncode`` is -S for a death by signal S)."""
    if returncode == ExecExit.NOT_FOUND:  # as a shell, ssh or kubectl say "not there"
        return CarrierFailure.NOT_INSTALLED
    if returncode == SSH_FAILED and ssh:
        return CarrierFailure.UNREACHABLE
    return _BY_SERVE_EXIT.get(returncode, CarrierFailure.CRASHED)


def describe_status(returncode: int) -> str:
    """`exit N`, or `killed by signal NAME` (-S is a death by signal S)."""
    if returncode < 0:
        return f"killed by signal {signal_name(-returncode)}"
    return f"exit {returncode}"


@dataclass(eq=False)
class Carrier:
    """A running carrier: its process, the transport on its pipes, and its end."""

    address: Address
    process: subprocess.Popen[bytes]
    transport: PipeTransport
    stderr_fd: int
    on_stderr: StderrLine
    stderr_done: anyio.Event = field(default_factory=anyio.Event)
    welcomed: bool = False  # set by the connection: the far side speaks the protocol

    async def failure(self) -> CarrierError:
        """Why the far side ended before `welcome`: waits for the carrier to end (and for
        its last stderr lines, shown first), then classifies its status."""
        await self.end()
        returncode = self.process.returncode
        assert returncode is not None
        failure = classify(returncode, counts_as_ssh(self.address))
        explanation = f"{CARRIER_FAILURES[failure][1]} ({describe_status(returncode)})"
        return CarrierError(failure, returncode, explanation)

    async def end(self, grace: float = EXIT_GRACE) -> None:
        """Close its stdin, let it end (draining what it still writes) for ``grace``
        seconds, then make it end; return once it is reaped and its stderr is read to the
        end or STDERR_GRACE passed."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                # Its stdout read to the end meanwhile: it never blocks writing to us.
                tg.start_soon(close_gracefully, self.transport, grace + TERM_GRACE)
                for wait, then in ((grace, signal.SIGTERM), (TERM_GRACE, signal.SIGKILL)):
                    with anyio.move_on_after(wait):
                        await self._reaped()
                    if self.process.returncode is not None:
                        break
                    with contextlib.suppress(ProcessLookupError):
                        self.process.send_signal(then)
                await self._reaped()
                tg.cancel_scope.cancel()
            with anyio.move_on_after(STDERR_GRACE):
                await self.stderr_done.wait()

    async def _reaped(self) -> None:
        """Until the carrier has ended and is reaped (a pidfd where there is one)."""
        if self.process.poll() is not None:
            return
        watch = open_exit_watch(self.process.pid)
        try:
            while self.process.poll() is None:
                await watch.wait()
        finally:
            watch.close()

    async def _pump_stderr(self) -> None:
        lines = LineBuffer()
        try:
            while True:
                try:
                    data = os.read(self.stderr_fd, CARRIER_STDERR_READ)
                except BlockingIOError:
                    await anyio.wait_readable(self.stderr_fd)
                    continue
                except OSError:
                    break
                if not data:
                    break
                for line in lines.feed(data):
                    await self.on_stderr(line)
            if (last := lines.flush()) is not None:
                await self.on_stderr(last)
        finally:
            self.stderr_done.set()


def _spawn(argv: list[str], stdin: int, stdout: int, stderr: int,
           env: Mapping[str, str] | None, new_session: bool) -> subprocess.Popen[bytes]:
    """Start the carrier with the terminal's signals blocked (see TERMINAL_SIGNALS)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
    try:
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                close_fds=True, env=env, start_new_session=new_session)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.asynccontextmanager
async def run_carrier(address: Address, on_stderr: StderrLine,
                      remote_command: str = DEFAULT_REMOTE_COMMAND,
                      persist: bool = False, env: Mapping[str, str] | None = None,
                      new_session: bool = False, bulk: bool = False,
                      ) -> AsyncIterator[Carrier]:
    """Start the carrier for ``address`` (with ``env``, else ours; in a session of its own
    with ``new_session``: a server's carrier, which no terminal of ours may signal and
    whose end, if this code is replaced, an orphan reaper may reap); on the way out, end and
    reap it (`Carrier.end`).

    Raises CarrierError (not_installed) when the carrier program cannot be run here, and
    OutOfResources when this machine cannot start it.
    """
    argv = carrier_argv(address, remote_command, persist)
    pipes: list[tuple[int, int]] = []
    try:
        for _ in range(3):  # stdin, stdout, stderr
            pipes.append(os.pipe2(os.O_CLOEXEC))
        process = _spawn(argv, pipes[0][0], pipes[1][1], pipes[2][1], env, new_session)
    except OSError as exc:
        for read_end, write_end in pipes:
            os.close(read_end)
            os.close(write_end)
        if exc.errno in CANNOT_EXECUTE:
            raise CarrierError(CarrierFailure.NOT_INSTALLED, None,
                               f"cannot run the carrier {argv[0]!r} here: "
                               f"{exc.strerror or exc}") from exc
        raise OutOfResources(exc.errno, f"cannot start the carrier {argv[0]!r}: "
                                 f"{exc.strerror or exc}") from exc
    for fd in (pipes[0][0], pipes[1][1], pipes[2][1]):
        os.close(fd)  # the child's ends
    if bulk:  # fewer, larger reads of what the far side sends (a server's carrier)
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipes[1][0], fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    stderr_fd = pipes[2][0]
    os.set_blocking(stderr_fd, False)
    carrier = Carrier(address, process, PipeTransport(pipes[1][0], pipes[0][1]), stderr_fd,
                      on_stderr)
    try:
        async with beside() as tasks:
            tasks.start_soon(carrier._pump_stderr)
            try:
                yield carrier
            finally:
                # cancelled before `welcome` (Ctrl-C while ssh connects): end it at once
                await carrier.end(EXIT_GRACE if carrier.welcomed else NO_WELCOME_GRACE)
    finally:
        with anyio.CancelScope(shield=True):
            await carrier.transport.aclose()
            anyio.notify_closing(stderr_fd)
            os.close(stderr_fd)
            if process.returncode is None:  # only when cancelled from outside mid-way
                process.kill()
                process.wait()
