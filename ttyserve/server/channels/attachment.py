"""A session attached to one channel of a connection: the sink its output goes to.

An attachment made by `attach` replays the session's scrollback first and goes
live only then. `live` is the gate: until it opens, the attachment takes no
live output (`limit` is 0, so the session's pumps read nothing from the
process) and no exit; the snapshot was taken in the same step that framed
`attached` and made this the session's sink, so the replay and the live output
meet with no gap and no duplicate. Nothing here waits: the replay goes as far
as the channel's credit and the connection's send queue allow, and goes on
when the connection says either grew (`resume`).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

from ...errors import ErrorCode, RequestError
from ...protocol.frames import FrameKind
from ...protocol.messages import (
    STREAM,
    WRITER,
    Attached,
    AttachRole,
    Eof,
    Exit,
    Message,
    Modes,
    Offsets,
)
from ...transport.streams import Buffer
from ..sessions.scrollback import Chunk
from ..sessions.sinks import LOST

if TYPE_CHECKING:
    from ..sessions.session import ServerSession
    from ..sessions.stdin import StdinQueue
    from .route import Later, Route

Chunks = collections.deque[Chunk]  # as the ring keeps them (scrollback.add_chunk)


def take(chunks: Chunks, limit: int) -> Chunk:
    """The first ``limit`` bytes at most of the first chunk, taken off (a view: no copy)."""
    kind, data = chunks[0]
    if len(data) > limit:
        view = memoryview(data)
        chunks[0] = (kind, view[limit:])
        return kind, view[:limit]
    chunks.popleft()
    return kind, data


class ChannelHost(Protocol):
    """What an attachment needs from its connection: the channel's frames, through the one
    object that drives the connection's protocol core."""

    @property
    def peer(self) -> object:
        """Who is at the other end (for the journal and the logs)."""
        ...

    @property
    def link(self) -> bool:
        """Whether the connection is a link from another worker (mesh.py)."""
        ...

    def output_limit(self, channel: int) -> int:
        """Output the channel may send now: its credit, one frame at most; 0 while the
        connection's send queue is full or the channel has ended."""
        ...

    def send_output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        """Frame output and hand it to the writer (within `output_limit`)."""
        ...

    def send_output_soon(self, channel: int, kind: FrameKind,
                         data: Buffer) -> None:
        """Frame output that may be handed on at the end of this turn of the loop."""
        ...

    @property
    def splices(self) -> bool:
        """Whether output may be spliced from a pipe into the connection."""
        ...

    def splice_output(self, channel: int, kind: FrameKind, pipe: int, size: int) -> None:
        """`send_output` of the next ``size`` bytes of ``pipe``, which leave it either way."""
        ...

    def frame_attached(self, route: Route, answer: Attached) -> None:
        """Answer the channel's `attach`: from here on the channel is ``route``'s (its exit
        may end it before `Attachment.attach` returns)."""
        ...

    def refuse(self, channel: int, error: RequestError) -> None:
        """Say `error` on the channel: its request was refused (an `attach` ends there)."""
        ...

    def send_skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        """Tell an observer ``size`` bytes were skipped (section 11)."""
        ...

    def send_audience(self, channel: int, observers: int) -> None:
        """Tell the writer how many observers watch now (section 11)."""
        ...

    def send_modes(self, channel: int, modes: Modes) -> None:
        """Tell the channel the terminal's state (section 14), before the output it covers."""
        ...

    def end_channel(self, route: Route, last: Exit | str | None) -> bool:
        """The channel's last frame: `exit` with ``last``, or `detached` (with ``last`` as
        its reason); the connection forgets the route. False when it had ended."""
        ...

    def stdin_consumed(self, channel: int, size: int, soon: bool = False) -> None:
        """The process took ``size`` bytes of the channel's input (credit may be granted);
        ``soon``: the grant may wait for the end of this turn of the loop."""
        ...

    def until_room(self, stdin: StdinQueue) -> Later | None:
        """The wait for ``stdin`` to take more, when it holds all the client may send."""
        ...

    def let_go(self, route: SessionChannel) -> None:
        """The connection lets go of the session behind ``route``, which goes on."""
        ...


class SessionChannel:
    """What every channel attached to a session is: its connection (``host``), its id, the
    session, the grant it came through; a writer's (`Attachment`) or an observer's."""

    __slots__ = ("channel", "grant", "host", "released", "session", "wants_modes")
    role: AttachRole

    def __init__(self, host: ChannelHost, channel: int, session: ServerSession,
                 grant: str | None = None) -> None:
        self.host = host
        self.channel = channel
        self.session = session
        self.grant = grant  # the public id of the grant it came through, if it did
        self.released = False  # the channel ended, or the session let go of it
        self.wants_modes = False  # it asked for the terminal's state (section 14)

    @property
    def peer(self) -> str:
        return str(self.host.peer)

    def leave(self) -> None:
        """Its connection has gone: nothing more is sent on the channel."""
        self.released = True

    def release(self, reason: str | None = None) -> None:
        """The session goes on without this channel: its last frame is `detached`."""
        raise NotImplementedError

    def modes(self, message: Modes) -> None:
        """The terminal's state changed: told if the channel asked (section 14)."""
        if self.wants_modes and not self.released:
            self.host.send_modes(self.channel, message)

    def watch_modes(self, offset: int) -> None:
        """The channel asked for the terminal's state: the state now, holding from STDOUT
        ``offset``, goes before any output of it (a pipe session has none to tell)."""
        session = self.session
        if (terminal := session.watch_terminal()) is not None:
            terminal.look(offset, session.sink, *session.observers)  # (news to the others)
            self.wants_modes = True
            self.host.send_modes(self.channel, terminal.message(offset))

    def stdin_consumed(self, size: int) -> None:
        """The process took ``size`` bytes of this channel's input (its credit back)."""
        if not self.released:
            self.host.stdin_consumed(self.channel, size)

    def resume(self) -> None:
        """The channel got credit or the connection room: what waited for it goes on."""
        raise NotImplementedError

    # --- the route: what the client sends on the channel (route.py) -----------------

    @property
    def ends_on_upgrade(self) -> bool:
        return not self.session.outlives_upgrade

    def stdin(self, data: bytes) -> Later | None:
        session = self.session
        self.host.stdin_consumed(self.channel, session.feed_stdin(data), soon=True)
        return self.host.until_room(session.stdin)

    def credit(self, size: int) -> None:
        self.resume()

    def control(self, message: Message) -> None:
        if isinstance(message, Eof):
            self.session.stdin.feed_eof()
        else:
            self.session.control(message)

    def detach(self) -> None:
        if not self.session.detachable:
            self.host.refuse(self.channel, RequestError(
                ErrorCode.BAD_REQUEST, "this session is not detachable (it was not opened "
                "with detachable: true); cancel it instead"))
            return
        self.release()  # `detached`: the channel's last frame
        self.host.let_go(self)

    def cancel(self) -> None:
        self.leave()
        self.session.cancel()

    def close(self) -> None:
        self.leave()
        if self.session.detachable:
            self.host.let_go(self)
        else:
            self.session.cancel()


