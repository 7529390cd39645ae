"""An observer's channel (protocol section 11): it watches a session and never holds it back.

An observer gets what a writer gets (the replay from its offsets, live output, the
exit), but its output waits here, in a backlog of its own, never in front of the
process: the session hands every chunk to each observer and goes on. The backlog goes
out as fast as the observer's credit and its connection take it. It is bounded as the
ring is (each chunk counts CHUNK_COST beyond its bytes, small chunks of one stream are
joined); an observer that falls more than that behind is parked: its backlog is let go,
the session no longer hands it anything, and the session's ring, which holds at least
what the backlog could, is its source from then on. When it can take output again it
goes on from the ring at its offsets, told with `skipped` (how many bytes it will never
get, and the offsets its streams go on at) what the ring no longer held. So an observer
that stops reading costs nothing per chunk and holds no memory of its own.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING

from ...defaults import REDRAW_INTERVAL
from ...protocol.frames import FrameKind
from ...protocol.messages import INPUT, OBSERVER, Attached, AttachRole, Exit, Offsets
from ..sessions.scrollback import CHUNK_COST, add_chunk
from .attachment import ChannelHost, Chunks, SessionChannel, take

if TYPE_CHECKING:
    from ..sessions.session import ServerSession
    from .route import Later


class Observer(SessionChannel):
    """One channel watching ``session``."""

    __slots__ = ("_exit", "_held", "_next", "_parked", "_skipped", "backlog", "limit_bytes")
    role: AttachRole = OBSERVER

    def __init__(self, host: ChannelHost, channel: int, session: ServerSession,
                 grant: str | None = None) -> None:
        super().__init__(host, channel, session, grant)
        self.backlog: Chunks = collections.deque()  # not sent yet, oldest first
        assert session.ring is not None, "only a detachable session can be observed"
        self.limit_bytes = session.ring.size  # the backlog's bound: a scrollback
        self._held = 0  # what the backlog holds, counted as the ring counts (CHUNK_COST)
        self._next = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}  # each stream's next offset
        self._skipped = 0  # dropped and not told yet
        self._parked = False  # fell a scrollback behind: the ring holds what it has not had
        self._exit: Exit | None = None  # to send once the backlog is out

    @classmethod
    def attach(cls, host: ChannelHost, channel: int, session: ServerSession,
               offsets: Offsets | None = None, grant: str | None = None,
               modes: bool = False) -> Observer:
        """Watch a detachable session, in one step with no await as a writer's attach: its
        ring from ``offsets`` on is the backlog, `attached` is framed, live output is added
        behind it. A client that holds nothing of it gets the prologue; where the ring no
        longer holds what it needs, the program is told to redraw (its redraw comes behind
        the backlog), as for a writer: what it shows then is what the writer sees."""
        ring = session.ring
        assert ring is not None, "only a detachable session can be observed"
        held = offsets or Offsets()
        begins, chunks = ring.since(held.stdout, held.stderr)
        observer = cls(host, channel, session, grant)
        observer._next = dict(begins)
        for kind, data in chunks:
            observer._add(kind, data)
        fresh = offsets is None or begins[FrameKind.STDOUT] > held.stdout
        host.frame_attached(observer, Attached(
            session=session.id, pid=session.pid, pty=session.spec.pty, dropped=ring.dropped,
            offsets=Offsets(stdout=begins[FrameKind.STDOUT], stderr=begins[FrameKind.STDERR]),
            prologue=session.prologue() if fresh else None, role=cls.role))
        if modes:
            observer.watch_modes(ring.end[FrameKind.STDOUT])
        session.add_observer(observer)
        if begins[FrameKind.STDOUT] > held.stdout and session.spec.pty:
            session.redraw(unless_within=REDRAW_INTERVAL)  # (observers coming and going
        observer.resume()  # must not keep a full-screen program redrawing)
        return observer

    # --- the session's side ---------------------------------------------------------

    def output(self, kind: FrameKind, data: bytes) -> None:
        """The session produced ``data``: behind the backlog, which goes on as far as it may;
        if what is left is more than a scrollback, the observer is parked."""
        if self.released or self._parked:
            return  # (parked: the ring keeps it)
        self._add(kind, data)
        self.resume()
        if self._held > self.limit_bytes:
            self.backlog.clear()
            self._held = 0
            self._parked = True

    def _add(self, kind: FrameKind, data: bytes) -> None:
        self._held += add_chunk(self.backlog, kind, data)

    def finish(self, status: Exit) -> None:
        """The session is over: ``status`` is this channel's last frame, after the backlog."""
        if self._exit is None:
            self._exit = status
            self.resume()

    def release(self, reason: str | None = None) -> None:
        """The channel ends with `detached` (``reason``); the session goes on without it."""
        self._end(reason)

    def leave(self) -> None:
        """Its connection has gone (or its channel ended): the session lets go of it."""
        if not self.released:
            super().leave()
            self.session.remove_observer(self)

    def _end(self, last: Exit | str | None) -> None:
        """The channel's last frame (`exit`, or `detached` with a reason)."""
        if not self.released:
            self.leave()
            self.host.end_channel(self, last)

    # --- the connection's side ------------------------------------------------------

    def resume(self) -> None:
        """Send what the channel's credit and the connection's send queue take now (a parked
        observer first takes what it has not had from the ring)."""
        if self.released:
            return
        host, channel, backlog = self.host, self.channel, self.backlog
        if self._parked:
            if not host.output_limit(channel):
                return
            self._unpark()
        while backlog:
            limit = host.output_limit(channel)
            if not limit:
                return
            if self._skipped:
                self._tell_skipped()
            chunks = len(backlog)
            kind, data = take(backlog, limit)
            size = len(data)
            self._held -= size + (CHUNK_COST if len(backlog) < chunks else 0)
            self._next[kind] += size
            host.send_output_soon(channel, kind, data)
        if self._exit is not None:
            if self._skipped:
                self._tell_skipped()
            self._end(self._exit)

    def _unpark(self) -> None:
        """Go on from the ring at this observer's offsets: what it no longer holds is
        skipped."""
        ring = self.session.ring
        assert ring is not None
        begins, chunks = ring.since(self._next[FrameKind.STDOUT], self._next[FrameKind.STDERR])
        for kind, offset in begins.items():
            self._skipped += offset - self._next[kind]
        self._next = dict(begins)
        for kind, data in chunks:
            self._add(kind, data)
        self._parked = False

    def _tell_skipped(self) -> None:
        self.host.send_skipped(self.channel, self._skipped, Offsets(
            stdout=self._next[FrameKind.STDOUT], stderr=self._next[FrameKind.STDERR]))
        self._skipped = 0


class InputChannel(Observer):
    """An HTTP write (section 13): input for a session whose writer, if any, is the HTTP
    door's output stream. It watches as an observer does (what it is sent, its request
    drops) and its input goes to the process, the input's credit back to it."""

    __slots__ = ()
    role: AttachRole = INPUT

    def stdin(self, data: bytes) -> Later | None:
        self.session.feeder = self
        return super().stdin(data)

    def leave(self) -> None:
        session = self.session
        if session.feeder is self:
            session.feeder = None
        if session.sink is None and session.detached_at is not None:
            session.detached_at = time.monotonic()  # (its detached timeout starts again)
        super().leave()
