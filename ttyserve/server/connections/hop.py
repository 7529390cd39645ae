"""A hop: one client connection's link to another worker, where sessions it asks for live.

The link is a protocol-v1 connection of its own (mesh.py), the client's mirror: the same
window, the same channel numbers, the client's identity. What the client sends for a
session there goes on over it as it came (stdin, credit, resize, signal, detach, cancel), and
what comes back is framed to the client by its own core, so section 7's credit, section
10's offsets and section 11's roles hold across the hop by the rules that hold everywhere
else. The far worker never sends more than the client granted: the client's grants are
its grants. Only channel 0 is answered here: `list` gathered from every worker, and the
answers to `share`, `unshare` and a grant's `hello` taken from the worker that holds them.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from ...defaults import SERVER_RECEIVE
from ...errors import ErrorCode, RemoteProtocolError, RequestError
from ...protocol.client import (
    AnswerReceived,
    AttachedReceived,
    ClientConnection,
    ClientEvent,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    NoticeReceived,
    OpenRefused,
    OutputReceived,
    SessionsReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ...protocol.messages import (
    Attach,
    Audience,
    Error,
    Exit,
    Hello,
    Message,
    Sessions,
    Shared,
    Skipped,
    Unshared,
    Window,
)
from ...protocol.server import ServerConnection
from ...transport.outbox import Outbox, TaskStarter
from ...transport.streams import Buffer, SocketTransport
from ..auth import Peer
from ..mesh import Mesh

log = logging.getLogger("ttyserve")

_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)
DIAL_TRIES = 50  # a full backlog (the other worker busy or upgrading): tried again, 10 ms apart
WORKER_LOST = "the worker process that ran this session stopped: its status is unknown"


class HopHost(Protocol):
    """What a hop needs of the connection it works for (ConnectionHandler)."""

    core: ServerConnection
    outbox: Outbox

    def flush(self) -> None: ...
    def end_remote(self, channel: int, last: Exit | str | None) -> None: ...
    def hop_lost(self, hop: Hop, error: Error | None) -> None: ...


def refusal(error: Error) -> RequestError:
    """The far worker's `error`, to say to the client as it was said."""
    return RequestError(error.code, error.message, errno=error.errno,
                        retry_after_ms=error.retry_after_ms)


async def dial(path: str) -> socket.socket:
    """A connected link socket to another worker. Raises OSError."""
    for attempt in range(DIAL_TRIES):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            if attempt == DIAL_TRIES - 1:
                raise
            await anyio.sleep(0.01)
        except BaseException:
            sock.close()
            raise
    raise AssertionError("unreachable")


