"""An output stream of the HTTP API (section 13): a session's output as events, NDJSON or
server-sent events, from the offsets asked for, paced by its reader, the exit last."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import msgspec

from ..client.session import OutputChunk, Session
from ..errors import SessionDetached
from ..protocol.messages import STOLEN, Offsets, members
from ..web.exchange import Exchange
from .types import AttachedEvent, ExitEvent, OutputEvent, SkippedEvent

NDJSON = "application/x-ndjson"
EVENT_STREAM = "text/event-stream"
_encode = msgspec.json.Encoder().encode


def wants_events(exchange: Exchange) -> bool:
    """Whether the request's Accept asks for server-sent events."""
    return EVENT_STREAM in (exchange.header("accept") or "")


async def stream_output(exchange: Exchange, session: Session,
                        again: Callable[[Offsets], Awaitable[Session]]) -> None:
    """Send ``session``'s events until its exit, or until the client goes away (the
    connection to the server then closes, and the session is detached, not ended). When an
    HTTP write took the session's writer role for a moment (`detached` stolen), ``again``
    attaches it anew from the offsets sent so far."""
    sse = wants_events(exchange)
    await exchange.begin_stream(EVENT_STREAM if sse else NDJSON)
    held = Offsets(stdout=session.began.stdout, stderr=session.began.stderr)

    async def send(event: msgspec.Struct) -> None:
        line = _encode(event)
        if sse:
            await exchange.send(b"id: %d,%d\ndata: %s\n\n" % (held.stdout, held.stderr, line))
        else:
            await exchange.send(line + b"\n")

    async def events(session: Session) -> None:
        await send(AttachedEvent(offsets=Offsets(stdout=held.stdout, stderr=held.stderr)))
        while True:
            try:
                item = await session.next_event()
            except SessionDetached as exc:
                if exc.reason != STOLEN:
                    raise
                session = await again(Offsets(stdout=held.stdout, stderr=held.stderr))
                began = session.began  # later than asked: the ring ran over meanwhile
                if (lost := began.stdout - held.stdout + began.stderr - held.stderr) > 0:
                    held.stdout, held.stderr = began.stdout, began.stderr
                    await send(SkippedEvent(bytes=lost, offsets=began))
                continue
            if item is None:
                break
            if isinstance(item, OutputChunk):
                setattr(held, item.stream, item.offset + len(item.data))
                await send(OutputEvent(stream=item.stream, offset=item.offset,
                                       data=item.data))
            else:
                assert item.offsets is not None
                held.stdout, held.stderr = item.offsets.stdout, item.offsets.stderr
                await send(SkippedEvent(bytes=item.bytes, offsets=item.offsets))
        assert session.status is not None
        await send(ExitEvent(**members(session.status)))
        await exchange.end_stream()
        tasks.cancel_scope.cancel()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(events, session)
        await exchange.until_gone()
        tasks.cancel_scope.cancel()
