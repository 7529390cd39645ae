"""A slow link: a TCP proxy on 127.0.0.1 that holds every byte ``delay`` seconds in each
direction before it forwards it (a round trip of two delays on top of loopback's), with no
limit on the bytes in flight, so a page behind it feels a distant server's latency and
nothing else. Real sockets, no mock: what the browser and the server see is a slow network."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

CHUNK = 64 * 1024


@dataclass(eq=False)
class DelayProxy:
    """Forwards 127.0.0.1:``port`` to ``target`` (set once the server is up), each read
    delivered ``delay`` seconds after it was read, in order."""

    target: tuple[str, int] | None
    delay: float
    port: int = 0
    connections: int = 0

    async def _serve(self, client: anyio.abc.SocketStream) -> None:
        self.connections += 1
        assert self.target is not None, "the proxy's target is set before it is used"
        try:
            server = await anyio.connect_tcp(*self.target)
        except OSError:
            await client.aclose()
            return
        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(self._pipe, client, server)
            tg.start_soon(self._pipe, server, client)

    async def _pipe(self, source: anyio.abc.SocketStream,
                    sink: anyio.abc.SocketStream) -> None:
        send, receive = anyio.create_memory_object_stream[tuple[float, bytes]](math.inf)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._deliver, receive, sink)
            async with send:
                while True:
                    try:
                        data = await source.receive(CHUNK)
                    except (anyio.EndOfStream, anyio.BrokenResourceError,
                            anyio.ClosedResourceError, OSError):
                        break
                    send.send_nowait((anyio.current_time() + self.delay, data))

    @staticmethod
    async def _deliver(receive: MemoryObjectReceiveStream[tuple[float, bytes]],
                       sink: anyio.abc.SocketStream) -> None:
        async with receive:
            async for due, data in receive:
                await anyio.sleep_until(due)  # the link's latency: the one wait by design
                try:
                    await sink.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return
        with contextlib.suppress(Exception):  # the source ended: so does this direction
            await sink.send_eof()


@contextlib.asynccontextmanager
async def delay_proxy(delay: float,
                      target: tuple[str, int] | None = None) -> AsyncIterator[DelayProxy]:
    """A DelayProxy serving until the block ends."""
    proxy = DelayProxy(target, delay)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy.port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, proxy._serve, tg)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()
