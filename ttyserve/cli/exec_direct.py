"""`exec` with no event loop: one session in pipe mode over a plain Unix or TCP socket.

Scripts and coordinators call `exec` in loops, and most of its start-up was the
import of an event loop. This path drives the same sans-I/O core with poll(2)
on the socket, our stdin and a signal wake-up pipe, and says and returns what
the anyio path (exec_cmd.py) does, through the same exec_report.py. A PTY, TLS,
WebSocket, carriers, detachable and resumed sessions and heartbeats take the anyio path.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from types import FrameType

from ..client.retry import RETRIED
from ..defaults import CLIENT_NAME, CLIENT_RECEIVE, OUTBOX_LIMIT, STDIN_READ, TERM_GRACE
from ..errors import ConnectionLost, RemoteProtocolError
from ..exitcodes import exec_exit_code
from ..protocol.client import (
    ClientConnection,
    ErrorReceived,
    ExitReceived,
    OpenedReceived,
    OpenRefused,
    OutputReceived,
)
from ..protocol.frames import FrameKind
from ..protocol.messages import (
    PROTOCOL_VERSION,
    Eof,
    Exit,
    Hello,
    Open,
    Signal,
    members,
    request_error,
)
from .exec_report import (
    FORWARDED,
    ExecFailure,
    ExecOptions,
    Output,
    connection_ended,
    output_closed,
    retry_delay,
    say,
    second_interrupt,
    stopped_before_start,
    terminated,
)
from .terminal import window_size

CHANNEL = 1


def eligible(options: ExecOptions) -> bool:
    """Whether this path runs ``options``: pipe mode, a plain socket, nothing detachable or
    resumed, no heartbeat."""
    return (options.address.scheme in ("unix", "tcp") and not options.multiplex
            and options.heartbeat is None
            and (options.pty is False or (options.pty is None and not os.isatty(0))))


class _Stopped(Exception):
    """A signal to stop came before the session was open: nothing ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Signals:
    """Forwarded signals, seen through a wake-up pipe; until `opened` they stop us."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.opening = True
        self._previous = {signum: signal.signal(signum, self._handle) for signum in FORWARDED}
        self._wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.opening:
            self.opening = False  # the first one stops us; later ones only wake the pipe
            raise _Stopped(signum)

    def received(self) -> list[int]:
        try:
            return list(os.read(self.read_fd, 64))
        except BlockingIOError:
            return []

    def close(self) -> None:
        signal.set_wakeup_fd(self._wakeup)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self.read_fd)
        os.close(self._write_fd)


class _Session:
    """The connection, its core, and what is framed but not yet sent."""

    def __init__(self, options: ExecOptions) -> None:
        self.core = ClientConnection()
        self.sock = _connect(options)
        self.outgoing = bytearray()
        self.broken = False  # a send failed: what the server sent is still read, to its end
        self.status: Exit | None = None
        self.pid: int | None = None

    def close(self) -> None:
        self.sock.close()

    def send_now(self) -> None:
        """Send what fits without waiting. A failed send is not the end: the output and
        the exit may have arrived already, and reading says how the connection ended."""
        while self.outgoing and not self.broken:
            try:
                sent = self.sock.send(self.outgoing)
            except BlockingIOError:
                return
            except (BrokenPipeError, ConnectionResetError):
                self.broken = True
            except OSError as exc:
                raise ConnectionLost(f"send failed: {exc.strerror or exc}") from exc
            else:
                del self.outgoing[:sent]
        if self.broken:
            self.outgoing.clear()

    def receive(self) -> bool:
        """Read what has arrived into the core; False when nothing had."""
        try:
            data = self.sock.recv(CLIENT_RECEIVE)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise ConnectionLost(f"connection lost: {exc.strerror or exc}") from exc
        if not data:
            raise ConnectionLost("the server closed the connection")
        self.core.receive_data(data)
        return True


def _connect(options: ExecOptions) -> socket.socket:
    address = options.address
    if address.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address.path)
        except BaseException:
            sock.close()
            raise
    else:
        sock = socket.create_connection((address.host, address.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


def _open(options: ExecOptions, signals: _Signals) -> _Session:
    """Connect, say `hello` and `open`, and wait for `opened` (what came with it stays in the
    core); raises what the anyio path's `connect` and `spawn` raise (OSError,
    RequestError, ConnectionLost, RemoteProtocolError)."""
    session = _Session(options)
    try:
        rows, cols = window_size(0 if os.isatty(0) else 1)
        session.outgoing += session.core.hello(Hello(
            protocol=PROTOCOL_VERSION, token=options.token, client=CLIENT_NAME))
        session.outgoing += session.core.open(CHANNEL, Open(
            argv=options.argv, pty=False, rows=rows, cols=cols, env=options.env,
            cwd=options.cwd, target=options.on_target))
        poll = select.poll()
        while True:
            session.send_now()
            poll.register(session.sock, select.POLLIN | (
                select.POLLOUT if session.outgoing else 0))
            poll.poll()
            if session.receive():
                while (event := session.core.next_event()) is not None:
                    if isinstance(event, OpenedReceived):
                        signals.opening = False  # from now on signals are the session's
                        session.pid = event.opened.pid
                        return session
                    if isinstance(event, (OpenRefused, ErrorReceived)):
                        raise request_error(event.error)
    except BaseException:
        session.close()
        raise


def _open_with_retries(options: ExecOptions, signals: _Signals) -> _Session:
    for attempt in range(options.retries + 1):
        try:
            return _open(options, signals)
        except RETRIED as exc:
            # A signal to stop ends the wait: _Signals raises _Stopped.
            time.sleep(retry_delay(exc, options, attempt))
    raise AssertionError("unreachable")


def _has_stdin() -> bool:
    try:
        os.fstat(0)
    except OSError:
        return False
    return True


def _stream(session: _Session, signals: _Signals, out: Output, stdin_open: bool) -> int:
    """Forward stdin and signals, write the output; the exit code once `exit` came."""
    core, sock = session.core, session.sock
    stdin_polled = False
    interrupted = False
    cancel_at: float | None = None  # a SIGTERM was forwarded: cancelled then (TERM_GRACE)
    poll = select.poll()
    poll.register(signals.read_fd, select.POLLIN)
    _act(session, out)  # what came with `opened` (all of it, for a short command)
    while session.status is None:
        session.send_now()
        poll.register(sock, select.POLLIN | (select.POLLOUT if session.outgoing else 0))
        reading_stdin = stdin_open and not session.broken and len(session.outgoing) < OUTBOX_LIMIT
        if reading_stdin != stdin_polled:
            if reading_stdin:
                poll.register(0, select.POLLIN)
            else:
                poll.unregister(0)
            stdin_polled = reading_stdin
        wait = None if cancel_at is None else max(cancel_at - time.monotonic(), 0)
        ready = dict(poll.poll(None if wait is None else wait * 1000))
        if cancel_at is not None and time.monotonic() >= cancel_at:
            session.outgoing += core.cancel(CHANNEL)
            session.send_now()
            raise terminated()
        for signum in signals.received():
            if signum == signal.SIGINT and interrupted:
                session.outgoing += core.cancel(CHANNEL)
                session.send_now()
                raise second_interrupt()
            if signum == signal.SIGTERM and cancel_at is not None:
                session.outgoing += core.cancel(CHANNEL)
                session.send_now()
                raise terminated()
            if signum == signal.SIGTERM:
                cancel_at = time.monotonic() + TERM_GRACE
            interrupted = interrupted or signum == signal.SIGINT
            name = FORWARDED[signal.Signals(signum)]
            session.outgoing += core.control(CHANNEL, Signal(name=name))
        if reading_stdin and ready.get(0):
            stdin_open = _read_stdin(session)
        if ready.get(sock.fileno()) and session.receive():
            _act(session, out)
    out.event("exit", **members(session.status))
    return exec_exit_code(session.status)


def _act(session: _Session, out: Output) -> None:
    """Write the output the core has; note the exit."""
    core = session.core
    while (event := core.next_event()) is not None:
        if isinstance(event, OutputReceived):
            try:
                out.data("stderr" if event.kind is FrameKind.STDERR else "stdout", event.data)
            except BrokenPipeError:
                session.outgoing += core.cancel(CHANNEL)
                session.send_now()
                raise output_closed() from None
        elif isinstance(event, ExitReceived):
            session.status = event.exit
        elif isinstance(event, ErrorReceived) and event.channel == 0:
            raise ConnectionLost(f"the server refused: {event.error.code}: "
                                 f"{event.error.message}")


def _read_stdin(session: _Session) -> bool:
    """One read of our stdin to the session, one frame; False once it ended (`eof` sent)."""
    try:
        data = os.read(0, min(STDIN_READ, session.core.max_frame))
    except BlockingIOError:
        return True  # a non-blocking stdin we share with someone else
    except OSError as exc:
        say(f"cannot read stdin ({exc.strerror}): sending end-of-input")
        data = b""
    if data:
        session.outgoing += session.core.stdin(CHANNEL, data)
        return True
    session.outgoing += session.core.control(CHANNEL, Eof())
    return False


def exec_direct(options: ExecOptions) -> int:
    """Run ``options`` (which `eligible` accepted) to its end; `exec`'s exit code."""
    out = Output(options.json)
    stdin_open = _has_stdin()  # before the signal pipe, which would take a closed fd 0
    signals = _Signals()
    session: _Session | None = None
    try:
        try:
            try:
                session = _open_with_retries(options, signals)
            finally:
                signals.opening = False  # a signal now is the session's, or is ignored
        except _Stopped as exc:
            return stopped_before_start(exc.signum, out)
        out.event("opened", pid=session.pid)
        return _stream(session, signals, out, stdin_open)
    except ExecFailure as exc:
        return exc.said(out)
    except (ConnectionLost, RemoteProtocolError) as exc:
        return connection_ended(exc, out, opened=session is not None)
    finally:
        signals.close()
        if session is not None:
            session.close()

