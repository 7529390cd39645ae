"""The client library on anyio (asyncio or trio): connect, spawn, stream, wait.

    async with connect("unix:/run/user/1000/ttyserve.sock") as conn:
        session = await conn.spawn(["make", "test"], pty=False)
        async for chunk in session:
            print(chunk.stream, chunk.data)
        print(session.status.code)

`run()` is the one-call form, in the spirit of `subprocess.run`. Every rule of
the protocol is checked by the sans-I/O core (`protocol/client.py`): a server
that breaks one raises RemoteProtocolError in the sessions waiting on it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..addresses import Address, default_address, parse_address
from ..credentials import tls_context
from ..defaults import CLIENT_NAME, DEFAULT_REMOTE_COMMAND
from ..errors import (
    CarrierError,
    ConnectionLost,
    LocalProtocolError,
    RemoteProtocolError,
    RequestError,
    SessionCancelled,
    SessionDetached,
)
from ..protocol.client import (
    AttachedReceived,
    ClientConnection,
    ClientEvent,
    DetachedReceived,
    ErrorReceived,
    ExitReceived,
    OpenedReceived,
    OpenRefused,
    OutputReceived,
    SessionsReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ..protocol.frames import FrameKind
from ..protocol.messages import (
    DEFAULT_COLS,
    DEFAULT_ROWS,
    DEFAULT_TERM,
    PROTOCOL_VERSION,
    Attach,
    Detach,
    Detached,
    Eof,
    Error,
    Exit,
    Hello,
    Message,
    Open,
    Resize,
    SessionInfo,
    Sessions,
    Signal,
    SignalName,
    Welcome,
    request_error,
)
from ..transport.outbox import Outbox
from ..transport.streams import Transport, send_all
from .dial import open_transport

if TYPE_CHECKING:
    from .carrier import Carrier, StderrLine

READ_SIZE = 1 << 20
SESSION_QUEUE = 64  # output chunks buffered per session before the reader waits
FIRST_BYTES_SHOWN = 60


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Bytes a session wrote: ``stream`` tells stdout from stderr (PTY: always stdout)."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True, slots=True)
class CompletedSession:
    """What `run` returns: the remote status and the captured output."""

    argv: list[str]
    status: Exit
    stdout: bytes
    stderr: bytes

    @property
    def returncode(self) -> int:
        return self.status.code


_Item = OutputChunk | Exit | Detached | Error | Exception


class Session:
    """One remote process. Iterate it for output; `status` is set once `exit` arrived."""

    def __init__(self, connection: Connection, channel: int) -> None:
        self._connection = connection
        self.channel = channel
        self.pid: int | None = None
        self.id: str | None = None  # a detachable session's id: what `attach` takes
        self.pty: bool | None = None
        self.dropped = 0  # for an attached session: output lost from its ring before
        self.status: Exit | None = None
        self.detached: Detached | None = None  # the channel ended, the session goes on
        self.errors: list[Error] = []  # refusals of control messages (e.g. bad_request)
        self._opened = anyio.Event()
        self._open_error: Exception | None = None
        self._send: MemoryObjectSendStream[_Item]
        self._receive: MemoryObjectReceiveStream[_Item]
        # With a window, credit bounds what waits here, and a session nobody reads must not
        # stop the connection's reader (and so every other session); without one, the queue
        # is what pushes back.
        queue = math.inf if connection.window is not None else SESSION_QUEUE
        self._send, self._receive = anyio.create_memory_object_stream[_Item](queue)
        self._cancelled = False
        self._lost: Exception | None = None  # why the connection ended, once it has
        self._credit: anyio.Event | None = None  # made only when stdin has to wait

    # --- input --------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Write to the process's stdin (or type into its terminal).

        Split into frames the server takes; on a windowed connection this waits
        for STDIN credit, as the server grants it while the process reads.
        """
        connection = self._connection
        core = connection._core
        view = memoryview(data)
        while view:
            size = core.stdin_limit(self.channel)
            if not size:
                if not core.live(self.channel):
                    return  # the session ended: what is left has nowhere to go
                await self._wait_credit()
                continue
            await connection._write(core.stdin(self.channel, bytes(view[:size])))
            view = view[size:]

    async def _wait_credit(self) -> None:
        credit = self._credit = self._credit or anyio.Event()
        await credit.wait()
        self._connection._raise_failure()

    def _credit_granted(self) -> None:
        if self._credit is not None:
            self._credit.set()
            self._credit = None

    async def eof(self) -> None:
        """End of input: pipe stdin closed, or the terminal's EOF character."""
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
        if self.status is None and self.detached is None and not self._cancelled:
            await self._control(Detach())

    async def cancel(self) -> None:
        """End the session now: the server kills the process group; no `exit` follows."""
        if self.status is None and not self._cancelled:
            self._cancelled = True
            connection = self._connection
            connection._sessions.pop(self.channel, None)
            self._send.close()
            self._credit_granted()
            frame = connection._core.cancel(self.channel)
            if frame:
                await connection._write(frame)

    async def _control(self, message: Message) -> None:
        core = self._connection._core
        if not core.live(self.channel):
            return  # ended: there is no one to tell
        await self._connection._write(core.control(self.channel, message))

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
        while True:
            if self.status is not None:
                return None
            if self.detached is not None:
                raise SessionDetached(self.detached.reason)
            try:
                item = await self._receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise self._lost or SessionCancelled("the session was cancelled") from None
            if isinstance(item, OutputChunk):
                await self._grant(len(item.data))
                return item
            if isinstance(item, Exit):
                self.status = item
                return None
            if isinstance(item, Detached):
                self.detached = item
                continue
            if isinstance(item, Exception):
                raise item
            self.errors.append(item)

    async def _grant(self, size: int) -> None:
        """Give back output credit as the output is taken (the core says when)."""
        frame = self._connection._core.output_consumed(self.channel, size)
        if frame:
            with contextlib.suppress(ConnectionLost, RemoteProtocolError):
                await self._connection._write(frame)

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
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await (self.detach() if self.id is not None else self.cancel())

    # --- fed by the connection's reader ---------------------------------------

    async def _deliver(self, item: _Item) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._send.send(item)


