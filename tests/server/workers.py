"""Two workers of one server in this process: two session registries joined by real link
sockets (as `serve --workers 2` joins them, with no supervisor and no fork), and clients
whose connections a real `ConnectionHandler` serves, each a raw peer that speaks frames
by hand. Sessions run real processes (the local backend, no containment).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from helpers import RawPeer

from ttyserve.addresses import parse_address
from ttyserve.backends.local import LocalBackend
from ttyserve.protocol.messages import HTTP
from ttyserve.server.auth import Access, Gate, Peer
from ttyserve.server.connections.handler import ConnectionHandler
from ttyserve.server.mesh import Census, Mesh, WorkerSpec
from ttyserve.server.registry.registry import SessionRegistry
from ttyserve.server.settings import ServerSettings
from ttyserve.server.tasks import open_tasks
from ttyserve.transport.direct import OutputReader
from ttyserve.transport.streams import SocketByteStream, SocketTransport

ME = Peer("unix", uid=os.getuid(), pid=os.getpid())
LinkServer = Callable[[socket.socket], Coroutine[Any, Any, None]]


class Worker:
    """One worker: its registry, its gate, the handlers of its connections and links."""

    def __init__(self, registry: SessionRegistry, mesh: Mesh) -> None:
        self.registry = registry
        self.mesh = mesh
        self.gate = Gate(Access(), mesh.census.throttle)
        self.handlers: list[ConnectionHandler] = []
        self.links: list[ConnectionHandler] = []  # what other workers' hops reach here
        self.tasks: anyio.abc.TaskGroup | None = None

    async def serve_link(self, sock: socket.socket) -> None:
        """A link from the other worker: its LinkHello, then a handler (listener.py)."""
        hello = await self.mesh.receive_link_hello(sock)
        assert hello is not None, "a link without the server's secret"
        await self._serve(SocketTransport(sock), hello.peer, hello.principal, self.links)

    async def _serve(self, transport: SocketTransport, peer: Peer, linked: str | bool | None,
                     into: list[ConnectionHandler], reader: OutputReader | None = None,
                     ) -> None:
        assert self.tasks is not None
        async with open_tasks(self.tasks) as tasks:
            handler = ConnectionHandler(transport, peer, self.registry, self.gate, tasks,
                                        linked=linked, reader=reader)
            into.append(handler)
            await handler.run()

    @contextlib.asynccontextmanager
    async def client(self) -> AsyncIterator[RawPeer]:
        """A client connected to this worker (a socket pair: the handler has one end)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        theirs.setblocking(False)
        assert self.tasks is not None
        self.tasks.start_soon(self._serve, SocketTransport(theirs), ME, False, self.handlers)
        transport = SocketTransport(ours)
        try:
            yield RawPeer(transport)
        finally:
            await transport.aclose()


    @contextlib.asynccontextmanager
    async def http(self) -> AsyncIterator[SocketByteStream]:
        """An HTTP client of this worker's API: the front door of a `ws:` listener on a
        socket pair, each request's protocol-v1 connection served by this worker (peer
        `http:`), as listener.py serves them."""
        from ttyserve.api.routes import HttpApi
        from ttyserve.web.http import FrontDoor

        assert self.tasks is not None
        door = FrontDoor(frozenset(), assets={}, api=HttpApi())

        async def inner(reader: OutputReader | None = None) -> SocketTransport:
            ours, theirs = _pair()
            assert self.tasks is not None
            self.tasks.start_soon(self._serve, SocketTransport(theirs),
                                  Peer(HTTP, host="127.0.0.1"), False, self.handlers, reader)
            return SocketTransport(ours)

        async def serve(stream: SocketByteStream) -> None:
            try:
                await door.serve(stream, Peer("tcp", host="127.0.0.1"), WEB, inner)
            finally:
                await stream.aclose()

        ours, theirs = _pair()
        self.tasks.start_soon(serve, SocketByteStream(theirs))
        client = SocketByteStream(ours)
        try:
            yield client
        finally:
            await client.aclose()


WEB = parse_address("ws:127.0.0.1:7681")  # the listener the front door is told it serves


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    theirs.setblocking(False)
    return ours, theirs


async def _accept_links(listening: socket.socket, serve: LinkServer,
                        tasks: anyio.abc.TaskGroup) -> None:
    while True:
        await anyio.wait_readable(listening)
        with contextlib.suppress(BlockingIOError):
            sock, _ = listening.accept()
            sock.setblocking(False)
            tasks.start_soon(serve, sock)


@contextlib.asynccontextmanager
async def two_workers(directory: Path,
                      serve_links: dict[int, LinkServer] | None = None,
                      **settings: Any) -> AsyncIterator[list[Worker]]:
    """Workers 0 and 1 of one server, their links listening in ``directory``;
    ``serve_links`` puts a test's own server behind a worker's link socket instead."""
    census_fd = Census.create(2)
    secret = secrets.token_hex(16)
    config = ServerSettings(command=["sh"], **settings)
    workers = []
    for slot in range(2):
        mesh = Mesh(WorkerSpec(slot=slot, workers=2, supervisor=os.getpid(), listeners=[],
                               link_dir=str(directory), secret=secret, control_fd=-1,
                               census_fd=census_fd))
        registry = SessionRegistry(config, LocalBackend(config.default_cwd), None, mesh)
        workers.append(Worker(registry, mesh))
    listening = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for worker in workers:
                await stack.enter_async_context(worker.registry.running())
            tasks = await stack.enter_async_context(anyio.create_task_group())
            for worker in workers:
                worker.tasks = tasks
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(worker.mesh.link_path(worker.mesh.slot))
                sock.listen(16)
                sock.setblocking(False)
                listening.append(sock)
                serve = (serve_links or {}).get(worker.mesh.slot, worker.serve_link)
                tasks.start_soon(_accept_links, sock, serve, tasks)
            try:
                yield workers
            finally:
                tasks.cancel_scope.cancel()
    finally:
        for sock in listening:
            sock.close()
        os.close(census_fd)