class Hop:
    """One link, for one client connection, to the worker in ``slot``."""

    def __init__(self, host: HopHost, slot: int, sock: socket.socket, tasks: TaskStarter,
                 max_frame: int) -> None:
        self.host = host
        self.slot = slot
        self.core = ClientConnection(max_frame)
        self.transport = SocketTransport(sock)
        self.outbox = Outbox(self.transport)
        self.outbox.attach(tasks)
        self.channels: set[int] = set()  # the client's channels it carries
        self._welcome = anyio.Event()
        self._answer: anyio.Event | None = None  # a request on channel 0 waits
        self._attaching: anyio.Event | None = None  # an attach waits for its answer
        self._answered: Any = None
        self.error: Error | None = None  # how the far worker closed the link, if it said
        self.over = False
        self._scope = anyio.CancelScope()

    @classmethod
    async def open(cls, host: HopHost, mesh: Mesh, slot: int, peer: Peer,
                   principal: str | None, hello: Hello, tasks: TaskStarter,
                   max_frame: int) -> Hop:
        """Dial ``slot``'s worker, say who the client is and mirror its `hello`; the hop once
        welcomed. Raises RequestError: the worker's refusal, or that it cannot be reached."""
        try:
            sock = await dial(mesh.link_path(slot))
        except OSError as exc:
            raise RequestError(ErrorCode.BUSY, f"worker {slot} cannot be reached: "
                               f"{exc.strerror}", retry_after_ms=250) from None
        hop = cls(host, slot, sock, tasks, max_frame)
        tasks.start_soon(hop.run)
        hop.send(mesh.link_hello(peer, principal), hop.core.hello(Hello(
            protocol=1, multiplex=True, window=hello.window, grant=hello.grant)))
        await hop._welcome.wait()
        if hop.over:
            hop.close()
            error = hop.error
            raise refusal(error) if error is not None else RequestError(
                ErrorCode.BUSY, f"worker {slot} closed the link", retry_after_ms=250)
        return hop

    @property
    def welcome(self) -> Any:
        return self.core.welcome

    # --- what the client sends, on ------------------------------------------------

    def send(self, *frames: bytes) -> None:
        if not self.over:
            try:
                self.outbox.push(list(frames))
            except anyio.BrokenResourceError:
                pass  # the reader sees the link end

    async def attach(self, channel: int, request: Attach) -> bool:
        """Send the client's `attach` on and wait for the answer, framed to the client by
        then (its core answers requests in order); False when the link ended first."""
        self.channels.add(channel)
        self._attaching = anyio.Event()
        self.send(self.core.open(channel, request))
        await self._attaching.wait()
        self._attaching = None
        return not self.over or not self.core.opening(channel)

    def stdin(self, channel: int, data: Buffer) -> None:
        if self.core.live(channel):
            self.send(self.core.stdin(channel, bytes(data)))

    def control(self, channel: int, message: Message) -> None:
        if self.core.live(channel):
            self.send(self.core.control(channel, message))

    def window(self, channel: int, size: int) -> None:
        self.control(channel, Window(bytes=size))

    def cancel(self, channel: int) -> None:
        self.channels.discard(channel)
        self.send(self.core.cancel(channel))

    async def ask(self, frame: bytes) -> Sessions | Shared | Unshared | Error | None:
        """Send a request on channel 0 and wait for its answer (None: the link ended)."""
        self._answer, self._answered = anyio.Event(), None
        self.send(frame)
        await self._answer.wait()
        return self._answered  # type: ignore[no-any-return]

    # --- what comes back -----------------------------------------------------------

    async def run(self) -> None:
        """Relay the far worker's frames to the client, as fast as the client takes them."""
        try:
            with self._scope:
                while True:
                    self.core.receive_data(await self.transport.receive(SERVER_RECEIVE))
                    while (event := self.core.next_event()) is not None:
                        self._relay(event)
                    self.host.flush()
                    await self.host.outbox.wait_for_room()
        except RemoteProtocolError as exc:
            log.error("link to worker %d: %s", self.slot, exc)
        except _GONE:
            pass
        finally:
            self.over = True
            self._welcome.set()
            for waiting in (self._answer, self._attaching):
                if waiting is not None:
                    waiting.set()
            self.outbox.abort()
            await self.transport.aclose()
            self.outbox.release()
            if self.channels:
                self.host.hop_lost(self, self.error)

    def close(self) -> None:
        """The client's connection ends: the far worker lets go of its sessions (detached),
        told at once (the socket shut down here, before its task closes it)."""
        self.channels.clear()
        with contextlib.suppress(OSError):
            self.transport.sock.shutdown(socket.SHUT_RDWR)
        self._scope.cancel()

    def _relay(self, event: ClientEvent) -> None:
        relay = _RELAYS.get(type(event))
        if relay is not None:
            relay(self, event)

    def _welcomed(self, event: WelcomeReceived) -> None:
        self._welcome.set()

    def _attached(self, event: AttachedReceived) -> None:
        self.host.core.attached(event.channel, event.attached)
        if self._attaching is not None:
            self._attaching.set()

    def _refused(self, event: OpenRefused) -> None:
        self.channels.discard(event.channel)
        self.host.core.refuse(event.channel, refusal(event.error))
        if self._attaching is not None:
            self._attaching.set()

    def _output(self, event: OutputReceived) -> None:
        self.host.core.send_output(event.channel, event.kind, event.data)

    def _exit(self, event: ExitReceived) -> None:
        self.channels.discard(event.channel)
        self.host.end_remote(event.channel, event.exit)

    def _detached(self, event: DetachedReceived) -> None:
        self.channels.discard(event.channel)
        self.host.end_remote(event.channel, event.reason)

    def _error(self, event: ErrorReceived) -> None:
        if event.channel == 0:  # the far worker closes the link (restarting, shutting down)
            self.error = event.error
        else:
            self.host.core.refuse(event.channel, refusal(event.error))

    def _credit(self, event: StdinCreditGranted) -> None:
        self.host.core.stdin_consumed(event.channel, event.bytes)

    def _notice(self, event: NoticeReceived) -> None:
        notice, core = event.notice, self.host.core
        if isinstance(notice, Skipped) and notice.offsets is not None:
            core.send_skipped(event.channel, notice.bytes, notice.offsets)
        elif isinstance(notice, Audience):
            core.send_audience(event.channel, notice.observers)

    def _answered_now(self, event: SessionsReceived | AnswerReceived) -> None:
        self._answered = (event.sessions if isinstance(event, SessionsReceived)
                          else event.answer)
        if self._answer is not None:
            self._answer.set()


_RELAYS: dict[type, Callable[[Hop, Any], None]] = {
    WelcomeReceived: Hop._welcomed,
    AttachedReceived: Hop._attached,
    OpenRefused: Hop._refused,
    OutputReceived: Hop._output,
    ExitReceived: Hop._exit,
    DetachedReceived: Hop._detached,
    ErrorReceived: Hop._error,
    StdinCreditGranted: Hop._credit,
    NoticeReceived: Hop._notice,
    SessionsReceived: Hop._answered_now,
    AnswerReceived: Hop._answered_now,
}
