"""A real fault injector: a TCP proxy on 127.0.0.1 between a client and a server, which cuts
connections (a reset, both ways) or black-holes them (it stops reading and writing, and
closes nothing, so only a heartbeat can notice), at points a test chooses."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from ttyserve.protocol.frames import HEADER, FrameKind
from ttyserve.protocol.messages import parse_object

CHUNK = 64 * 1024


@dataclass(eq=False)
class _Pair:
    client: anyio.abc.SocketStream
    server: anyio.abc.SocketStream
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stalled: bool = False


@dataclass(eq=False)
class FaultProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; every fault applies to the connections
    open at that moment, and new connections are forwarded normally."""

    target: tuple[str, int]
    port: int = 0
    downstream: int = 0  # bytes forwarded server -> client, over all connections
    connections: int = 0  # accepted so far
    planned: tuple[int, str] | None = None  # ("cut" or "black hole") once `downstream`
    # reaches the offset (exactly there: what comes later is not forwarded)
    cut_before: str | None = None  # a control message's type ("exit" from the server,
    # "eof" from the client): the first one is dropped, and the connection cut instead
    cut_after: bytes | None = None  # cut right after forwarding a read that carries these
    seen_after: bytes | None = None  # only say so (`wait_fault`) once a read carrying these
    # was forwarded, and go on: the test then does what it likes
    max_connections: int | None = None  # beyond these, connections are closed at once
    hold_upgrades: anyio.Event | None = None  # WebSocket upgrades wait for it to be set
    faults: list[str] = field(default_factory=list)  # what was done, in order
    fault_times: list[float] = field(default_factory=list)  # when (anyio's clock)
    refuse: Callable[[], None] = field(default=lambda: None)  # stop listening: refused
    _pairs: list[_Pair] = field(default_factory=list)
    _fault_done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def address(self) -> str:
        return f"tcp:127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Reset every open connection, both ways (SO_LINGER 0: an RST, no FIN)."""
        for pair in self._pairs:
            for stream in (pair.client, pair.server):
                raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
                with contextlib.suppress(OSError):
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            pair.scope.cancel()
        self._pairs.clear()
        self.faults.append("cut")
        self.fault_times.append(anyio.current_time())
        self._fault_done.set()

    def black_hole(self) -> None:
        """Stop forwarding on every open connection without closing anything."""
        for pair in self._pairs:
            pair.stalled = True
        self._pairs.clear()  # (kept open by their tasks until the proxy ends)
        self.faults.append("black hole")
        self.fault_times.append(anyio.current_time())
        self._fault_done.set()

    async def fault_at(self, downstream: int, fault: str) -> None:
        """Cut or black-hole the connections once ``downstream`` bytes went to clients; return
        when it is done."""
        self.planned = (downstream, fault)
        await self.wait_fault()

    async def wait_fault(self) -> None:
        """Until the planned fault (`planned`, `cut_before`, `cut_after`) was done, or what
        `seen_after` waits for went through."""
        await self._fault_done.wait()
        self._fault_done = anyio.Event()

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        if self.max_connections is not None and self.connections > self.max_connections:
            await client.aclose()
            return
        try:
            server = await anyio.connect_tcp(*self.target)
        except OSError:
            await client.aclose()
            return
        pair = _Pair(client, server)
        self._pairs.append(pair)
        with pair.scope:
            async with client, server, anyio.create_task_group() as tg:
                tg.start_soon(self._pump, pair, client, server, False)
                tg.start_soon(self._pump, pair, server, client, True)
        if pair.stalled:
            await anyio.sleep_forever()  # (cancelled with the proxy)

    async def _pump(self, pair: _Pair, source: anyio.abc.SocketStream,
                    sink: anyio.abc.SocketStream, down: bool) -> None:
        kind = FrameKind.CTRL_OUT if down else FrameKind.CTRL_IN
        frames = _FrameWatch(kind, self.cut_before) if self.cut_before else None
        first = not down
        while True:
            if pair.stalled:
                await anyio.sleep_forever()
            try:
                data = await source.receive(CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                with contextlib.suppress(Exception):
                    await sink.send_eof()
                return
            if pair.stalled:
                await anyio.sleep_forever()  # what came after the black hole is never seen
            if first:
                first = False
                if self.hold_upgrades is not None and b"upgrade: websocket" in data.lower():
                    await self.hold_upgrades.wait()
            if frames is not None and self.cut_before and (at := frames.find(data)) is not None:
                self.cut_before = None
                await self._send(sink, data[:at])
                self.cut()
                return
            if down:
                if self.seen_after is not None and self.seen_after in data:
                    self.seen_after = None
                    self.downstream += len(data)
                    await self._send(sink, data)
                    self._fault_done.set()
                    continue
                if self.cut_after is not None and self.cut_after in data:
                    self.cut_after = None
                    self.downstream += len(data)
                    await self._send(sink, data)
                    self.cut()
                    return
                if (planned := self.planned) is not None and (
                        self.downstream + len(data) >= planned[0]):
                    keep = max(0, planned[0] - self.downstream)
                    self.planned = None
                    self.downstream += keep
                    await self._send(sink, data[:keep])
                    if planned[1] == "cut":
                        self.cut()
                        return
                    self.black_hole()
                    await anyio.sleep_forever()
                self.downstream += len(data)
            await self._send(sink, data)

    @staticmethod
    async def _send(sink: anyio.abc.SocketStream, data: bytes) -> None:
        if data:
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                await sink.send(data)


class _FrameWatch:
    """Follows the frames of one direction to find where the first control message of a
    type begins."""

    def __init__(self, kind: FrameKind, message: str) -> None:
        self._kind = kind
        self._message = message
        self._buffer = b""
        self._offset = 0  # of the buffer's start, in the stream

    def find(self, data: bytes) -> int | None:
        """Where in ``data`` the first such frame starts, if it is there (whole)."""
        start = self._offset + len(self._buffer)
        self._buffer += data
        while len(self._buffer) >= HEADER.size:
            kind, _channel, size = HEADER.unpack_from(self._buffer)
            if len(self._buffer) < HEADER.size + size:
                break
            payload = self._buffer[HEADER.size:HEADER.size + size]
            if kind == self._kind and parse_object(payload)[0] == self._message:
                return max(0, self._offset - start)
            self._buffer = self._buffer[HEADER.size + size:]
            self._offset += HEADER.size + size
        return None


@contextlib.asynccontextmanager
async def fault_proxy(target: str) -> AsyncIterator[FaultProxy]:
    """A FaultProxy to ``target`` (`tcp:HOST:PORT`), serving until the block ends."""
    host, port = target.removeprefix("tcp:").rsplit(":", 1)
    proxy = FaultProxy((host, int(port)))
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        accepting = anyio.CancelScope()

        async def serve() -> None:
            try:
                with accepting:
                    await listener.serve(proxy._serve, task_group=tg)
            finally:  # refused from now on: a redial fails at once
                with anyio.CancelScope(shield=True):
                    await listener.aclose()

        proxy.refuse = accepting.cancel
        tg.start_soon(serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
