"""The server: its state, accept loops, the set of connections, and graceful shutdown.

Shutdown stops accepting, hangs up every session (SIGHUP to its process
group) and lets sessions send their `exit` frames. It is bounded by a
watchdog; `force()` (the second signal) ends it at once. A forced end
cancels every connection, which kills and reaps every process.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import ssl
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from ..addresses import Address
from ..backends.base import Backend
from ..backends.local import ChildBackend, LocalBackend
from ..protocol.messages import HTTP
from ..protocol.server import ServerConnection
from ..transport.direct import OutputReader
from ..transport.readiness import ReadableService
from ..transport.streams import (
    SocketByteStream,
    SocketTransport,
    StreamTransport,
    Transport,
    close_gracefully,
    send_all,
)
from .accepting import ACCEPT_BATCH, Acceptor
from .auth import Gate, Peer, peer_of
from .connections.handler import ConnectionHandler
from .handover import HandoverState
from .journal import Journal
from .mesh import Mesh
from .registry.registry import SessionRegistry, busy
from .reloading import reload
from .settings import ServerSettings
from .targets.config import load_targets
from .targets.hosts import TargetHosts
from .tasks import Tasks, open_tasks

if TYPE_CHECKING:
    from ..web.exchange import WebApi
    from ..web.http import FrontDoor

log = logging.getLogger("ttyserve")

_REFUSAL_TIME = 1.0  # seconds a refused connection has to read its `busy`


def ensure_children_reapable() -> None:
    """An inherited SIGCHLD=SIG_IGN makes the kernel reap our children itself, and
    every wait fail with ECHILD: restore the default so statuses can be learned."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