class Attachment(SessionChannel):
    """The sink of ``session`` on ``channel``: replay (if any), then live output, then exit."""

    __slots__ = ("_redraw", "_replay", "live")
    role: AttachRole = WRITER

    def __init__(self, host: ChannelHost, channel: int, session: ServerSession,
                 grant: str | None = None) -> None:
        super().__init__(host, channel, session, grant)
        self.live = True  # the gate: output and the exit go out once the replay has
        self._replay: Chunks | None = None  # what the replay has left to send
        self._redraw = False  # SIGWINCH once the replay is over (a fresh terminal)

    @classmethod
    def attach(cls, host: ChannelHost, channel: int, session: ServerSession,
               offsets: Offsets | None = None, grant: str | None = None,
               modes: bool = False) -> Attachment:
        """Take over a detachable session: in one step, with no await, take its ring from
        ``offsets`` on (the bytes the client holds; the registry checked them), frame
        `attached` and become its sink; the replay starts at once. A client that holds
        nothing of it (no offsets), or lost some, gets the prologue, and the program is
        told to redraw once the replay is over."""
        ring = session.ring
        assert ring is not None, "only a detachable session can be attached"
        held = offsets or Offsets()
        begins, chunks = ring.since(held.stdout, held.stderr)
        fresh = offsets is None or begins[FrameKind.STDOUT] > held.stdout
        attachment = cls(host, channel, session, grant)
        attachment._replay = collections.deque(chunks)
        attachment._redraw = fresh and session.spec.pty and session.final is None
        attachment.live = False
        host.frame_attached(attachment, Attached(
            session=session.id, pid=session.pid, pty=session.spec.pty, dropped=ring.dropped,
            offsets=Offsets(stdout=begins[FrameKind.STDOUT], stderr=begins[FrameKind.STDERR]),
            prologue=session.prologue() if fresh else None, role=cls.role))
        if modes:
            attachment.watch_modes(ring.end[FrameKind.STDOUT])
        session.attach(attachment)
        if session.observers:
            attachment.audience(len(session.observers))
        attachment.resume()
        return attachment

    # --- the session's sink ---------------------------------------------------------

    def limit(self) -> int:
        """Live output the channel takes now (0 during the replay)."""
        if not self.live or self.released:
            return 0
        return self.host.output_limit(self.channel)

    def send_output(self, kind: FrameKind, data: bytes) -> bool:
        self.host.send_output(self.channel, kind, data)
        return bool(self.host.output_limit(self.channel))

    @property
    def splices(self) -> bool:
        return self.live and self.host.splices

    def splice_output(self, kind: FrameKind, pipe: int, size: int) -> bool:
        self.host.splice_output(self.channel, kind, pipe, size)
        return bool(self.host.output_limit(self.channel))

    def send_exit(self, status: Exit) -> bool:
        """Frame the channel's last frame (the session calls this only once it is live)."""
        if self.released:
            return False
        self.released = True
        return self.host.end_channel(self, status)

    def audience(self, observers: int) -> None:
        """The number of observers changed (section 11)."""
        if not self.released:
            self.host.send_audience(self.channel, observers)

    def release(self, reason: str | None = None) -> None:
        """The session goes on without this channel: its last frame is `detached`."""
        if not self.released:
            self.released = True
            self.host.end_channel(self, reason)

    def lost(self) -> None:
        """The session is over without its exit (a server fault): the channel still ends."""
        if not self.released:
            self.released = True
            self.host.end_channel(self, LOST)

    # --- the connection's side ------------------------------------------------------

    def resume(self) -> None:
        """The channel got credit or the send queue room: the replay goes on, or the
        session's pumps do."""
        if self.released:
            return
        if self.live:
            self.session.sink_ready()
            return
        host, channel, replay = self.host, self.channel, self._replay
        while replay:  # (None, or empty, once it is over)
            limit = host.output_limit(channel)
            if not limit:
                return
            kind, data = take(replay, limit)
            host.send_output(channel, kind, data)
        self._replay = None
        self.live = True
        if self._redraw:
            self._redraw = False
            self.session.redraw()
        self.session.sink_ready()


class StreamAttachment(Attachment):
    """The HTTP door's output stream (section 13): the session's writer for its output,
    beside which HTTP writes (`InputChannel`, observer.py) may send input."""

    __slots__ = ()
    role: AttachRole = STREAM
