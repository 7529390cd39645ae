"""`ttyserve exec` and `ttyserve attach`: one remote session as if it ran here.

Output goes to our stdout and stderr byte for byte, the exit code follows
the contract's table, signals sent to us are forwarded, and a local terminal
in raw mode is restored on every way out. A detachable session (`exec
--detachable`, and any `attach`) can be left running with the detach key.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import ssl
import stat
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.abc

from ..client.api import connect
from ..client.connection import Connection
from ..client.retry import RETRIED
from ..client.session import Lost, ResumeEvent, Session
from ..credentials import tls_context
from ..defaults import GOODBYE_WAIT, STDIN_READ, TERM_GRACE
from ..errors import (
    ConfigError,
    ConnectionLost,
    ErrorCode,
    RemoteProtocolError,
    RequestError,
    SessionDetached,
    TargetFailure,
)
from ..exitcodes import ExecExit, exec_exit_code
from ..protocol.messages import (
    DEFAULT_TERM,
    EXPIRED,
    OBSERVER,
    REVOKED,
    STOLEN,
    WRITER,
    members,
)
from ..protocol.terminal_modes import TerminalModes
from . import terminal
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
    tell,
    terminated,
)
from .terminal import DetachKey

DETACH_PAUSE = 1.0  # seconds after which the start of the detach key, typed alone, goes on
CTRL_C = b"\x03"  # typed by an observer at a raw terminal: it leaves (nothing is sent)
_ENDED_HERE = {STOLEN: "another client took the session over",
               REVOKED: "the grant was revoked", EXPIRED: "the grant has expired"}


class DetachedHere(Exception):
    """The session goes on without us: a detach key, or another client took it over."""

    def __init__(self, session_id: str, reason: str | None, role: str = WRITER) -> None:
        super().__init__(reason)
        self.session_id = session_id
        self.reason = reason
        self.role = role


@contextlib.asynccontextmanager
async def _open_session(options: ExecOptions, pty: bool, size: tuple[int, int],
                        out: Output) -> AsyncIterator[Session]:
    """Connect and open, retrying only what is retriable and only before `opened`."""
    tls: ssl.SSLContext | None = None
    if options.address.encrypted:
        try:
            tls = tls_context("client", cafile=options.tls_ca)
        except ConfigError as exc:  # a bad CA file: no retry can help
            raise ExecFailure(ExecExit.FAILURE, str(exc)) from exc
    carrier_stderr = None
    if options.address.carried:
        from ..backends.carrier import show_on_stderr  # subprocess only for carriers

        carrier_stderr = show_on_stderr(options.target)
    for attempt in range(options.retries + 1):
        async with contextlib.AsyncExitStack() as stack:
            try:
                conn = await stack.enter_async_context(connect(
                    options.address, token=options.token, tls=tls,
                    remote_command=options.remote_command,
                    carrier_stderr=carrier_stderr, multiplex=options.multiplex,
                    heartbeat=options.heartbeat, on_resume=_resume_reporter(options, out),
                    persist=options.multiplex, grant=options.grant))
                if options.attach is not None:
                    session = await _attach(conn, options, size)
                else:
                    session = await conn.spawn(
                        options.argv, pty=pty, rows=size[0], cols=size[1],
                        term=os.environ.get("TERM", DEFAULT_TERM) if pty else DEFAULT_TERM,
                        env=options.env, cwd=options.cwd, detachable=options.detachable,
                        resume=options.resume, target=options.on_target)
            except RETRIED as exc:
                delay = retry_delay(exc, options, attempt)
                await stack.aclose()
                await anyio.sleep(delay)  # a signal to stop ends it (_stop_while_opening)
                continue
            if session.id is not None:
                out.event("opened", pid=session.pid, session=session.id)
                if session.role != OBSERVER:  # (an observer is told how to come back as it leaves)
                    tell(f"session {session.id} (reattach: ttyserve attach {session.id})")
            else:
                out.event("opened", pid=session.pid)
            yield session
            return


async def _attach(conn: Connection, options: ExecOptions, size: tuple[int, int]) -> Session:
    """`attach`: as writer, or as observer (--observe); with a grant, in the grant's role (an
    observer grant refuses a writer's attach with forbidden: it is asked again, to watch)."""
    assert options.attach is not None
    role = OBSERVER if options.observe else WRITER
    try:
        return await conn.attach(options.attach, steal=options.steal, rows=size[0],
                                 cols=size[1], resume=options.resume, role=role)
    except RequestError as exc:
        grant = conn.welcome.grant if conn.welcome is not None else None
        if (exc.code != ErrorCode.FORBIDDEN or role == OBSERVER or grant is None
                or grant.role != OBSERVER):
            raise
    return await conn.attach(options.attach, resume=options.resume, role=OBSERVER)


