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
from ...errors import ErrorCode, LocalProtocolError, RemoteProtocolError, RequestError
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
    Detach,
    Error,
    Exit,
    Hello,
    Message,
    Modes,
    Sessions,
    Shared,
    Skipped,
    Targets,
    Unshared,
    Window,
)
from ...transport.outbox import Outbox, TaskStarter
from ...transport.streams import SocketTransport
from ..auth import Peer
from ..channels.attachment import ChannelHost
from ..channels.route import Later
from ..mesh import Mesh

log = logging.getLogger("ttyserve")

_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)
DIAL_TRIES = 50  # a full backlog (the other worker busy or upgrading): tried again, 10 ms apart
WORKER_LOST = "the worker process that ran this session stopped: its status is unknown"


class HopHost(ChannelHost, Protocol):
    """What a hop needs of the connection it works for (ConnectionHandler): the channels'
    frames, as any route sends them, and the pace of its send queue."""

    outbox: Outbox

    def flush(self) -> None: ...


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


class RemoteChannel:
    """The route of a client channel whose session lives in another worker: what the
    client sends on it goes on over the hop as it came (route.py)."""

    __slots__ = ("channel", "hop")
    ends_on_upgrade = False  # (the far worker's own upgrade ends what it must)

    def __init__(self, hop: Hop, channel: int) -> None:
        self.hop = hop
        self.channel = channel

    def stdin(self, data: bytes) -> Later | None:
        hop = self.hop
        if hop.core.live(self.channel):
            hop.send(hop.core.stdin(self.channel, data))
        return None if hop.outbox.has_room else hop.outbox.wait_for_room

    def credit(self, size: int) -> None:
        self.control(Window(bytes=size))

    def control(self, message: Message) -> None:
        hop = self.hop
        if hop.core.live(self.channel):
            hop.send(hop.core.control(self.channel, message))

    def resume(self) -> None:
        """(The hop waits for the connection's room itself.)"""

    def detach(self) -> None:
        self.control(Detach())

    def cancel(self) -> None:
        self.hop.channels.pop(self.channel, None)
        self.hop.send(self.hop.core.cancel(self.channel))

    def close(self) -> None:
        """(The hop's close lets go of every channel it carries at once.)"""

    def end(self, last: Exit | str | None) -> None:
        """The far side's last frame for the channel, `exit` or `detached`."""
        self.hop.channels.pop(self.channel, None)
        self.hop.host.end_channel(self, last)


class Hop:
    """One link, for one client connection, to the worker in ``slot``.

    Its rules: the client's grants of credit are the far worker's (a `window` goes on as it
    came), and the client's core checks every relayed output frame against them, so a far
    worker that sent more than was granted breaks the link, whose channels then end as a
    lost worker's do (exit -1, WORKER_LOST); its requests on channel 0 are asked one at a
    time, each waiting for its answer."""

    def __init__(self, host: HopHost, slot: int, sock: socket.socket, tasks: TaskStarter,
                 max_frame: int, on_lost: Callable[[Hop], None]) -> None:
        self.host = host
        self.slot = slot
        self.core = ClientConnection(max_frame)
        self.transport = SocketTransport(sock)
        self.outbox = Outbox(self.transport)
        self.outbox.attach(tasks)
        self.channels: dict[int, RemoteChannel] = {}  # the client's channels it carries
        self._on_lost = on_lost
        self._welcome = anyio.Event()
        self._asking = anyio.Lock()  # one request on channel 0 at a time
        self._answer: anyio.Event | None = None  # the request on channel 0 waits
        self._answered: Any = None
        self._attaching: dict[int, anyio.Event] = {}  # attaches waiting for their answer
        self.error: Error | None = None  # how the far worker closed the link, if it said
        self.over = False
        self._scope = anyio.CancelScope()

    @classmethod
    async def open(cls, host: HopHost, mesh: Mesh, slot: int, peer: Peer,
                   principal: str | None, hello: Hello, tasks: TaskStarter,
                   max_frame: int, on_lost: Callable[[Hop], None]) -> Hop:
        """Dial ``slot``'s worker, say who the client is and mirror its `hello`; the hop once
        welcomed. Raises RequestError: the worker's refusal, or that it cannot be reached."""
        try:
            sock = await dial(mesh.link_path(slot))
        except OSError as exc:
            raise RequestError(ErrorCode.BUSY, f"worker {slot} cannot be reached: "
                               f"{exc.strerror}", retry_after_ms=250) from None
        hop = cls(host, slot, sock, tasks, max_frame, on_lost)
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

    async def attach(self, channel: int, request: Attach) -> RemoteChannel | None:
        """Send the client's `attach` on and wait for its answer, framed to the client by
        then: the channel's route (attached, or refused and told so); None when the link
        ended first."""
        route = self.channels[channel] = RemoteChannel(self, channel)
        answered = self._attaching[channel] = anyio.Event()
        self.send(self.core.open(channel, request))
        await answered.wait()
        self._attaching.pop(channel, None)
        return None if self.over and self.core.opening(channel) else route

    async def ask(self, frame: bytes) -> Sessions | Shared | Unshared | Targets | Error | None:
        """Send a request on channel 0 and wait for its answer (None: the link ended)."""
        async with self._asking:
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
        except LocalProtocolError as exc:  # more than the client granted, say
            log.error("link to worker %d broke the client's protocol: %s", self.slot, exc)
        except _GONE:
            pass
        finally:
            self.over = True
            self._welcome.set()
            for waiting in (self._answer, *self._attaching.values()):
                if waiting is not None:
                    waiting.set()
            self.outbox.abort()
            await self.transport.aclose()
            self.outbox.release()
            if self.channels:
                self._on_lost(self)

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
        if (route := self.channels.get(event.channel)) is not None:
            self.host.frame_attached(route, event.attached)
        if (answered := self._attaching.get(event.channel)) is not None:
            answered.set()

    def _refused(self, event: OpenRefused) -> None:
        self.channels.pop(event.channel, None)
        self.host.refuse(event.channel, refusal(event.error))
        if (answered := self._attaching.get(event.channel)) is not None:
            answered.set()

    def _output(self, event: OutputReceived) -> None:
        self.host.send_output_soon(event.channel, event.kind, event.data)

    def _ended(self, event: ExitReceived | DetachedReceived) -> None:
        last = event.exit if isinstance(event, ExitReceived) else event.reason
        if (route := self.channels.get(event.channel)) is not None:
            route.end(last)

    def _error(self, event: ErrorReceived) -> None:
        if event.channel == 0:  # the far worker closes the link (restarting, shutting down)
            self.error = event.error
        else:
            self.host.refuse(event.channel, refusal(event.error))

    def _credit(self, event: StdinCreditGranted) -> None:
        self.host.stdin_consumed(event.channel, event.bytes, soon=True)

    def _notice(self, event: NoticeReceived) -> None:
        notice, host = event.notice, self.host
        if isinstance(notice, Skipped) and notice.offsets is not None:
            host.send_skipped(event.channel, notice.bytes, notice.offsets)
        elif isinstance(notice, Audience):
            host.send_audience(event.channel, notice.observers)
        elif isinstance(notice, Modes):
            host.send_modes(event.channel, notice)

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
    ExitReceived: Hop._ended,
    DetachedReceived: Hop._ended,
    ErrorReceived: Hop._error,
    StdinCreditGranted: Hop._credit,
    NoticeReceived: Hop._notice,
    SessionsReceived: Hop._answered_now,
    AnswerReceived: Hop._answered_now,
}
