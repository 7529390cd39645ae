"""One remote process, as the client library sees it: its output to iterate, its input, its end.

A session's seam to its connection is small both ways. The connection hands it every event
of its channel through one method, `feed`; the session asks the connection for frames on
its channel through a `Link`. Neither reaches into the other.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio

from ..defaults import GOODBYE_WAIT
from ..errors import (
    ConnectionLost,
    ErrorCode,
    LocalProtocolError,
    RemoteProtocolError,
    RequestError,
    SessionCancelled,
    SessionDetached,
)
from ..protocol.client import (
    AttachedReceived,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    NoticeReceived,
    OpenedReceived,
    OpenRefused,
    OutputReceived,
    StdinCreditGranted,
)
from ..protocol.frames import FrameKind
from ..protocol.messages import (
    OBSERVER,
    WRITER,
    Attach,
    Attached,
    AttachRole,
    Audience,
    Detach,
    Detached,
    Eof,
    Error,
    Exit,
    Message,
    Modes,
    Offsets,
    Opened,
    Resize,
    Signal,
    SignalName,
    Skipped,
    request_error,
)

if TYPE_CHECKING:
    from .link import Link

SESSION_QUEUE = 64  # output chunks buffered per session before the reader waits

@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Bytes a session wrote: ``stream`` tells stdout from stderr (PTY: always stdout)."""

    stream: Literal["stdout", "stderr"]
    data: bytes
    offset: int = 0  # of its first byte in its stream, since the session started


class ConnectionEnded:
    """The connection ended (or broke) before the session did: ``error`` says how."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


@dataclass(frozen=True, slots=True)
class Lost:
    """A resuming session lost its connection (``reason``); the connection dials again."""

    session: Session
    reason: str


@dataclass(frozen=True, slots=True)
class Resumed:
    """A resuming session is attached again, ``after`` seconds; ``lost_bytes`` of its output
    were dropped from the server's ring meanwhile and never reach this client."""

    session: Session
    after: float
    lost_bytes: int


ResumeEvent = Lost | Resumed

SessionEvent = (
    OpenedReceived | AttachedReceived | OpenRefused | OutputReceived | ExitReceived
    | DetachedReceived | ErrorReceived | StdinCreditGranted | ConnectionEnded | NoticeReceived
)
_Item = OutputChunk | Skipped | Modes | Exit | Detached | Error


