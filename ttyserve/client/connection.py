"""A connection to a ttyserve server: the reader, the one writer, the sessions by channel.

Every rule of the protocol is checked by the sans-I/O core (`protocol/client.py`): a
server that breaks one raises RemoteProtocolError in the sessions waiting on it. The
connection is each session's `Link`, and hands each session its channel's events.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from ..defaults import CLIENT_RECEIVE
from ..errors import ConnectionLost, RemoteProtocolError
from ..protocol.client import (
    AttachedReceived,
    ClientConnection,
    ClientEvent,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    OpenRefused,
    OutputReceived,
    SessionsReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ..protocol.messages import (
    DEFAULT_COLS,
    DEFAULT_ROWS,
    DEFAULT_TERM,
    Attach,
    Detach,
    Hello,
    Message,
    Open,
    SessionInfo,
    Sessions,
    Welcome,
    request_error,
)
from ..transport.outbox import Outbox
from ..transport.streams import Transport
from .session import ConnectionEnded, Session

if TYPE_CHECKING:
    from .carrier import Carrier

FIRST_BYTES_SHOWN = 60
_CHANNEL_ENDS = (ExitReceived, DetachedReceived, OpenRefused)  # a channel's last event


class Connection:
    """A connection to a ttyserve server; made by `connect`."""

    def __init__(self, transport: Transport, multiplex: bool,
                 window: int | None = None, carrier: Carrier | None = None) -> None:
        self._transport = transport
        self._carrier = carrier
        self._first_bytes = b""  # what the server sent first: shown if it is not the protocol
        self._outbox = Outbox(transport, on_broken=self._send_failed)
        self._core = ClientConnection()
        self.multiplex = multiplex
        self.window = window
        self._sessions: dict[int, Session] = {}
        self._detach_when_attached: set[int] = set()  # attaches whose waiter gave up
        self._listings: list[tuple[list[Sessions | Exception], anyio.Event]] = []
        self._channels = itertools.count(1)
        self._failure: Exception | None = None
        self._failed = anyio.Event()  # set with _failure

    @property
    def welcome(self) -> Welcome | None:
        return self._core.welcome

    @property
    def max_frame(self) -> int:
        """The largest payload the server takes (what `welcome` said; 1 MiB until then)."""
        return self._core.max_frame

    async def spawn(
        self,
        argv: Sequence[str] | None = None,
        *,
        pty: bool = True,
        rows: int = DEFAULT_ROWS,
        cols: int = DEFAULT_COLS,
        term: str = DEFAULT_TERM,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        detachable: bool = False,
    ) -> Session:
        """Open a session and wait for `opened`. Raises RequestError if refused.

        A ``detachable`` session outlives this connection: `session.id` names it for
        `attach`, and it keeps a scrollback of its output meanwhile (section 9).
        """
        request = Open(argv=list(argv or []), pty=pty, rows=rows, cols=cols, term=term,
                       env=dict(env or {}), cwd=cwd, detachable=detachable)
        return await self._begin(request, pty)

    async def attach(self, session_id: str, *, steal: bool = False, rows: int | None = None,
                     cols: int | None = None) -> Session:
        """Take over a detachable session: its scrollback comes first, then live output, then
        its exit (even if it ended while detached). With ``rows`` and ``cols`` its terminal
        is resized first. Raises RequestError: no_such_session, or session_in_use (attached
        elsewhere; ``steal`` takes it over, and the other client's channel ends)."""
        return await self._begin(Attach(session=session_id, rows=rows, cols=cols, steal=steal))

    async def list_sessions(self) -> list[SessionInfo]:
        """This principal's detachable sessions, running, detached or ended (section 9)."""
        self._raise_failure()
        waiter: list[Sessions | Exception] = []
        done = anyio.Event()
        self._listings.append((waiter, done))
        await self._write(self._core.list_sessions())
        await done.wait()
        if isinstance(waiter[0], Exception):
            raise waiter[0]
        return waiter[0].sessions

    async def _begin(self, request: Open | Attach, pty: bool | None = None) -> Session:
        self._raise_failure()
        channel = next(self._channels)
        frame = self._core.open(channel, request)
        session = Session(self, channel, windowed=self.window is not None)
        session.pty = pty  # until the server says (a server that does not: what was asked)
        self._sessions[channel] = session
        try:
            await self._write(frame)
            await session.wait_answered()
        except BaseException:
            self._give_up(channel, request)
            raise
        return session

    def _give_up(self, channel: int, request: Open | Attach) -> None:
        """The `open` or `attach` was cancelled (or failed) before its answer was taken: an
        opened process is cancelled, not left running unseen; an attached session is
        detached, not killed, once its `attached` comes (at once if it has)."""
        self._sessions.pop(channel, None)
        if self._failure is not None or not self._core.live(channel):
            return  # refused, or the connection ended: nothing runs for this channel
        if isinstance(request, Open):
            self._push(self._core.cancel(channel))
        elif self._core.opening(channel):
            self._detach_when_attached.add(channel)
        else:
            self._push(self._core.control(channel, Detach()))

    def _push(self, frame: bytes) -> None:
        """Send ``frame`` with no waiting (from where nothing can wait: a cancel, the reader)."""
        with contextlib.suppress(anyio.BrokenResourceError):
            self._outbox.push([frame])

    # --- each session's Link ---------------------------------------------------------

    def stdin_limit(self, channel: int) -> int:
        return self._core.stdin_limit(channel)

    def live(self, channel: int) -> bool:
        return self._core.live(channel)

    async def send_stdin(self, channel: int, data: bytes) -> None:
        await self._write(self._core.stdin(channel, data))

    async def send_control(self, channel: int, message: Message) -> None:
        await self._write(self._core.control(channel, message))

    async def cancel(self, channel: int) -> None:
        self._sessions.pop(channel, None)
        if frame := self._core.cancel(channel):
            await self._write(frame)

    async def consumed(self, channel: int, size: int) -> None:
        if frame := self._core.output_consumed(channel, size):
            await self._write(frame)

    # --- the one writer --------------------------------------------------------------

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _write(self, data: bytes) -> None:
        self._raise_failure()
        try:
            self._outbox.push([data])
        except anyio.BrokenResourceError:
            if self._early_carrier_end():
                await self._failed.wait()
                self._raise_failure()
            raise ConnectionLost("the connection is closed") from None
        await self._outbox.wait_for_room()

    def _early_carrier_end(self) -> bool:
        """Whether a break now is a carrier's before `welcome`: the read loop sees its stdout
        close and fails the connection with its class (a send that broke first must not
        say less)."""
        return self._carrier is not None and self._core.welcome is None

    def _send_failed(self) -> None:
        if not self._early_carrier_end():
            self._fail(ConnectionLost("send failed: the connection broke"))

    # --- the reader ------------------------------------------------------------------

    def hello(self, hello: Hello) -> bytes:
        """The connection's first frame, to send before `start`."""
        return self._core.hello(hello)

    def start(self, tasks: anyio.abc.TaskGroup) -> None:
        """Run the reader, and the writer when one is needed, in ``tasks``."""
        self._outbox.attach(tasks)
        tasks.start_soon(self._read)

    async def _read(self) -> None:
        """Read until the connection ends, handing each session its events."""
        core = self._core
        try:
            while True:
                try:
                    data = await self._transport.receive(CLIENT_RECEIVE)
                except anyio.EndOfStream:
                    break
                if not self._first_bytes:
                    self._first_bytes = data[:FIRST_BYTES_SHOWN]
                core.receive_data(data)
                while (event := core.next_event()) is not None:
                    await self._dispatch(event)
            await self._carrier_failed()
            self._fail(ConnectionLost("the server closed the connection"))
        except (anyio.BrokenResourceError, OSError) as exc:
            await self._carrier_failed()
            self._fail(ConnectionLost(f"connection lost: {exc}"))
        except anyio.ClosedResourceError as exc:
            self._fail(ConnectionLost(f"connection lost: {exc}"))
        except RemoteProtocolError as exc:
            if self._early_carrier_end():
                exc = RemoteProtocolError(
                    f"{exc.message}; the far side began with {self._first_bytes!r}, which is "
                    "not the protocol (does a shell startup file print something?)", exc.code)
            self._fail(exc)
        finally:
            self._fail(ConnectionLost("the connection was closed here"))  # if nothing else
            failure = self._failure
            assert failure is not None
            for session in list(self._sessions.values()):
                await session.feed(ConnectionEnded(failure))

    async def _carrier_failed(self) -> None:
        """A carrier that ended before `welcome` fails the connection with its class."""
        if self._early_carrier_end() and self._failure is None:
            assert self._carrier is not None
            self._fail(await self._carrier.failure())

    async def _dispatch(self, event: ClientEvent) -> None:
        if type(event) is OutputReceived:  # the common case, first
            if (session := self._sessions.get(event.channel)) is not None:
                await session.feed(event)
        elif isinstance(event, SessionsReceived):
            if self._listings:
                waiter, done = self._listings.pop(0)
                waiter.append(event.sessions)
                done.set()
        elif isinstance(event, WelcomeReceived):
            if self._carrier is not None:
                self._carrier.welcomed = True
            for channel, waiting in list(self._sessions.items()):
                await waiting.feed(StdinCreditGranted(channel))  # the window is known now
        elif isinstance(event, ErrorReceived) and event.channel == 0:
            self._fail(request_error(event.error))
        elif isinstance(event, AttachedReceived) and event.channel in self._detach_when_attached:
            self._detach_when_attached.discard(event.channel)
            self._push(self._core.control(event.channel, Detach()))
        else:  # the channel's own: its session takes it, and the last one ends it
            ends = isinstance(event, _CHANNEL_ENDS)
            if ends:
                self._detach_when_attached.discard(event.channel)  # refused: nothing to detach
            session = (self._sessions.pop(event.channel, None) if ends
                       else self._sessions.get(event.channel))
            if session is not None:
                await session.feed(event)

    def _fail(self, exc: Exception) -> None:
        """The connection is over, for ``exc``: every waiter hears it (the sessions once the
        reader has handed them what was received before)."""
        if self._failure is None:
            self._failure = exc
            self._failed.set()
        for waiter, done in self._listings:
            waiter.append(self._failure)
            done.set()
        self._listings.clear()