class Connection:
    """A connection to a ttyserve server; created by `connect`."""

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
        session = await self._begin(request)
        session.pty = pty
        return session

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

    async def _begin(self, request: Open | Attach) -> Session:
        self._raise_failure()
        channel = next(self._channels)
        frame = self._core.open(channel, request)
        session = Session(self, channel)
        self._sessions[channel] = session
        await self._write(frame)
        await session._opened.wait()
        if session._open_error is not None:
            self._sessions.pop(channel, None)
            raise session._open_error
        return session

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

    async def _read_loop(self) -> None:
        core = self._core
        try:
            while True:
                try:
                    data = await self._transport.receive(READ_SIZE)
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
                session._lost = failure  # raised once what was received is taken
                session._send.close()
                session._credit_granted()

    async def _carrier_failed(self) -> None:
        """A carrier that ended before `welcome` fails the connection with its class."""
        if self._early_carrier_end() and self._failure is None:
            assert self._carrier is not None
            self._fail(await self._carrier.failure())

    async def _dispatch(self, event: ClientEvent) -> None:
        if isinstance(event, OutputReceived):
            session = self._sessions.get(event.channel)
            if session is not None:
                stream: Literal["stdout", "stderr"] = (
                    "stderr" if event.kind is FrameKind.STDERR else "stdout")
                await session._deliver(OutputChunk(stream, event.data))
        elif isinstance(event, StdinCreditGranted):
            session = self._sessions.get(event.channel)
            if session is not None:
                session._credit_granted()
        elif isinstance(event, OpenedReceived):
            session = self._sessions.get(event.channel)
            if session is not None:
                session.pid = event.pid
                session.id = event.session
                session._opened.set()
        elif isinstance(event, AttachedReceived):
            session = self._sessions.get(event.channel)
            if session is not None:
                answer = event.attached
                session.pid, session.id, session.pty = answer.pid, answer.session, answer.pty
                session.dropped = answer.dropped
                session._opened.set()
        elif isinstance(event, DetachedReceived):
            session = self._sessions.pop(event.channel, None)
            if session is not None:
                session._credit_granted()
                await session._deliver(Detached(reason=event.reason))
        elif isinstance(event, SessionsReceived):
            if self._listings:
                waiter, done = self._listings.pop(0)
                waiter.append(event.sessions)
                done.set()
        elif isinstance(event, ExitReceived):
            session = self._sessions.pop(event.channel, None)
            if session is not None:
                session._credit_granted()
                await session._deliver(event.exit)
        elif isinstance(event, OpenRefused):
            session = self._sessions.pop(event.channel, None)
            if session is not None:
                session._open_error = request_error(event.error)
                session._opened.set()
        elif isinstance(event, ErrorReceived):
            if event.channel == 0:
                self._fail(request_error(event.error))
            elif (session := self._sessions.get(event.channel)) is not None:
                await session._deliver(event.error)
        elif isinstance(event, WelcomeReceived):
            if self._carrier is not None:
                self._carrier.welcomed = True
            for session in self._sessions.values():
                session._credit_granted()  # the STDIN window is known now

    def _fail(self, exc: Exception) -> None:
        if self._failure is None:
            self._failure = exc
            self._failed.set()
        for waiter, done in self._listings:
            waiter.append(self._failure)
            done.set()
        self._listings.clear()
        for session in self._sessions.values():
            session._credit_granted()
            if not session._opened.is_set():
                session._open_error = self._failure
                session._opened.set()