def _resume_reporter(options: ExecOptions, out: Output) -> Callable[[ResumeEvent], None]:
    """The contract's lines (and `--json` events) for a lost connection and its resume."""

    def report(event: ResumeEvent) -> None:
        if isinstance(event, Lost):
            tell(f"{options.target}: connection lost ({event.reason}); resuming")
            out.event("lost", reason=event.reason)
        else:
            lost = f", {event.lost_bytes} bytes lost" if event.lost_bytes else ""
            tell(f"{options.target}: resumed after {event.after:.1f} s{lost}")
            out.event("resumed", lost_bytes=event.lost_bytes)

    return report


async def _stop_while_opening(signals: AsyncIterator[int], watching: anyio.CancelScope,
                              opening: anyio.CancelScope, stopped: list[int]) -> None:
    """Until the session is open: a signal to stop (not SIGWINCH) ends the connecting, the
    opening and any wait to retry at once, instead of reaching the command once it starts."""
    with watching:
        async for signum in signals:
            if signum in FORWARDED:
                stopped.append(signum)
                opening.cancel()
                return


async def _quietly(work: Awaitable[None]) -> None:
    """Run a helper pump; a lost connection is reported by the output loop, not here."""
    try:
        await work
    except (ConnectionLost, RemoteProtocolError):
        pass


async def _pump_stdin(session: Session, raw: bool, detach: DetachKey | None,
                      detachable: bool) -> None:
    """Local stdin to the session; its end becomes `eof` (a stdin that is not a terminal in
    raw mode: there Ctrl-D is a byte like any other). With ``detach``, typing its sequence
    detaches the session instead. A terminal that went away (EIO, or the end of a terminal
    in raw mode) detaches a ``detachable`` session, typing nothing into it (contracts.md). An
    observer's keys go nowhere: only the detach key (and Ctrl-C, at a terminal) are looked
    for, to leave."""
    if session.role == OBSERVER:
        await _watch_stdin(session, detach)
        return
    try:
        pollable = not stat.S_ISREG(os.fstat(0).st_mode)
    except OSError:
        return  # no stdin at all
    at_terminal = os.isatty(0)
    while True:
        if pollable:
            try:
                with anyio.move_on_after(DETACH_PAUSE if detach and detach.holding else
                                         math.inf) as pause:
                    await anyio.wait_readable(0)
            except OSError:
                pollable = False  # e.g. /dev/null: epoll refuses it, and reads never block
            else:
                if pause.cancelled_caught and detach is not None:
                    await session.send(detach.release())  # the start of the key, typed alone
                    continue
        try:
            data = os.read(0, STDIN_READ)
        except BlockingIOError:
            continue  # a non-blocking stdin we share with someone else: wait again
        except OSError as exc:
            if detachable:
                await session.detach()  # our terminal went away: the session goes on
                return
            say(f"cannot read stdin ({exc.strerror}): sending end-of-input")
            data = b""
        if not data and detachable and (raw or (at_terminal and not os.isatty(0))):
            await session.detach()  # a hang-up, not a Ctrl-D typed at the terminal
            return
        if await _send_stdin(session, data, raw, detach):
            return


