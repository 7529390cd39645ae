"""An output stream of the HTTP API (section 13): a session's output as events, NDJSON or
server-sent events, from the offsets asked for, paced by its reader, the exit last.

The output itself is handed to the stream in the server's own process (`StreamReader`,
transport/direct.py): it is never framed, sent through the in-process connection and
decoded again. That connection still says how the channel began and ended (`attached`,
`exit`, `detached`), and carries the stream's grants of credit back to the session.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Awaitable, Callable

import anyio
import msgspec
import pybase64

from ..client.connection import Connection
from ..client.session import Session
from ..errors import ConnectionLost, RemoteProtocolError, SessionDetached
from ..protocol.frames import FrameKind
from ..protocol.messages import STOLEN, Exit, Modes, Offsets, Skipped, members
from ..transport.streams import Buffer
from ..web.exchange import Exchange
from .types import AttachedEvent, ExitEvent, OutputEvent, SkippedEvent

NDJSON = "application/x-ndjson"
EVENT_STREAM = "text/event-stream"
_encode = msgspec.json.Encoder().encode
_STREAMS = {FrameKind.STDOUT: "stdout", FrameKind.STDERR: "stderr"}

# What comes for a channel, in order: output, a skip, or how the channel ended (its exit,
# `detached`, or what ended the connection).
Item = tuple[int, FrameKind | None, Buffer | Skipped | Modes | Exit | Exception]


class StreamReader:
    """What the server hands the stream in process (its output and skips) and how its
    channel ended, as the client library hears it, in one queue in the order they came:
    the end is heard on the connection after all the output before it was handed here."""

    def __init__(self) -> None:
        self._items: collections.deque[Item] = collections.deque()
        self._arrived: anyio.Event | None = None

    def output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        self._put((channel, kind, data))

    def skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self._put((channel, None, Skipped(bytes=size, offsets=offsets)))

    def modes(self, channel: int, modes: Modes) -> None:
        self._put((channel, None, modes))

    def end(self, channel: int, last: Exit | Exception) -> None:
        self._put((channel, None, last))

    def _put(self, item: Item) -> None:
        self._items.append(item)
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = None

    async def next(self) -> Item:
        while not self._items:
            arrived = self._arrived = self._arrived or anyio.Event()
            await arrived.wait()
        return self._items.popleft()

    async def hear_end(self, session: Session) -> None:
        """Wait for the end of ``session``'s channel (nothing else comes to the library)."""
        try:
            while await session.next_event() is not None:
                continue
        except Exception as exc:  # detached, cancelled, the connection lost: the stream's
            self.end(session.channel, exc)
            return
        assert session.status is not None
        self.end(session.channel, session.status)


def output_line(stream: str, offset: int, data: Buffer) -> list[Buffer]:
    """An `output` event's JSON, as the pieces to send: msgspec encodes the event with no
    data, and pybase64 the data (the event's one large member, which JSON never escapes),
    in place between its quotes; msgspec's own base64 was half the stream's server CPU."""
    head = _encode(OutputEvent(stream=stream, offset=offset, data=b""))  # type: ignore[arg-type]
    return [head[:-2], pybase64.b64encode(data), head[-2:]]  # (...,"data":"|BASE64|"})


def wants_events(exchange: Exchange) -> bool:
    """Whether the request's Accept asks for server-sent events."""
    return EVENT_STREAM in (exchange.header("accept") or "")


async def stream_output(exchange: Exchange, conn: Connection, session: Session,
                        reader: StreamReader,
                        again: Callable[[Offsets], Awaitable[Session]]) -> None:
    """Send ``session``'s events until its exit, or until the client goes away (the
    connection ``conn`` to the server then closes, and the session is detached, not
    ended); each piece of output sent gives its credit back. When a client of the framed
    protocol took the session over (`detached` stolen: HTTP writes never do), ``again``
    attaches it anew from the offsets sent so far, once that client let go."""
    sse = wants_events(exchange)
    await exchange.begin_stream(EVENT_STREAM if sse else NDJSON)
    held = Offsets(stdout=session.began.stdout, stderr=session.began.stderr)

    async def send(event: msgspec.Struct | list[Buffer]) -> None:
        line = event if isinstance(event, list) else [_encode(event)]
        if sse:
            await exchange.send(b"id: %d,%d\ndata: " % (held.stdout, held.stderr), *line,
                                b"\n\n")
        else:
            await exchange.send(*line, b"\n")

    async def events(session: Session) -> None:
        await send(AttachedEvent(offsets=Offsets(stdout=held.stdout, stderr=held.stderr)))
        tasks.start_soon(reader.hear_end, session)
        while True:
            channel, kind, item = await reader.next()
            if channel != session.channel:  # (a channel this stream gave up)
                continue
            if kind is not None:
                assert not isinstance(item, (Skipped, Modes, Exit, Exception))
                stream = _STREAMS[kind]
                offset = getattr(held, stream)
                setattr(held, stream, offset + len(item))
                await send(output_line(stream, offset, item))
                with contextlib.suppress(ConnectionLost, RemoteProtocolError):  # (its end
                    await conn.consumed(session, len(item))  # is heard by hear_end)
            elif isinstance(item, Skipped):
                assert item.offsets is not None
                held.stdout, held.stderr = item.offsets.stdout, item.offsets.stderr
                await send(SkippedEvent(bytes=item.bytes, offsets=item.offsets))
            elif isinstance(item, Modes):
                await send(item)  # (section 14: `?modes=true`)
            elif isinstance(item, Exit):
                break
            elif isinstance(item, SessionDetached) and item.reason == STOLEN:
                session = await again(Offsets(stdout=held.stdout, stderr=held.stderr))
                began = session.began  # later than asked: the ring ran over meanwhile
                if (lost := began.stdout - held.stdout + began.stderr - held.stderr) > 0:
                    held.stdout, held.stderr = began.stdout, began.stderr
                    await send(SkippedEvent(bytes=lost, offsets=began))
                tasks.start_soon(reader.hear_end, session)
            else:
                assert isinstance(item, Exception)
                raise item
        assert session.status is not None
        await send(ExitEvent(**members(session.status)))
        await exchange.end_stream()
        tasks.cancel_scope.cancel()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(events, session)
        await exchange.until_gone()
        tasks.cancel_scope.cancel()