class Session:
    """One remote process. Iterate it for output; `status` is set once `exit` arrived."""

    def __init__(self, link: Link, channel: int, *, windowed: bool,
                 resume: float | None = None, pty: bool | None = None,
                 role: AttachRole = WRITER, modes: bool = False) -> None:
        self._link = link
        self.channel = channel  # on the connection's current link
        self.resume = resume  # seconds it may take to come back after a lost connection
        # Per stream, the bytes received since the session started (or since the ring's
        # oldest byte, for an attach without offsets): where a resume attaches.
        self.offsets = Offsets()
        self.began = Offsets()  # where the output of its (last) attach began
        self.lost_bytes = 0  # output the ring dropped while this client was away
        self._lost_at: float | None = None  # while it resumes: when its connection was lost
        self._eof_sent = False  # its input is over: said again after a resume (pipes only)
        self._unread = 0  # output bytes queued here, not yet taken by the application
        self._stale = 0  # of those, what came on a lost link: no credit to give back
        self.pid: int | None = None
        self.id: str | None = None  # a detachable session's id: what `attach` takes
        self.argv: list[str] | None = None  # what runs, as the server said
        self.target: str | None = None  # the target it runs on (section 15), as `opened` said
        self.pty = pty  # whether it runs under a PTY: as asked until the server says
        self.dropped = 0  # for an attached session: output lost from its ring before
        self.prologue: str | None = None  # for an attached PTY: what restores the terminal
        self.role = role  # section 11: an attach as observer only watches (as asked, until
        # `attached` confirms it)
        self.observers = 0  # for the writer: how many watch now (`audience`)
        self.skipped = 0  # for an observer: output the server skipped it past (it fell behind)
        self.modes: Modes | None = None  # the terminal's state, as last taken (section 14)
        self._asked_modes = modes  # (asked again by a resume's attach)
        self.status: Exit | None = None
        self.detached: Detached | None = None  # the channel ended, the session goes on
        self.errors: list[Error] = []  # refusals of control messages (e.g. bad_request)
        self._answered = anyio.Event()
        self._refusal: Exception | None = None
        # With a window, credit bounds what waits here, and a session nobody reads must not
        # stop the connection's reader (and so every other session); without one, the queue
        # is what pushes back.
        self._send, self._receive = anyio.create_memory_object_stream[_Item](
            math.inf if windowed else SESSION_QUEUE)
        self._cancelled = False
        self._detaching = False  # `detach` was asked: asking again sends nothing
        self._lost: Exception | None = None  # why the connection ended, once it has
        self._credit: anyio.Event | None = None  # made only when stdin has to wait

    @property
    def answered(self) -> bool:
        """Whether the server accepted the `open` or `attach`."""
        return self._answered.is_set() and self._refusal is None

    async def wait_answered(self) -> None:
        """Until the server answered the `open` or `attach`; raises its refusal (or what
        ended the connection first)."""
        await self._answered.wait()
        if self._refusal is not None:
            raise self._refusal

    # --- resume (section 10): the connection tells, the session keeps count ----------

    @property
    def resumable(self) -> bool:
        """Whether a lost connection may be mended for it: it was spawned or attached with
        ``resume``, and the server answered (its id is what a new link attaches)."""
        return self.resume is not None and self.id is not None and self.answered

    @property
    def resuming(self) -> bool:
        """Whether its connection was lost and it is not attached again yet."""
        return self._lost_at is not None

    def lost(self, now: float, reason: str) -> Lost | None:
        """Its connection was lost at ``now``: the `Lost` to tell, or None when it was lost
        already (a link a resume dialled was lost before the session was attached on it):
        its window counts from the first loss."""
        if self._lost_at is not None:
            return None
        self._lost_at = now
        return Lost(self, reason)

    def time_left(self, now: float) -> float:
        """Seconds left of its window to come back in (none left: it gives up)."""
        assert self._lost_at is not None and self.resume is not None
        return self.resume - (now - self._lost_at)

    def rejoin(self, channel: int) -> Attach:
        """It goes on on ``channel`` of a new link: the `attach` that resumes it there, at
        its offsets (with steal: the server may not know yet that the old link is dead; an
        observer's is its role again)."""
        assert self.id is not None
        self.channel = channel
        return Attach(session=self.id, steal=self.role == WRITER, offsets=self.offsets,
                      role=self.role, modes=self._asked_modes)

    def resumed(self, attached: Attached, now: float) -> Resumed:
        """It is attached again (before the `attached` is fed): what the ring no longer held
        is lost; its input goes on on the new link."""
        assert self._lost_at is not None
        begins = attached.offsets or Offsets()
        lost = (max(0, begins.stdout - self.offsets.stdout)
                + max(0, begins.stderr - self.offsets.stderr))
        after = now - self._lost_at
        self._lost_at = None
        self.lost_bytes += lost
        self.wake_sender()
        return Resumed(self, after, lost)

    @property
    def eof_again(self) -> bool:
        """Whether its `eof` is said again on a resumed channel: it may have been lost with
        the link (input is not exact across a resume), and a process that waits for it
        would wait for ever; closing a pipe twice is nothing. (Not a PTY's: a second
        end-of-file character could end its shell.)"""
        return self._eof_sent and self.pty is False

    # --- input --------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write to the process's stdin (or type into its terminal).

        Split into frames the server takes; on a windowed connection this waits
        for STDIN credit, as the server grants it while the process reads. An observer's
        input would reach nothing: LocalProtocolError.
        """
        if self.role == OBSERVER:
            raise LocalProtocolError("this session is observed, not written to: its input "
                                     "would reach nothing")
        link = self._link
        view = memoryview(data)
        while view:
            size = link.stdin_limit(self)
            if not size:
                if not link.live(self):
                    return  # the session ended: what is left has nowhere to go
                credit = self._credit = self._credit or anyio.Event()
                await credit.wait()
                if self._lost is not None:
                    raise self._lost
                continue
            if await link.send_stdin(self, bytes(view[:size])):
                view = view[size:]

    async def eof(self) -> None:
        """End of input: pipe stdin closed, or the terminal's EOF character."""
        self._eof_sent = True
        await self._control(Eof())

    async def resize(self, rows: int, cols: int) -> None:
        await self._control(Resize(rows=rows, cols=cols))

    async def signal(self, name: SignalName) -> None:
        """Send a signal by name without `SIG` (`INT`, `TERM`, ...)."""
        await self._control(Signal(name=name))

    async def detach(self) -> None:
        """Ask to leave a detachable session running. Output that came before the server's
        `detached` is still delivered; then the iteration ends with SessionDetached (or
        normally, if the process ended first)."""
        if self.id is None:
            raise LocalProtocolError("this session is not detachable (spawn it with "
                                     "detachable=True)")
        if (self.status is None and self.detached is None and not self._cancelled
                and not self._detaching):
            self._detaching = True
            await self._control(Detach())

    async def cancel(self) -> None:
        """End the session now: the server kills the process group; no `exit` follows. An
        observer cannot end the session: it detaches, and the session goes on."""
        if self.role == OBSERVER:
            await self.detach()
            return
        if self.status is None and not self._cancelled:
            self._cancelled = True
            self._send.close()
            self.wake_sender()
            await self._link.cancel(self)

    async def _control(self, message: Message) -> None:
        if self._link.live(self):  # else ended: there is no one to tell
            await self._link.send_control(self, message)

    # --- output -------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self

    async def __anext__(self) -> OutputChunk:
        chunk = await self.receive()
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def receive(self) -> OutputChunk | None:
        """The next output chunk, or None once the `exit` arrived (see `status`).

        Raises ConnectionLost if the connection ended first, RemoteProtocolError
        if the server broke the protocol, SessionCancelled after `cancel`,
        SessionDetached once the channel ended with the session going on (a `detach`,
        or another client that attached with steal).
        """
        while isinstance(event := await self.next_event(), Skipped | Modes):
            pass
        return event

    async def next_event(self) -> OutputChunk | Skipped | Modes | None:
        """As `receive`, and an observer's `skipped` notices (section 11) and the terminal's
        `modes` (section 14, `modes` holds the last) in their place between the chunks."""
        while True:
            if self.status is not None:
                return None
            if self.detached is not None:
                raise SessionDetached(self.detached.reason)
            try:
                item = await self._receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                if self._lost is not None:  # (its cause kept: server_restarting, say)
                    raise self._lost from self._lost.__cause__
                raise SessionCancelled("the session was cancelled") from None
            if isinstance(item, OutputChunk):
                size = len(item.data)
                self._unread -= size
                if self._stale:  # came on a lost link: its credit went with it
                    paid = min(size, self._stale)
                    self._stale -= paid
                    size -= paid
                if size:
                    with contextlib.suppress(ConnectionLost, RemoteProtocolError):  # told later
                        await self._link.consumed(self, size)
                return item
            if isinstance(item, Skipped | Modes):
                self.modes = item if isinstance(item, Modes) else self.modes
                return item
            if isinstance(item, Exit):
                self.status = item
                return None
            if isinstance(item, Detached):
                self.detached = item
                continue
            self.errors.append(item)

    async def wait(self) -> Exit:
        """Discard remaining output and return the exit status."""
        while await self.receive() is not None:
            pass
        assert self.status is not None
        return self.status

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Leaving the block ends a session still running: a detachable one is detached
        (it goes on), any other is cancelled."""
        if self.status is None and self.detached is None:
            with anyio.CancelScope(shield=True) as scope, contextlib.suppress(Exception):
                scope.deadline = anyio.current_time() + GOODBYE_WAIT  # (a resume under way
                await (self.detach() if self.id is not None else self.cancel())  # may wait)

    # --- the seam: every event of the channel, from the connection's reader ----------

    async def feed(self, event: SessionEvent) -> None:
        """Take one event of this session's channel (the connection's reader calls this);
        it waits only while the output queue is full (no window: that is the push-back)."""
        if isinstance(event, OutputReceived):
            size = len(event.data)
            self._unread += size
            if event.kind is FrameKind.STDERR:
                self.offsets.stderr += size
                await self._queue(OutputChunk("stderr", event.data, self.offsets.stderr - size))
            else:
                self.offsets.stdout += size
                await self._queue(OutputChunk("stdout", event.data, self.offsets.stdout - size))
        elif isinstance(event, StdinCreditGranted):
            self.wake_sender()
        elif isinstance(event, OpenedReceived):
            self._opened(event.opened)
        elif isinstance(event, AttachedReceived):
            self._attached(event.attached)
        elif isinstance(event, NoticeReceived):
            self._notice(event.notice)
            if isinstance(event.notice, Skipped | Modes):
                await self._queue(event.notice)  # for `next_event`, in its place
        elif isinstance(event, OpenRefused):
            self._refused(event.error)
        elif isinstance(event, ExitReceived):
            self.wake_sender()
            await self._queue(event.exit)
        elif isinstance(event, DetachedReceived):
            self.wake_sender()
            await self._queue(Detached(reason=event.reason))
        elif isinstance(event, ErrorReceived):
            await self._queue(event.error)
        else:
            self._ended(event.error)

    def _opened(self, opened: Opened) -> None:
        self.pid, self.id, self.argv = opened.pid, opened.session, opened.argv
        self.target = opened.target
        if opened.pty is not None:  # (a server that does not say: what was asked)
            self.pty = opened.pty
        self._answered.set()

    def _attached(self, attached: Attached) -> None:
        self.pid, self.id, self.pty = attached.pid, attached.session, attached.pty
        self.dropped = attached.dropped
        if attached.offsets is not None:  # where this attach's output begins
            self.offsets = Offsets(stdout=attached.offsets.stdout,
                                   stderr=attached.offsets.stderr)
            self.began = Offsets(stdout=attached.offsets.stdout, stderr=attached.offsets.stderr)
        self._stale = self._unread
        self.prologue = attached.prologue
        if self.role == OBSERVER and attached.role != OBSERVER:
            # A server that does not know section 11 attaches a writer: never act as one
            # for a client that asked to watch (the connection detaches it).
            self._refusal = RequestError(
                ErrorCode.BAD_REQUEST, "the server attached this channel as writer, not "
                "observer: it does not serve observers (protocol section 11)")
        else:
            self.role = attached.role or WRITER
        self._answered.set()

    def _notice(self, notice: Skipped | Audience | Modes) -> None:
        if isinstance(notice, Audience):
            self.observers = notice.observers
            return
        if isinstance(notice, Modes):
            return  # (taken in its place, by `next_event`)
        self.skipped += notice.bytes  # skipped: the streams go on that much later
        if notice.offsets is not None:
            self.offsets = Offsets(stdout=notice.offsets.stdout, stderr=notice.offsets.stderr)
        else:
            self.offsets.stdout += notice.bytes

    def _refused(self, error: Error) -> None:
        if self._answered.is_set():  # a resume's attach: the session is gone
            self._ended(ConnectionLost(
                f"could not resume: the server answered {error.code}: {error.message}"))
            return
        self._refusal = request_error(error)
        self._answered.set()

    def _ended(self, error: Exception) -> None:
        """The connection ended: ``error`` is raised once what was received is taken."""
        self._lost = error
        if self._answered.is_set() and isinstance(error, RequestError) and error.retriable:
            # The server ended the whole connection for a while (`server_restarting` on
            # channel 0) after the session began: for the session, it was lost.
            self._lost = ConnectionLost(f"the server closed the connection: {error}")
            self._lost.__cause__ = error
        if not self._answered.is_set():
            self._refusal = error
            self._answered.set()
        self._send.close()
        self.wake_sender()

    async def _queue(self, item: _Item) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._send.send(item)

    def wake_sender(self) -> None:
        """Input waiting for credit (or a resume) looks again."""
        if self._credit is not None:
            self._credit.set()
            self._credit = None

