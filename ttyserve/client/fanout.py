"""One command on many targets, at most ``parallel`` at once, as a stream of events.

    async with fan_out(["uptime"], ["ssh://web1", "ssh://web2"]) as events:
        async for event in events:
            ...

    results = await run_many(["uptime"], targets, parallel=32)

A target is an address, or a `DoorTarget`: a target of a door (protocol section 15), its
session opened through the door's address, named by the target's name.
Each target gets an empty stdin (as pdsh). A target that cannot be reached, or whose
carrier fails, ends with a failure class and never stops the others. Every target's
events come in order: its output, then one `Finished` with its result.
"""

from __future__ import annotations

import contextlib
import errno
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..addresses import Address, parse_address
from ..defaults import DEFAULT_PARALLEL, DEFAULT_REMOTE_COMMAND
from ..errors import (
    CarrierError,
    ConnectionLost,
    ErrorCode,
    OutOfResources,
    ProtocolError,
    RemoteProtocolError,
    RequestError,
    TargetFailure,
    TtyserveError,
)
from ..exitcodes import ExecExit, exec_exit_code, exec_spawn_failure_code
from ..protocol.messages import Exit, SignalName
from ..transport.background import beside
from .api import connect
from .retry import backoff, retriable
from .session import Session

EVENT_BUFFER = 64  # events waiting for the consumer before targets wait for it
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})
# descriptors one running target holds here: its carrier's three pipe ends and its exit
# watch (starting one takes four more for a moment; carriers start one at a time)
FDS_PER_TARGET = 4


@dataclass(frozen=True, slots=True)
class TargetResult:
    """How one target ended: ``status`` when the command ran to its end, else ``failure``
    (a class such as ``unreachable``) and ``error``. ``run_many`` fills in the output."""

    target: str
    status: Exit | None = None
    failure: str | None = None
    error: BaseException | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    carrier_stderr: bytes = b""

    @property
    def exit_code(self) -> int:
        """What `ttyserve exec` would exit with for this target alone."""
        if self.status is not None:
            return exec_exit_code(self.status)
        error = self.error
        if isinstance(error, RequestError) and error.code == ErrorCode.SPAWN_FAILED:
            return exec_spawn_failure_code(error.errno)
        return ExecExit.FAILURE

    @property
    def summary(self) -> str:
        """`exit N`, `killed by signal NAME` or `failed: CLASS` (contracts.md)."""
        status = self.status
        if status is not None and status.error is None:
            if status.signal is not None:
                return f"killed by signal {status.signal}"
            return f"exit {self.exit_code}"
        if self.exit_code != ExecExit.FAILURE:  # a spawn failure counts as the shell's 126/127
            return f"exit {self.exit_code}"
        return f"failed: {self.failure or TargetFailure.WAIT_FAILED}"


@dataclass(frozen=True, slots=True)
class DoorTarget:
    """A target behind a door (`serve --targets`): its session is opened through ``door``,
    the `open` naming ``name``, which names it in every event too."""

    door: Address
    name: str

    def __str__(self) -> str:
        return self.name


# One target resolved: its name, the address to connect to, and the door's target it opens
# (None: the address's own host).
Resolved = tuple[str, Address, str | None]


@dataclass(frozen=True, slots=True)
class Opened:
    target: str
    pid: int | None


@dataclass(frozen=True, slots=True)
class Output:
    target: str
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True, slots=True)
class CarrierLine:
    """A line the target's carrier wrote on its stderr (without its newline)."""

    target: str
    line: bytes


@dataclass(frozen=True, slots=True)
class Retrying:
    target: str
    error: BaseException
    delay: float  # seconds until the next try
    attempt: int  # the try that failed, from 1
    retries: int


@dataclass(frozen=True, slots=True)
class Finished:
    target: str
    result: TargetResult


Event = Opened | Output | CarrierLine | Retrying | Finished


def failure_class(error: BaseException) -> str:
    """How a target failed, in one word: a carrier's class (contracts.md), an error code
    the server answered with, or `unreachable`, `lost`, `protocol_error`, `no_resources`,
    `cancelled`."""
    if isinstance(error, CarrierError):
        return str(error.failure)
    if isinstance(error, RequestError):
        return str(error.code)
    if isinstance(error, ProtocolError):
        return TargetFailure.PROTOCOL_ERROR
    if isinstance(error, ConnectionLost):
        return TargetFailure.LOST
    if isinstance(error, OSError):
        short = isinstance(error, OutOfResources) or error.errno in RESOURCE_ERRNOS
        return TargetFailure.NO_RESOURCES if short else TargetFailure.UNREACHABLE
    return TargetFailure.CANCELLED


@dataclass(frozen=True)
class _Job:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    token: str | None
    tls: ssl.SSLContext | None
    retries: int
    remote_command: str


