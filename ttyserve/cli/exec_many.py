"""`ttyserve exec` on many targets: whole lines prefixed `TARGET: `, a summary line per
target, one exit status for all, and a live progress line on a terminal (contracts.md).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import anyio

from ..client.fanout import (
    FDS_PER_TARGET,
    CarrierLine,
    Event,
    FanOut,
    Finished,
    Opened,
    Retrying,
    Target,
    TargetResult,
    fan_out,
    resolve_targets,
)
from ..client.fanout import Output as OutputEvent
from ..client.retry import retriable
from ..credentials import tls_context
from ..errors import CarrierError, ConfigError, RequestError, TargetFailure
from ..exitcodes import ExecExit
from ..lines import LineBuffer, write_all
from ..protocol.messages import error_message, members
from .exec_report import (
    FORWARDED,
    ExecOptions,
    Output,
    carrier_members,
    error_members,
)

PROGRESS_EVERY = 0.1  # seconds between redraws of the progress line, at most
ERASE = b"\r\x1b[K"  # back to the start of the line, and clear it
FD_HEADROOM = 64  # descriptors this process holds besides its targets' (stdio, the loop...)


def _tell(line: str) -> bytes:
    return f"ttyserve: {line}\n".encode()


@dataclass
class Progress:
    """The line at the foot of a terminal's stderr: done, running, failed, of N."""

    total: int
    enabled: bool
    done: int = 0
    failed: int = 0
    shown: bool = False
    running: set[str] = field(default_factory=set)  # targets whose command started
    _drawn_at: float = 0.0

    def erase(self) -> None:
        if self.shown:
            write_all(2, ERASE)
            self.shown = False

    def refresh(self, now: float | None = None) -> None:
        """Draw it again, at most every PROGRESS_EVERY (the ticker draws it after writes
        that took it away, so a stream of output does not redraw it after every line)."""
        now = time.monotonic() if now is None else now
        if not self.enabled or now - self._drawn_at < PROGRESS_EVERY:
            return
        text = (f"ttyserve: {self.done} done, {len(self.running)} running, {self.failed} failed, "
                f"of {self.total}")
        try:
            width = os.get_terminal_size(2).columns or 80  # 0: a terminal never sized
        except OSError:
            width = 80
        write_all(2, ERASE + text[:width - 1].encode())
        self.shown, self._drawn_at = True, now


@dataclass
class Screen:
    """Everything fan-out writes: lines go out whole, never torn, and the progress line is
    taken away before each write and drawn again after."""

    out: Output
    progress: Progress
    buffers: dict[tuple[str, str], LineBuffer] = field(default_factory=dict)

    def write(self, fd: int, data: bytes) -> None:
        self.progress.erase()
        write_all(fd, data)

    def lines(self, target: str, stream: str, data: bytes) -> None:
        buffer = self.buffers.setdefault((target, stream), LineBuffer())
        lines = buffer.feed(data)
        if lines:
            prefix = f"{target}: ".encode()
            self.write(2 if stream == "stderr" else 1,
                       b"".join(prefix + line + b"\n" for line in lines))

    def flush(self, target: str) -> None:
        """A target ended: its last lines, a newline added where there was none."""
        for stream in ("stdout", "stderr"):
            buffer = self.buffers.pop((target, stream), None)
            if buffer is not None and (last := buffer.flush()) is not None:
                self.write(2 if stream == "stderr" else 1, f"{target}: ".encode() + last + b"\n")


def _explain(result: TargetResult) -> str:
    error = result.error
    if isinstance(error, CarrierError):
        return str(error)
    if isinstance(error, RequestError):
        return f"{error.code}: {error.message}"
    if isinstance(error, OSError):
        return f"{result.failure}: cannot connect: {error.strerror or error}"
    if error is not None:
        return f"{result.failure}: {error}"
    assert result.status is not None and result.status.error is not None
    return f"{result.failure}: {result.status.error}"


def _error_members(result: TargetResult, opened: bool) -> dict[str, object]:
    error = result.error
    if isinstance(error, CarrierError):
        return carrier_members(error)
    if isinstance(error, RequestError):
        return {"class": result.failure, **error_members(error_message(error))}
    # once its command started, a target is never retriable: it may have run
    may_retry = not opened and error is not None and retriable(error)[0]
    return {"class": result.failure, "retriable": may_retry, "message": _explain(result)}