async def _send_stdin(session: Session, data: bytes, raw: bool,
                      detach: DetachKey | None) -> bool:
    """One read of stdin to the session, or its end (empty) as `eof`; True once the pump is
    done: at that end, or when ``detach`` saw its sequence (the session is detached)."""
    if not data:
        if detach is not None and detach.holding:
            await session.send(detach.release())
        if not raw:
            await session.eof()
        return True
    if detach is not None:
        data, detaching = detach.feed(data)
        if data:
            await session.send(data)
        if detaching:
            await session.detach()
        return detaching
    await session.send(data)
    return False


async def _watch_stdin(session: Session, detach: DetachKey | None) -> None:
    """An observer's stdin at a raw terminal: typed keys are dropped here (the server would
    discard them anyway); the detach key or Ctrl-C leaves."""
    if not os.isatty(0):
        return  # not at a terminal: there is nothing to read for
    while True:
        await anyio.wait_readable(0)
        try:
            data = os.read(0, STDIN_READ)
        except BlockingIOError:
            continue
        except OSError:
            return
        if not data:
            return
        detaching = detach is not None and detach.feed(data)[1]
        if detaching or CTRL_C in data:
            await session.detach()
            return


async def _stream(session: Session, out: Output, pty: bool, raw: bool,
                  signals: AsyncIterator[int], detach: DetachKey | None = None,
                  detach_on_hangup: bool = False) -> int:
    aborts: list[ExecFailure] = []  # why the session is cancelled: a second SIGINT, output closed
    modes = TerminalModes() if raw else None  # what the session set our terminal to
    prologue: str | None = None

    def restore_modes() -> None:
        """A PTY attached afresh, or resumed with output lost: the modes it had set first
        (the server then has the program redraw)."""
        nonlocal prologue
        if modes is not None and session.prologue is not prologue:
            prologue = session.prologue
            if prologue:
                out.data("stdout", prologue.encode())
                modes.feed(prologue.encode())

    restore_modes()
    lost: ConnectionLost | RemoteProtocolError | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_quietly, _forward_signals(session, signals, tg, pty, raw,
                                                 detach_on_hangup, aborts))
        tg.start_soon(_quietly, _pump_stdin(session, raw, detach, detach_on_hangup))
        detached: SessionDetached | None = None
        terminal_gone = False
        try:
            async for chunk in session:
                if terminal_gone:
                    continue  # (what came before the server's `detached`: nobody to show)
                try:
                    out.data(chunk.stream, chunk.data)
                except OSError:
                    if not detach_on_hangup:
                        aborts.append(output_closed())
                        break
                    terminal_gone = True  # our output went away (EIO): the session goes on
                    tg.start_soon(_quietly, session.detach())
                    continue
                if modes is not None:
                    modes.feed(chunk.data)
                    restore_modes()
        except (ConnectionLost, RemoteProtocolError) as exc:
            lost = exc
        except SessionDetached as exc:
            detached = exc
        tg.cancel_scope.cancel()
    if modes is not None and (epilogue := modes.epilogue()):
        with contextlib.suppress(OSError):  # our terminal back to its own modes
            out.data("stdout", epilogue.encode())
    if detached is not None:
        assert session.id is not None
        out.event("detached", session=session.id, **(
            {"reason": detached.reason} if detached.reason else {}))
        raise DetachedHere(session.id, detached.reason, session.role)
    if lost is not None:
        raise lost
    if aborts:
        with anyio.move_on_after(GOODBYE_WAIT):  # (a resume under way may never come back)
            await session.cancel()
        raise aborts[-1]
    assert session.status is not None
    out.event("exit", **members(session.status))
    return exec_exit_code(session.status)