class FanOut:
    """The running fan-out: iterate it for events; `signal` reaches every running command."""

    def __init__(self, job: _Job, targets: list[Resolved], parallel: int,
                 send: MemoryObjectSendStream[Event],
                 receive: MemoryObjectReceiveStream[Event]) -> None:
        self._job = job
        self._targets = targets
        self._slots = anyio.Semaphore(parallel)
        self._send = send
        self._receive = receive
        self.targets = [name for name, _, _ in targets]  # as given, duplicates dropped
        self.running: dict[str, Session] = {}  # target: its session, while its command runs

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._receive

    async def signal(self, name: SignalName) -> None:
        """Send a signal to the command on every target where it runs now."""
        for session in list(self.running.values()):
            with contextlib.suppress(ConnectionLost, RemoteProtocolError):
                await session.signal(name)

    async def _run(self) -> None:
        async with self._send, anyio.create_task_group() as tg:
            for target in self._targets:
                await self._slots.acquire()
                tg.start_soon(self._target, target)

    async def _target(self, target: Resolved) -> None:
        name = target[0]
        try:
            await self._send.send(Finished(name, await self._attempts(target)))
        finally:
            self.running.pop(name, None)
            self._slots.release()

    async def _attempts(self, target: Resolved) -> TargetResult:
        job, name = self._job, target[0]
        for attempt in range(job.retries + 1):
            try:
                return await self._try(target)
            except (TtyserveError, OSError) as exc:  # one target's failure is only its own
                may_retry, hint = retriable(exc)
                if not may_retry or attempt == job.retries:
                    return TargetResult(name, failure=failure_class(exc), error=exc)
                delay = backoff(attempt, hint)
                await self._send.send(Retrying(name, exc, delay, attempt + 1, job.retries))
                await anyio.sleep(delay)
        raise AssertionError("unreachable")

    async def _try(self, target: Resolved) -> TargetResult:
        """One try; raises what may be retried only while nothing has started."""
        job, send = self._job, self._send
        name, address, on = target

        async def carrier_line(line: bytes) -> None:
            await send.send(CarrierLine(name, line))

        result: TargetResult | None = None
        opened = False
        try:
            async with connect(address, token=job.token, tls=job.tls,
                               remote_command=job.remote_command,
                               carrier_stderr=carrier_line) as conn:
                session = await conn.spawn(job.argv, pty=False, env=job.env, cwd=job.cwd,
                                           target=on)
                self.running[name] = session
                opened = True
                await send.send(Opened(name, session.pid))
                await session.eof()
                async for chunk in session:
                    await send.send(Output(name, chunk.stream, chunk.data))
                assert session.status is not None
                status = session.status
                failure = TargetFailure.WAIT_FAILED if status.error is not None else None
                result = TargetResult(name, status=status, failure=failure)
        except (TtyserveError, OSError) as exc:
            if result is not None:
                return result  # the exit arrived; only the way out failed
            if opened:  # the command started: never retried, whatever happened
                return TargetResult(name, failure=failure_class(exc), error=exc)
            raise
        assert result is not None
        return result


Target = str | Address | DoorTarget


def resolve_targets(targets: Sequence[Target]) -> list[Resolved]:
    """Each target as given (its name in every event) with the address to connect to and the
    door's target; the first of duplicates only. Raises AddressError naming an address that
    does not parse."""
    resolved: dict[str, Resolved] = {}
    for target in targets:
        name = str(target)
        if name in resolved:
            continue
        if isinstance(target, DoorTarget):
            resolved[name] = (name, target.door, target.name)
        else:
            address = target if isinstance(target, Address) else parse_address(target)
            resolved[name] = (name, address, None)
    return list(resolved.values())


@contextlib.asynccontextmanager
async def fan_out(
    argv: Sequence[str],
    targets: Sequence[Target],
    *,
    parallel: int = DEFAULT_PARALLEL,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    retries: int = 0,
    remote_command: str = DEFAULT_REMOTE_COMMAND,
) -> AsyncIterator[FanOut]:
    """Run ``argv`` on every target, at most ``parallel`` at once; iterate for events.

    Leaving the block early cancels what still runs (each far side cancels its
    command) and ends every carrier. Retries (``retries``) apply per target, to
    what may pass, and only before its command started.
    """
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    job = _Job(list(argv), dict(env or {}), cwd, token, tls, retries, remote_command)
    send, receive = anyio.create_memory_object_stream[Event](EVENT_BUFFER)
    fan = FanOut(job, resolve_targets(targets), parallel, send, receive)
    async with receive, beside() as tasks:
        tasks.start_soon(fan._run)
        yield fan


async def run_many(
    argv: Sequence[str],
    targets: Sequence[Target],
    *,
    parallel: int = DEFAULT_PARALLEL,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    retries: int = 0,
    remote_command: str = DEFAULT_REMOTE_COMMAND,
) -> list[TargetResult]:
    """Run ``argv`` on every target; one result per target, in the order given, each
    with its exit status (or failure class) and its captured output."""
    outputs: dict[str, dict[str, list[bytes]]] = {}
    results: dict[str, TargetResult] = {}
    async with fan_out(argv, targets, parallel=parallel, env=env, cwd=cwd, token=token,
                       tls=tls, retries=retries, remote_command=remote_command) as fan:
        names = fan.targets
        async for event in fan:
            captured = outputs.setdefault(event.target, {})
            if isinstance(event, Output):
                captured.setdefault(event.stream, []).append(event.data)
            elif isinstance(event, CarrierLine):
                captured.setdefault("carrier", []).append(event.line + b"\n")
            elif isinstance(event, Finished):
                captured = outputs.pop(event.target, {})
                results[event.target] = replace(
                    event.result, stdout=b"".join(captured.get("stdout", [])),
                    stderr=b"".join(captured.get("stderr", [])),
                    carrier_stderr=b"".join(captured.get("carrier", [])))
    return [results[name] for name in names]