class Server:
    """Serves sessions on a set of listeners until shut down.

    It owns the server's state: the session registry, the gate (access rules and
    the failed-hello throttle) and the set of open connections.
    """

    def __init__(self, settings: ServerSettings, backend: Backend | None = None,
                 reap_orphans: bool = True, *, journal: Journal | None = None,
                 tls: ssl.SSLContext | None = None, mesh: Mesh | None = None,
                 link: Address | None = None, api: WebApi | None = None) -> None:
        """``mesh``: a worker of `serve --workers N`, whose listener ``link`` takes the
        links of the other workers. ``api`` answers the HTTP API on web listeners."""
        self.settings = settings
        self.api = api
        self.registry = SessionRegistry(
            settings, backend or LocalBackend(settings.default_cwd), journal, mesh)
        if settings.targets:
            self.registry.targets = TargetHosts(
                load_targets(settings.targets), settings.target_window, settings.target_idle,
                settings.handshake_timeout)
        self.mesh = mesh
        self.link = link
        # A worker's clients: their connections come over its control socket, accepted by
        # the supervisor for the listeners named here (by index).
        self.dispatched: tuple[socket.socket, list[Address]] | None = None
        self.on_command: Callable[[str], None] | None = None
        self._accepting: Tasks | None = None  # where a dispatched connection is served
        self.gate = Gate(settings.access, mesh.census.throttle if mesh is not None else None)
        self.handlers: set[ConnectionHandler] = set()
        self.reap_orphans = reap_orphans
        self.tls = tls
        self._connections = 0
        self._handlers_changed: anyio.Event | None = None  # made when the drain waits
        self._connection_tasks: Tasks | None = None
        self.forced = False
        self._stop = anyio.Event()
        self._force = anyio.Event()
        self._wake = anyio.Event()  # the accept loops stop: a shutdown or an upgrade
        self._upgrade: Callable[[], None] | None = None
        self._web: FrontDoor | None = None

    def shutdown(self) -> None:
        """Begin the graceful drain (idempotent)."""
        self._stop.set()
        self._wake.set()

    def reload(self) -> None:
        """SIGHUP: read the principals and targets files again (reloading.py)."""
        reload(self)

    def force(self) -> None:
        """End now: cancel every session, kill and reap its processes."""
        self.shutdown()
        self._force.set()

    def upgrade(self, execute: Callable[[], None]) -> None:
        """Begin an upgrade in place (section 12): stop accepting, end the sessions no client
        can attach again, close every connection with `server_restarting`, and once nothing
        is half-way, call ``execute``, which hands the rest over to new code in this process
        and does not return; where it does (the execve failed), serving goes on."""
        if not self.stopping and self._upgrade is None:
            self._upgrade = execute
            self._wake.set()

    @property
    def upgrading(self) -> bool:
        return self._upgrade is not None

    async def serve(
        self,
        listeners: list[tuple[Address, socket.socket]],
        on_listening: Callable[[Address], None] | None = None,
        *,
        only: tuple[Transport, Peer] | None = None,
        adopt: HandoverState | None = None,
    ) -> bool:
        """Serve until shut down; True when the drain finished, False when forced.

        With ``only`` (`serve --stdio`), serve that one open connection besides any
        listeners, and shut down once it ends. With ``adopt``, go on with the sessions an
        upgrade in place handed over (the journal gets its one `server.upgrade`)."""
        ensure_children_reapable()
        backend = self.registry.backend
        async with anyio.create_task_group() as maintenance:
            if self.reap_orphans and isinstance(backend, ChildBackend):
                maintenance.start_soon(backend.reap_orphans)
            if isinstance(backend, ChildBackend) and backend.containment is not None:
                maintenance.start_soon(backend.containment.tend)
            if self.dispatched is not None:
                maintenance.start_soon(self._take_dispatched, *self.dispatched)
            targets = self.registry.targets
            async with targets.running() if targets is not None else nullcontext(), \
                    self.registry.running():
                if adopt is not None:  # before the orphan reaper's first sweep (no checkpoint
                    # since it was started): a leader that exited during the hand-over is
                    # its session's to reap, with its status
                    assert isinstance(backend, ChildBackend), "only children are handed over"
                    await self.registry.handing_over.adopted(
                        adopt.sessions, backend, adopt.from_version, adopt.grants)
                drained = await self._serve(listeners, on_listening, only)
            maintenance.cancel_scope.cancel()
        return drained

    async def _serve(
        self,
        listeners: list[tuple[Address, socket.socket]],
        on_listening: Callable[[Address], None] | None,
        only: tuple[Transport, Peer] | None,
    ) -> bool:
        async with anyio.create_task_group() as group, open_tasks(group) as connections:
            self._connection_tasks = connections  # each connection's writer runs here too
            if only is not None:
                connections.start_soon(self._serve_only, *only)
            while True:
                async with anyio.create_task_group() as accepting:
                    for address, listener in listeners:
                        accepting.start_soon(self._accept_loop, listener, address, connections)
                        if on_listening is not None:
                            on_listening(address)
                    self._accepting = connections
                    on_listening = None  # once: the listeners stay the same
                    await self._wake.wait()
                    self._accepting = None
                    accepting.cancel_scope.cancel()
                if self._stop.is_set():
                    break
                await self._hand_over()  # back only when the new code could not be executed
                self._wake = anyio.Event()
                if self._stop.is_set():
                    break
            for _, listener in listeners:
                listener.close()
            self.registry.hang_up_all()
            for handler in list(self.handlers):
                handler.begin_shutdown()
            with anyio.move_on_after(self.settings.shutdown_timeout) as watchdog:
                async with anyio.create_task_group() as waiter:
                    waiter.start_soon(self._wait_forced, waiter.cancel_scope)
                    await self._wait_drained()
                    waiter.cancel_scope.cancel()
            if watchdog.cancelled_caught or self._force.is_set():
                self.forced = True
                log.warning("shutdown forced: killing %d session(s) on %d connection(s)",
                            len(self.registry.sessions), len(self.handlers))
                connections.cancel()
        return not self.forced

    async def _hand_over(self) -> None:
        """An upgrade, up to the execve (`upgrade`); a failure logs why and returns, and so
        does a shutdown asked for meanwhile (at once: it wins)."""
        execute, registry, timeout = self._upgrade, self.registry, self.settings.shutdown_timeout
        assert execute is not None
        registry.restarting = True
        quiet = False
        try:
            async with anyio.create_task_group() as watch:
                watch.start_soon(self._cancel_on_stop, watch.cancel_scope)
                for handler in list(self.handlers):
                    handler.begin_restart()  # each closes once its ending sessions' exits went
                await registry.handing_over.end_undetachable(self.settings.upgrade_drain, timeout)
                for handler in list(self.handlers):
                    handler.begin_restart()  # (those that came meanwhile)
                with anyio.move_on_after(timeout):
                    await self._until_no_handlers()
                for handler in list(self.handlers):  # clients that do not read their last
                    handler.outbox.abort()  # frames
                await self._until_no_handlers()
                if registry.targets is not None:  # (none of their sessions is left)
                    await registry.targets.close_all()
                quiet = await registry.handing_over.until_quiet(timeout)
                watch.cancel_scope.cancel()
            if self.stopping:
                log.info("upgrade abandoned: shutting down")
            elif not quiet:
                log.error("upgrade abandoned: sessions still ending after %g s", timeout)
            else:
                execute()  # returns only when it failed (and said why)
        finally:
            registry.restarting = False
            self._upgrade = None

    async def _cancel_on_stop(self, scope: anyio.CancelScope) -> None:
        await self._stop.wait()
        scope.cancel()

    async def _until_no_handlers(self) -> None:
        while self.handlers:
            self._handlers_changed = anyio.Event()
            await self._handlers_changed.wait()

    async def _wait_forced(self, scope: anyio.CancelScope) -> None:
        await self._force.wait()
        scope.cancel()

    async def _wait_drained(self) -> None:
        await self._until_no_handlers()
        await self.registry.ends.wait_empty()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _handler_closed(self, handler: ConnectionHandler) -> None:
        self.handlers.discard(handler)
        if self._handlers_changed is not None:
            self._handlers_changed.set()

    async def _accept_loop(self, listener: socket.socket, address: Address,
                           connections: Tasks) -> None:
        """Accept from the loop's readiness callback where there is one (no task step per
        connection), else waiting the ordinary way; back off while out of descriptors."""
        service = ReadableService()
        acceptor = Acceptor(listener)

        def acceptable() -> bool:
            for sock in acceptor.accept_batch():
                connections.start_soon(self._serve_connection, sock, address)
            return acceptor.starved is None

        while True:
            if not await service.serve(listener.fileno(), acceptable):
                await anyio.wait_readable(listener)
                acceptable()
            await acceptor.pause_if_starved()

    async def _take_dispatched(self, control: socket.socket, addresses: list[Address]) -> None:
        """A worker's word from its supervisor (supervisor.py): the connections it accepted
        for this worker, to serve, and its commands (`on_command`)."""
        control.setblocking(False)
        while True:
            await anyio.wait_readable(control)
            for _ in range(ACCEPT_BATCH):
                try:
                    data, fds, _, _ = socket.recv_fds(control, 16, 4)
                except BlockingIOError:
                    break
                if not data:  # the supervisor died: so does this worker, as by its pdeathsig
                    # (which comes a moment after this end): what it would write now, the
                    # next server's recovery writes
                    os.kill(os.getpid(), signal.SIGKILL)
                    return
                if not fds:
                    if self.on_command is not None:
                        self.on_command(data.decode(errors="replace"))
                    continue
                connections = self._accepting
                for fd in fds:
                    sock = socket.socket(fileno=fd)
                    if connections is not None and data[0] < len(addresses):
                        connections.start_soon(self._serve_connection, sock,
                                               addresses[data[0]])
                    else:
                        sock.close()

    async def _serve_connection(self, sock: socket.socket, listener: Address) -> None:
        if listener is self.link:
            await self._serve_link(sock)
            return
        try:
            peer = peer_of(sock, listener.scheme)
        except OSError:
            sock.close()
            return
        self._count_connections(+1)  # from accept: TLS and HTTP handshakes take a slot too
        try:
            transport = await self._open_transport(sock, listener, peer)
            if transport is not None:
                await self._handle(transport, peer)
        except Exception:  # one connection's bug must not take the server down
            log.exception("connection %s failed", peer)
        finally:
            self._count_connections(-1)

    def _count_connections(self, change: int) -> None:
        self._connections += change
        if self.mesh is not None:
            self.mesh.census.publish(self.mesh.census.CONNECTIONS, self._connections)

    def _open_connections(self) -> int:
        """Connections open now, in the whole server (this one's, with workers)."""
        if self.mesh is None:
            return self._connections
        census = self.mesh.census
        return census.total(census.CONNECTIONS, self._connections)

    async def _serve_link(self, sock: socket.socket) -> None:
        """A link from another worker: its LinkHello, then the client's connection mirrored
        (hop.py). It is not the client's connection: not counted against the limit."""
        assert self.mesh is not None
        sock.setblocking(False)
        hello = None
        with anyio.move_on_after(self.settings.handshake_timeout):
            hello = await self.mesh.receive_link_hello(sock)
        if hello is None:
            log.warning("a link came without this server's secret: closed")
            sock.close()
            return
        await self._handle(SocketTransport(sock), hello.peer, hello.principal)

    async def _handle(self, transport: Transport, peer: Peer,
                      linked: str | bool | None = False,
                      reader: OutputReader | None = None) -> None:
        try:
            assert self._connection_tasks is not None
            handler = ConnectionHandler(transport, peer, self.registry, self.gate,
                                        self._connection_tasks, self._handler_closed,
                                        linked, reader)
            self.handlers.add(handler)
            await handler.run()
        except Exception:  # one connection's bug must not take the server down
            log.exception("connection %s failed", peer)

    async def _serve_only(self, transport: Transport, peer: Peer) -> None:
        """The connection of `serve --stdio`: when it ends, the server's work is done."""
        try:
            await self._handle(transport, peer)
        finally:
            self.shutdown()

    async def _open_transport(self, sock: socket.socket, listener: Address,
                              peer: object) -> Transport | None:
        """The connection's transport, or None when it was refused, its TLS failed, or (web
        listeners) it only asked for the page. Everything before the protocol starts is
        bounded by the handshake deadline."""
        limit = self.settings.max_connections
        if (open_now := self._open_connections()) > limit:
            log.warning("%s: refused: %d connections open", peer, open_now - 1)
            if listener.scheme in ("unix", "tcp"):
                await refuse_busy(SocketTransport(sock), limit)
            else:  # a frame would be garbage to TLS or HTTP: the connection is closed
                sock.close()
            return None
        if listener.scheme in ("unix", "tcp"):
            return SocketTransport(sock)
        stream: anyio.abc.ByteStream | None = None
        handed_off = ready = False
        try:
            with anyio.move_on_after(self.settings.handshake_timeout):
                try:
                    if listener.encrypted:
                        from anyio.streams.tls import TLSStream  # only tls: and wss: need it

                        stream = await anyio.abc.SocketStream.from_socket(sock)
                        assert self.tls is not None
                        stream = await TLSStream.wrap(stream, server_side=True,
                                                      ssl_context=self.tls,
                                                      standard_compatible=False)
                    else:
                        stream = SocketByteStream(sock)
                    ready = True
                except (ssl.SSLError, OSError, anyio.BrokenResourceError,
                        anyio.EndOfStream) as exc:
                    log.info("%s: TLS handshake failed: %s", peer, exc or (
                        "the client closed the connection during it (did it reject the "
                        "certificate?)"))
                    return None
            if not ready or stream is None:
                log.info("%s: no TLS handshake in time", peer)
                return None
            if not listener.web:
                handed_off = True
                return StreamTransport(stream)
            # (each request's head within the handshake timeout: the front door's own)
            upgraded = await self._front_door().serve(stream, peer, listener,
                                                      functools.partial(self._inner, peer))
            handed_off = upgraded is not None
            return upgraded
        finally:
            if not handed_off:  # on every other way out, cancellation and errors included
                # Close what owns the descriptor: the asyncio transport, once there is one.
                with anyio.CancelScope(shield=True):
                    if stream is not None:
                        await stream.aclose()
                    else:
                        sock.close()

    def _front_door(self) -> FrontDoor:
        """The HTTP side of `ws:` and `wss:` listeners (its assets loaded on first use)."""
        if self._web is None:
            from ..web.http import FrontDoor  # h11 and websockets: not for a start without ws:

            self._web = FrontDoor(self.settings.allowed_origins,
                                  max_frame=self.settings.max_frame, api=self.api,
                                  head_timeout=self.settings.handshake_timeout)
        return self._web

    async def _inner(self, outer: object, reader: OutputReader | None = None) -> Transport:
        """A connection of this server's own for an HTTP API request of ``outer`` (its
        peer `http:ADDR`): served like any other, and counted in the HTTP connection;
        with ``reader``, its channels' output is handed to it (transport/direct.py)."""
        ours, theirs = socket.socketpair()
        assert self._connection_tasks is not None
        self._connection_tasks.start_soon(self._handle, SocketTransport(ours),
                                          Peer(HTTP, host=getattr(outer, "host", "")),
                                          False, reader)
        return SocketTransport(theirs)


async def refuse_busy(transport: Transport, limit: int) -> None:
    """Answer `busy` on channel 0 to a connection over the limit, then close it."""
    core = ServerConnection()
    core.close(busy(f"the server has its maximum of {limit} connections"))
    with anyio.move_on_after(_REFUSAL_TIME):
        try:
            await send_all(transport, b"".join(core.data_to_send()))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        else:
            await close_gracefully(transport, _REFUSAL_TIME)
    await transport.aclose()