def client_tls_context(cafile: str | None = None) -> ssl.SSLContext:
    """Verify the server's certificate and name: the system's CAs, or ``cafile``'s.

    Raises ConfigError naming ``cafile`` when it cannot be used.
    """
    return tls_context("client", cafile=cafile)


@contextlib.asynccontextmanager
async def connect(
    address: str | Address | None = None,
    *,
    token: str | None = None,
    multiplex: bool = False,
    client_name: str = CLIENT_NAME,
    tls: ssl.SSLContext | None = None,
    window: int | None = None,
    remote_command: str = DEFAULT_REMOTE_COMMAND,
    carrier_stderr: StderrLine | None = None,
) -> AsyncIterator[Connection]:
    """Connect and say `hello`; `open` may follow at once (pipelined).

    An `ssh://` or `via:` address starts a carrier that runs ``remote_command serve
    --stdio`` on the far side; its stderr lines go to ``carrier_stderr`` (default: our
    stderr, prefixed with the address). If it ends before the far side's `welcome`,
    CarrierError classifies why; the carrier is ended and reaped on the way out. No
    ``token`` is sent through a carrier: the carrier authenticates, and `serve --stdio`
    takes none.

    With ``multiplex`` many sessions share the connection; a ``window`` (bytes)
    then bounds what each may have in flight in both directions, so one slow
    reader, or one process that does not read its input, stalls only its own
    session. Credit is given back as the output is read.

    ``tls`` verifies a `tls:` server (default: the system's CAs). Raises OSError
    (ssl.SSLError for a server that cannot be verified) when the server cannot
    be reached.
    """
    addr = address if isinstance(address, Address) else (
        parse_address(address) if address else default_address())
    async with contextlib.AsyncExitStack() as stack:
        carrier: Carrier | None = None
        if addr.carried:
            from .carrier import run_carrier, show_on_stderr  # subprocess only for carriers

            carrier = await stack.enter_async_context(run_carrier(
                addr, carrier_stderr or show_on_stderr(str(addr)), remote_command))
            transport: Transport = carrier.transport
        else:
            transport = await open_transport(addr, tls or (client_tls_context()
                                                           if addr.encrypted else None))
            stack.push_async_callback(_close_shielded, transport)
        connection = Connection(transport, multiplex, window, carrier)
        if carrier is not None:
            token = None  # a far side takes none: never hand a secret to every host we reach
        hello = Hello(protocol=PROTOCOL_VERSION, token=token, client=client_name,
                      multiplex=multiplex, window=window)
        try:
            await send_all(transport, connection._core.hello(hello))
        except anyio.BrokenResourceError as exc:
            if carrier is not None:
                raise await carrier.failure() from exc
            raise ConnectionResetError(f"the server closed the connection: {exc}") from exc
        failure: BaseException | None = None
        async with anyio.create_task_group() as tg:
            connection._outbox.attach(tg)
            tg.start_soon(connection._read_loop)
            try:
                yield connection
            except BaseException as exc:  # re-raised below, unwrapped by the task group
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure


async def _close_shielded(transport: Transport) -> None:
    with anyio.CancelScope(shield=True):
        await transport.aclose()


async def run(
    argv: Sequence[str],
    *,
    address: str | Address | None = None,
    input: bytes = b"",
    pty: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    token: str | None = None,
    tls: ssl.SSLContext | None = None,
    remote_command: str = DEFAULT_REMOTE_COMMAND,
) -> CompletedSession:
    """Run ``argv`` remotely to completion; return its status and captured output."""
    async with connect(address, token=token, tls=tls, remote_command=remote_command) as conn:
        session = await conn.spawn(argv, pty=pty, env=env, cwd=cwd)
        stdout: list[bytes] = []
        stderr: list[bytes] = []

        async def feed() -> None:
            try:
                await session.send(input)
                await session.eof()
            except ConnectionLost:
                pass  # the process may end (and the server close) before it reads its input

        lost: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed)
            try:
                async for chunk in session:
                    (stderr if chunk.stream == "stderr" else stdout).append(chunk.data)
            except (ConnectionLost, RemoteProtocolError) as exc:  # raised below, unwrapped
                lost = exc
                tg.cancel_scope.cancel()
        if lost is not None:
            raise lost
        assert session.status is not None
        return CompletedSession(list(argv), session.status, b"".join(stdout), b"".join(stderr))


__all__ = [
    "CarrierError",
    "CompletedSession",
    "Connection",
    "ConnectionLost",
    "OutputChunk",
    "RequestError",
    "Session",
    "SessionCancelled",
    "SessionDetached",
    "SessionInfo",
    "connect",
    "run",
]
