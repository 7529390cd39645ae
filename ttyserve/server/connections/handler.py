"""One client connection, as I/O only: feed the core, act on its events, send what it framed.

The protocol core decides every rule; the gate decides who may go on; the
registry admits and runs sessions. What is left here is the handshake deadline,
the channel-to-route table, the attachments' host and the close. The handler is
the one object that drives the connection's core: it frames what sessions send
through their attachments (and what a hop relays), and it ends channels itself
(cancel, detach, the connection's end), so a keystroke, a grant of credit and a
detach each go one way through the layers. What the client sends on a channel
goes to the channel's route (channels/route.py), wherever its session lives.
Three parts own what they do: the reading of the client (reader.py), the
requests about sessions (requests.py; remote.py where other workers hold some),
and the checks of the client, its `hello` and its heartbeat (peer_checks.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc

from ...defaults import CLOSE_TIMEOUT, OUTPUT_CHUNK
from ...errors import RemoteProtocolError, RequestError
from ...protocol.frames import FrameKind
from ...protocol.messages import Attached, Exit, Modes, Offsets
from ...protocol.server import (
    AttachRequested,
    CancelRequested,
    ControlReceived,
    CreditGranted,
    DetachRequested,
    HelloReceived,
    ListRequested,
    OpenRequested,
    ReleaseRequested,
    ServerConnection,
    ServerEvent,
    ShareRequested,
    StdinReceived,
    TargetsRequested,
    UnshareRequested,
)
from ...transport.direct import OutputReader
from ...transport.outbox import Outbox, TaskStarter
from ...transport.streams import (
    Buffer,
    Transport,
    close_gracefully,
)
from ..auth import Gate, Peer
from ..channels.attachment import Attachment, SessionChannel
from ..channels.route import Later, Route
from ..grants import Grant
from ..journal import SessionDetach
from ..registry.registry import SessionRegistry, restarting, shutting_down
from ..sessions.stdin import StdinQueue
from .output import DirectOutput, FramedOutput, flush
from .peer_checks import PeerChecks
from .reader import ClientReader
from .remote import WorkerRequests
from .requests import HERE, SessionRequests

log = logging.getLogger("ttyserve")



class ConnectionHandler:
    """Serves one connection from `hello` to close."""

    _restarting = False  # an upgrade: closes with `server_restarting` (section 12)

    def __init__(self, transport: Transport, peer: Peer, registry: SessionRegistry, gate: Gate,
                 tasks: TaskStarter,
                 on_closed: Callable[[ConnectionHandler], None] | None = None,
                 linked: str | bool | None = False, reader: OutputReader | None = None,
                 ) -> None:
        """``linked``: a link from another worker, which admitted the client as this
        principal (None: its `hello` carries a grant to check here); ``reader``: the
        channels' output is read in this process (the HTTP API's streams)."""
        settings = registry.settings
        self.transport = transport
        self.reader = ClientReader(transport)
        self.peer = peer
        self.registry = registry
        self.gate = gate
        self.core = ServerConnection(settings.max_frame, settings.stdin_window,
                                     output_frame=OUTPUT_CHUNK)
        self.routes: dict[int, Route] = {}  # what each open channel is attached to
        self._handshake_timeout = settings.handshake_timeout
        self._on_closed = on_closed
        # The writer task, when one is needed, runs beside the connection's own.
        self.outbox = Outbox(transport, on_broken=self._stop_reading, on_room=self._room)
        self.outbox.attach(tasks)
        self.tasks = tasks
        self.over = False
        self.principal = ""  # whom it acts as, once `hello` is accepted (section 9)
        self.grant: Grant | None = None  # what admitted it instead of the token (section 11)
        self._draining = False
        self.checks = PeerChecks(linked)
        mesh = registry.mesh  # a link's requests are for this worker: never sent on
        self.requests: SessionRequests = (
            WorkerRequests(mesh) if mesh is not None and mesh.workers > 1
            and not self.checks.link else HERE)
        self.output: FramedOutput | DirectOutput = (
            FramedOutput(self.core, self.outbox, self.checks) if reader is None
            else DirectOutput(self.core, reader))

    # --- lifecycle ---------------------------------------------------------

    async def run(self) -> None:
        """Serve until the client leaves, breaks the protocol, or its one session ends."""
        try:
            reader = self.reader
            reader.deadline = anyio.current_time() + self._handshake_timeout
            await reader.run(self)
            if not self.core.handshake_done and not self.core.closing and (
                    anyio.current_time() >= reader.deadline):
                log.info("%s: no hello and open in time: dropped", self.peer)
                self.core.close(RemoteProtocolError(
                    f"no {'open' if self.core.hello else 'hello'} within "
                    f"{self._handshake_timeout:g} s"))
            self.end_channels()
            self.outbox.close()
            # The session's last frames go out however slowly the client reads;
            # a client that never reads holds only its own connection.
            await self.outbox.wait_done()
            if not self.outbox.broken and not reader.discarding:  # (else done already)
                # A WebSocket says 1002 after a protocol error.
                await close_gracefully(self.transport, CLOSE_TIMEOUT, functools.partial(
                    self.transport.send_eof, protocol_error=self.core.error is not None))
        finally:
            self.over = True
            self.checks.stop()
            self._close_routes()  # cancelled (a forced shutdown): as the client left
            self.outbox.close()
            await self.transport.aclose()
            self.outbox.release()
            if self._on_closed is not None:
                self._on_closed(self)  # after the close: "no handlers" means all closed

    def begin_shutdown(self) -> None:
        """Graceful shutdown (the registry hung the sessions up): close once none is left."""
        self._draining = True
        if not self.routes:
            self.core.close(shutting_down() if self.core.hello is not None else None)
            self._stop_reading()

    def begin_restart(self) -> None:
        """An upgrade in place: `server_restarting` on channel 0, then the close, once the
        sessions the upgrade ends (those not detachable) sent their `exit`; detachable
        sessions go on detached."""
        self._restarting = True
        if self.core.hello is None:
            self.core.close()
        elif self._ending_sessions():
            self.core.close_when_over(restarting())  # (after the last channel's last frame)
            return
        else:
            self.core.close(restarting())
        self._stop_reading()

    def _ending_sessions(self) -> bool:
        """Whether a session the upgrade ends (not detachable) is still attached here."""
        return any(route.ends_on_upgrade for route in self.routes.values())

    def _stop_reading(self) -> None:
        """The connection is to close: the reader stops (reader.py)."""
        self.reader.stop(self)

    def end_channels(self) -> None:
        """The close: nothing more is framed (what is framed still goes out), and every
        session is let go, as `cancel` does, or `detach` (section 9)."""
        self.core.close()
        self._close_routes()
        self.flush()

    def _close_routes(self) -> None:
        """Every channel's session let go: the client has gone (route.py)."""
        routes, self.routes = self.routes, {}
        for route in routes.values():
            route.close()
        self.requests.close(self)

    def close(self, error: RequestError) -> None:
        """Close the connection with ``error`` on channel 0."""
        self.core.close(error)
        self._stop_reading()
        self.flush()

    # --- the attachments' host: the one place this connection's frames are made ---------

    def flush(self) -> None:
        """Hand what the core framed to the writer, without waiting."""
        flush(self.core, self.outbox, self.checks)

    def output_limit(self, channel: int) -> int:
        return self.output.limit(channel)

    def send_output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        self.output.send(channel, kind, data)

    def send_output_soon(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        self.output.send_soon(channel, kind, data)

    @property
    def splices(self) -> bool:
        """Whether output may be spliced from a pipe into this connection (a Unix socket)."""
        return self.output.splices

    def splice_output(self, channel: int, kind: FrameKind, pipe: int, size: int) -> None:
        self.output.splice(channel, kind, pipe, size)

    @property
    def link(self) -> bool:
        return self.checks.link

    def frame_attached(self, route: Route, answer: Attached) -> None:
        self.routes[route.channel] = route
        self.core.attached(route.channel, answer)

    def refuse(self, channel: int, error: RequestError) -> None:
        self.core.refuse(channel, error)

    def send_skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self.output.skipped(channel, size, offsets)

    def send_audience(self, channel: int, observers: int) -> None:
        if self.core.send_audience(channel, observers):
            self.flush()

    def send_modes(self, channel: int, modes: Modes) -> None:
        self.output.modes(channel, modes)
        self.flush()  # (told from another connection's turn, or a hop's: not left waiting)

    def stdin_consumed(self, channel: int, size: int, soon: bool = False) -> None:
        self.core.stdin_consumed(channel, size)
        if not soon:
            self.flush()

    def until_room(self, stdin: StdinQueue) -> Later | None:
        window = self.core.stdin_window
        if stdin.over(window):
            return lambda: self.reader.interruptibly(stdin.wait_room(window))
        return None

    def let_go(self, route: SessionChannel) -> None:
        # Noted at once, not left to this task: a client that hangs up right after `detach`
        # breaks the send of `detached`, and that ends the reader before it could note it.
        session = route.session
        if isinstance(route, Attachment) and session.sink is route:  # (never an observer)
            session.detach()
        self.registry.ends.note_soon(session, SessionDetach, str(self.peer), role=route.role,
                                grant=route.grant)

    def end_channel(self, route: Route, last: Exit | str | None) -> bool:
        """A channel's last frame, `exit` or `detached`; the connection forgets its route."""
        channel = route.channel
        if self.routes.get(channel) is route:
            del self.routes[channel]
        if isinstance(last, Exit):
            framed = self.core.send_exit(channel, last)
        else:
            framed = self.core.send_detached(channel, last)
        self.flush()
        self._channel_over()
        return framed

    def _channel_over(self) -> None:
        """A channel ended: the connection closes when that was what it waited for."""
        if self._restarting and not self._ending_sessions():
            self.core.close(restarting())  # (a no-op when the core closed with it already)
        if self.core.closing or (self._draining and not self.routes):
            self._stop_reading()  # the reader closes the connection

    def _room(self) -> None:
        """The send queue has room again: replays and pumps that waited for it go on."""
        for route in list(self.routes.values()):
            route.resume()

    def act(self, event: ServerEvent) -> Later | None:
        """Act on ``event`` as far as needs no waiting; what is left to await, if anything."""
        act = _ACTS.get(type(event))
        return act(self, event) if act is not None else None

    # --- what the client sends on a channel: its route's (route.py) ---------------------

    def _stdin(self, event: StdinReceived) -> Later | None:
        route = self.routes.get(event.channel)
        return route.stdin(event.data) if route is not None else None

    def _credit(self, event: CreditGranted) -> None:
        if (route := self.routes.get(event.channel)) is not None:
            route.credit(event.bytes)

    def _control(self, event: ControlReceived) -> None:
        if (route := self.routes.get(event.channel)) is not None:
            route.control(event.message)

    def _detach(self, event: DetachRequested) -> None:
        if (route := self.routes.get(event.channel)) is not None:
            route.detach()

    def _cancel(self, event: CancelRequested) -> None:
        """The core has ended the channel: its session is cancelled."""
        if (route := self.routes.pop(event.channel, None)) is not None:
            route.cancel()


# What each event of the core does (the rest: nothing).
_ACTS: dict[type, Callable[[ConnectionHandler, Any], Later | None]] = {
    StdinReceived: ConnectionHandler._stdin,
    CreditGranted: ConnectionHandler._credit,
    ControlReceived: ConnectionHandler._control,
    DetachRequested: ConnectionHandler._detach,
    CancelRequested: ConnectionHandler._cancel,
    HelloReceived: lambda handler, event: handler.checks.hello_received(handler, event),
    OpenRequested: lambda handler, event: handler.requests.open_requested(handler, event),
    AttachRequested: lambda handler, event: handler.requests.attach_requested(handler, event),
    ReleaseRequested: lambda handler, event: handler.requests.release_requested(handler, event),
    ListRequested: lambda handler, event: handler.requests.list_requested(handler, event),
    ShareRequested: lambda handler, event: handler.requests.share_requested(handler, event),
    UnshareRequested: lambda handler, event: handler.requests.unshare_requested(handler, event),
    TargetsRequested: lambda handler, event: handler.requests.targets_requested(handler, event),
}