def _show(event: Event, screen: Screen, results: dict[str, TargetResult]) -> None:
    out, progress = screen.out, screen.progress
    target = event.target
    if isinstance(event, OutputEvent):
        if out.as_json:
            out.data(event.stream, event.data, target=target)
        else:
            screen.lines(target, event.stream, event.data)
    elif isinstance(event, CarrierLine):
        screen.write(2, f"{target}: ".encode() + event.line + b"\n")
    elif isinstance(event, Opened):
        progress.running.add(target)
        out.event("opened", target=target, pid=event.pid)
    elif isinstance(event, Retrying):
        error = event.error
        what = str(error) if isinstance(error, CarrierError | RequestError) else (
            f"cannot connect: {getattr(error, 'strerror', None) or error}")
        screen.write(2, _tell(f"{target}: {what}; retrying in {event.delay:.2f}s "
                              f"({event.attempt}/{event.retries})"))
    elif isinstance(event, Finished):
        result = results[target] = event.result
        screen.flush(target)
        opened = target in progress.running
        progress.running.discard(target)
        if result.failure is not None:  # said as it happens; the summary repeats the class
            screen.write(2, _tell(f"{target}: {_explain(result)}"))
            if result.status is None:
                out.event("error", target=target, **_error_members(result, opened))
        if result.status is not None:
            out.event("exit", target=target, **members(result.status))
        if result.summary.startswith("failed"):
            progress.failed += 1
        else:
            progress.done += 1
    progress.refresh()


async def _forward_signals(fan: FanOut, signals: AsyncIterator[int],
                           scope: anyio.CancelScope, interrupted: list[bool]) -> None:
    """INT, TERM, HUP and QUIT go to every running command; a second INT cancels all."""
    async for signum in signals:
        if signum == signal.SIGINT and interrupted:
            scope.cancel()
            return
        if signum == signal.SIGINT:
            interrupted.append(True)
        await fan.signal(FORWARDED[signal.Signals(signum)])


async def _ticker(progress: Progress) -> None:
    while True:
        await anyio.sleep(PROGRESS_EVERY)
        progress.refresh()


async def _fan_out(options: ExecOptions, targets: Sequence[Target], parallel: int) -> int:
    resolved = resolve_targets(targets)
    names = [name for name, _, _ in resolved]
    tls = None
    if any(address.encrypted for _, address, _ in resolved):
        try:
            tls = tls_context("client", cafile=options.tls_ca)
        except ConfigError as exc:
            sys.stderr.write(f"ttyserve exec: {exc}\n")
            return ExecExit.FAILURE
    progress = Progress(len(names), enabled=os.isatty(2))
    screen = Screen(Output(options.json), progress)
    results: dict[str, TargetResult] = {}
    interrupted: list[bool] = []
    stdout_closed = False
    with anyio.open_signal_receiver(*FORWARDED) as signals, anyio.CancelScope() as cancel:
        async with fan_out(options.argv, targets, parallel=parallel, env=options.env,
                           cwd=options.cwd, token=options.token, tls=tls,
                           retries=options.retries,
                           remote_command=options.remote_command) as fan, \
                anyio.create_task_group() as tg:
            tg.start_soon(_forward_signals, fan, signals, cancel, interrupted)
            if progress.enabled:
                tg.start_soon(_ticker, progress)
            progress.refresh()
            try:
                async for event in fan:
                    _show(event, screen, results)
            except BrokenPipeError:  # our stdout was closed (`| head`): stop every target
                stdout_closed = True
            tg.cancel_scope.cancel()
    progress.erase()
    codes = []
    for name in names:
        result = results.get(name) or TargetResult(name, failure=TargetFailure.CANCELLED)
        codes.append(result.exit_code)
        write_all(2, _tell(f"{name}: {result.summary}"))
    if cancel.cancel_called:
        return ExecExit.INTERRUPTED
    if stdout_closed:
        return ExecExit.SIGNAL_BASE + signal.SIGPIPE  # as `exec` with one target says it
    return max(codes)


def fit_descriptors(parallel: int) -> int:
    """How many targets may run at once within RLIMIT_NOFILE: the soft limit is raised as
    far as ``parallel`` targets need (the hard limit at most); beyond that, fewer run."""
    need = parallel * FDS_PER_TARGET + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need <= soft:
        return parallel
    raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    fits = max(1, (soft - FD_HEADROOM) // FDS_PER_TARGET)
    if fits < parallel:
        sys.stderr.write(f"ttyserve exec: --parallel {parallel} needs about {need} "
                         f"descriptors, and this process may open {soft} (ulimit -n): "
                         f"running at most {fits} at once\n")
    return min(fits, parallel)


def fanout_main(options: ExecOptions, targets: Sequence[Target], parallel: int) -> int:
    """Run on every target (addresses as given, or a door's targets), at most ``parallel`` at
    once; the exit status for all."""
    parallel = fit_descriptors(min(parallel, len(targets)))
    return anyio.run(_fan_out, options, targets, parallel)
