"""A target's carrier connection: one carrier (backends/carrier.py) running the target's far
side, `serve --stdio --persist`, and one multiplexed protocol-v1 connection over its pipes
that carries every session this worker has on the target, a channel each.

The link is the far side's client (protocol/client.py checks every frame it gets): it
grants each channel `--target-window` of output credit, and each session's process
(process.py) grants it back as its own pump takes the output, so nothing here waits on a
channel and nothing buffers more than a window per session. Its carrier runs with this
server's credentials (ssh keys, kubeconfig) and without its `TTYSERVE_*` variables.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ...backends.carrier import run_carrier
from ...defaults import CLIENT_NAME, CLIENT_RECEIVE
from ...errors import (
    CARRIER_FAILURES,
    CarrierError,
    CarrierFailure,
    LocalProtocolError,
    RemoteProtocolError,
)
from ...protocol.client import (
    AttachedReceived,
    ClientConnection,
    ClientEvent,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    NoticeReceived,
    OpenedReceived,
    OpenRefused,
    OutputReceived,
    PingReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ...protocol.messages import Attach, Error, Exit, Hello, Modes, Open
from ...transport.outbox import Outbox

if TYPE_CHECKING:
    from .config import Target
    from .process import RemoteProcess

log = logging.getLogger("ttyserve")

_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


def carrier_environment() -> dict[str, str]:
    """This server's environment without its own `TTYSERVE_*` variables (its token among
    them): what a target's carrier runs with."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith("TTYSERVE_")}


class TargetLink:
    """One carrier connection to a target, in one worker."""

    def __init__(self, target: Target, window: int, on_over: Callable[[TargetLink], None]) -> None:
        self.target = target
        self.window = window
        self.core = ClientConnection()
        self.outbox: Outbox
        self.processes: dict[int, RemoteProcess] = {}  # by channel
        self._next_channel = 1
        self.welcomed = anyio.Event()  # set at `welcome`, or when it failed before it
        self.welcomed_at_start = False  # whether `welcome` came
        self.failure: Error | None = None  # how it failed before `welcome`
        self.over = False
        self.ended = anyio.Event()  # its carrier is reaped
        self.last_stderr = ""  # the carrier's last line of stderr
        self._on_over = on_over
        self._scope = anyio.CancelScope()

    async def run(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the carrier, speak the protocol over it until it ends or `close`; then
        each session it carried learns so."""
        target = self.target
        try:
            with self._scope:
                async with run_carrier(target.address, self._stderr, target.remote_command,
                                       target.persist, carrier_environment(),
                                       new_session=True, bulk=True) as carrier:
                    self.outbox = Outbox(carrier.transport)
                    self.outbox.attach(task_group)
                    self.send(self.core.hello(Hello(
                        protocol=1, multiplex=True, window=self.window, client=CLIENT_NAME)))
                    try:
                        await self._relay(carrier.transport)
                    finally:
                        carrier.welcomed = self.welcomed_at_start
                        self.outbox.abort()
                        if self.welcomed_at_start:  # (its sessions resume now, not once
                            self._end_sessions()  # the carrier has had its grace to end)
                    if not self.welcomed_at_start:
                        failure = await carrier.failure()
                        self._failed(failure.failure, failure.explanation, failure.retriable)
        except CarrierError as exc:
            self._failed(exc.failure, exc.explanation, exc.retriable)
        except OSError as exc:  # this machine could not start it (crashed: retriable)
            self._failed(CarrierFailure.CRASHED, "the carrier could not be started: "
                         f"{exc.strerror or exc}", CARRIER_FAILURES[CarrierFailure.CRASHED][0])
        finally:
            self._end_sessions()
            self.welcomed.set()
            self.ended.set()

    def _end_sessions(self) -> None:
        """The connection is over: each session it carried learns so (once)."""
        if self.over:
            return
        self.over = True
        processes, self.processes = self.processes, {}
        self._on_over(self)
        for process in processes.values():
            process.lost()

    def close(self) -> None:
        """End the carrier (its stdin closed: the far side lets go of its sessions)."""
        self._scope.cancel()

    def begin(self, process: RemoteProcess, request: Open | Attach) -> int:
        """Send ``request`` on a new channel for ``process``; the channel."""
        channel = self._next_channel
        self._next_channel += 1
        self.processes[channel] = process
        self.send(self.core.open(channel, request))
        return channel

    def forget(self, channel: int) -> None:
        self.processes.pop(channel, None)

    def send(self, *frames: bytes) -> None:
        if not self.over:
            try:
                self.outbox.push([frame for frame in frames if frame])
            except anyio.BrokenResourceError:
                pass  # the reader sees the carrier end

    async def _relay(self, transport: Any) -> None:
        try:
            while True:
                self.core.receive_data(await transport.receive(CLIENT_RECEIVE))
                while (event := self.core.next_event()) is not None:
                    self._dispatch(event)
        except RemoteProtocolError as exc:
            log.error("target %s: the far side broke the protocol: %s", self.target.name, exc)
        except LocalProtocolError as exc:
            log.error("target %s: %s", self.target.name, exc)
        except _GONE:
            pass
        except Exception:  # a fault of ours ends this connection, not the worker
            log.exception("target %s: the connection failed", self.target.name)

    def _dispatch(self, event: ClientEvent) -> None:
        to_process = _TO_PROCESS.get(type(event))
        if to_process is not None:
            channel = event.channel  # type: ignore[union-attr]
            last = isinstance(event, OpenRefused | ExitReceived | DetachedReceived)
            process = (self.processes.pop if last else self.processes.get)(channel, None)
            if process is not None:
                to_process(process, event)
        elif isinstance(event, PingReceived):
            self.send(self.core.pong())
        elif isinstance(event, WelcomeReceived):
            self.welcomed_at_start = True
            self.welcomed.set()
        elif isinstance(event, ErrorReceived):
            log.warning("target %s: %s: %s", self.target.name, event.error.code,
                        event.error.message)

    def _failed(self, failure: str, explanation: str, retriable: bool) -> None:
        line = f"; its stderr: {self.last_stderr}" if self.last_stderr else ""
        self.failure = Error(code=str(failure), message=f"{failure}: {explanation}{line}",
                             retriable=retriable)

    async def _stderr(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if text:
            self.last_stderr = text
            log.warning("target %s: %s", self.target.name, text)


def _detached(process: RemoteProcess, event: DetachedReceived) -> None:
    process.exited(Exit(code=-1, error=f"the target detached the session ({event.reason})"))


# What each event of a channel does to its session's process.
_TO_PROCESS: dict[type, Callable[[RemoteProcess, Any], None]] = {
    OutputReceived: lambda process, event: process.output(event.kind, event.data),
    StdinCreditGranted: lambda process, event: process.credit(),
    OpenedReceived: lambda process, event: process.opened(event.opened),
    AttachedReceived: lambda process, event: process.attached(event.attached),
    OpenRefused: lambda process, event: process.refused(event.error),
    ExitReceived: lambda process, event: process.exited(event.exit),
    DetachedReceived: _detached,
    NoticeReceived: lambda process, event: (
        process.modes(event.notice) if isinstance(event.notice, Modes) else None),
}