async def _forward_signals(session: Session, signals: AsyncIterator[int],
                           tg: anyio.abc.TaskGroup, pty: bool, raw: bool,
                           detach_on_hangup: bool, aborts: list[ExecFailure]) -> None:
    """Each signal is told in a task of its own: one that waits (for a resume, say) never
    keeps the next from being seen, a second SIGINT above all (added to ``aborts``). A
    SIGTERM forwarded is given TERM_GRACE seconds; then, or at a second one, the session is
    cancelled."""
    interrupted = terminating = False

    async def cancel_after_grace() -> None:
        await anyio.sleep(TERM_GRACE)
        aborts.append(terminated())
        tg.cancel_scope.cancel()

    async for signum in signals:
        if session.role == OBSERVER:  # it changes nothing there: a signal to stop leaves
            if signum != signal.SIGWINCH:
                tg.start_soon(_quietly, session.detach())
            continue
        if signum == signal.SIGWINCH:
            if pty:
                tg.start_soon(_quietly, session.resize(*terminal.window_size(0 if raw else 1)))
        elif signum == signal.SIGINT and interrupted:
            aborts.append(second_interrupt())
            tg.cancel_scope.cancel()
        elif signum == signal.SIGTERM and terminating:
            aborts.append(terminated())
            tg.cancel_scope.cancel()
        elif signum == signal.SIGHUP and detach_on_hangup:
            tg.start_soon(_quietly, session.detach())  # our terminal went away
        else:
            interrupted = interrupted or signum == signal.SIGINT
            if signum == signal.SIGTERM:
                terminating = True
                tg.start_soon(cancel_after_grace)
            tg.start_soon(_quietly, session.signal(FORWARDED[signal.Signals(signum)]))


async def _exec(options: ExecOptions) -> int:
    out = Output(options.json)
    with anyio.open_signal_receiver(*FORWARDED, signal.SIGWINCH) as signals:
        stopped: list[int] = []
        watching = anyio.CancelScope()
        code: int | None = None
        async with anyio.create_task_group() as opening:
            opening.start_soon(_stop_while_opening, signals, watching, opening.cancel_scope,
                               stopped)
            code = await _exec_session(options, out, signals, watching)
            watching.cancel()
    if code is not None:
        return code
    return stopped_before_start(stopped[0], out)


async def _exec_session(options: ExecOptions, out: Output, signals: AsyncIterator[int],
                        watching: anyio.CancelScope) -> int:
    """Open the session and stream it to its end; ``watching`` is cancelled once it is open,
    so that from then on signals are the session's (forwarded)."""
    stdin_tty = os.isatty(0)
    pty = options.pty if options.pty is not None else stdin_tty
    size = terminal.window_size(0 if stdin_tty else 1)
    session_id = options.attach
    opened = False
    try:
        async with _open_session(options, pty, size, out) as session:
            watching.cancel()
            opened = True
            session_id = session.id
            pty = session.pty if session.pty is not None else pty
            raw = pty and stdin_tty and not options.json
            detach = (DetachKey(options.detach_key) if raw and session.id is not None
                      and options.detach_key else None)
            with terminal.raw_mode(0) if raw else contextlib.nullcontext():
                return await _stream(session, out, pty, raw, signals, detach,
                                     options.detachable or options.attach is not None)
    except DetachedHere as exc:  # told once the terminal is back to normal
        if exc.reason in _ENDED_HERE:
            say(_ENDED_HERE[exc.reason])
        if exc.role != OBSERVER:
            tell(f"session {exc.session_id} (reattach: ttyserve attach {exc.session_id})")
        elif options.grant is None and exc.reason is None:
            tell(f"session {exc.session_id} (watch again: ttyserve attach --observe "
                 f"{exc.session_id})")
        return ExecExit.DETACHED
    except ExecFailure as exc:
        return exc.said(out)
    except (ConnectionLost, RemoteProtocolError) as exc:
        if opened and options.resume is not None:  # it could not come back in time
            tell(f"{options.target}: lost: {exc}")
            out.event("error", **{"class": TargetFailure.LOST, "retriable": False,
                                  "message": f"lost: {exc}"})
            return ExecExit.FAILURE
        return connection_ended(exc, out, opened, session_id)
    raise AssertionError("unreachable")


def exec_main(options: ExecOptions) -> int:
    return anyio.run(_exec, options)
