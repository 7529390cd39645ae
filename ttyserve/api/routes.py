"""The HTTP API (protocol section 13): each request served through a protocol-v1 connection
of the server's own (peer `http:ADDR`), with the client library, so that authentication,
limits, the journal and sessions on other workers follow the framed protocol's rules and
nothing here decides them again. This module maps requests to those calls and errors to
statuses."""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import msgspec

from ..client.api import connect_over
from ..client.connection import Connection
from ..client.session import Session
from ..defaults import CLIENT_NAME, DEFAULT_STDIN_WINDOW, HTTP_MAX_JSON_BODY, HTTP_MAX_WAIT
from ..errors import (
    ConnectionLost,
    ErrorCode,
    RequestError,
    SessionCancelled,
    SessionDetached,
    TtyserveError,
)
from ..ids import GRANT_PATTERN
from ..protocol.messages import (
    INPUT,
    OBSERVER,
    PROTOCOL_VERSION,
    STREAM,
    Hello,
    Offsets,
    SessionInfo,
    members,
)
from ..web.exchange import API_PREFIX, Exchange, TooLarge
from .openapi import openapi_document
from .output import StreamReader, stream_output
from .types import (
    Created,
    CreateSession,
    ErrorBody,
    ErrorDetail,
    ExitStatus,
    ResizeBody,
    SessionList,
    SessionStatus,
    SignalBody,
    TargetList,
    entry,
)

log = logging.getLogger("ttyserve")

# Section 13's statuses by section 6's codes; any other code is a 400.
STATUS: dict[str, int] = {
    ErrorCode.BAD_REQUEST: 400, ErrorCode.UNAUTHORIZED: 401, ErrorCode.FORBIDDEN: 403,
    ErrorCode.READ_ONLY: 403, ErrorCode.NO_SUCH_SESSION: 404, ErrorCode.SESSION_IN_USE: 409,
    ErrorCode.SPAWN_FAILED: 422, ErrorCode.BUSY: 429, ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.SERVER_RESTARTING: 503, ErrorCode.NO_SUCH_TARGET: 404,
    ErrorCode.TARGET_UNREACHABLE: 503}  # (422 when not retriable: section 15)
HANDBACK_WAIT = 300.0  # seconds an output stream waits for its writer role back
CANCEL_WAIT = 5.0  # seconds a DELETE waits for its session's end
_SESSION = re.compile(r"sessions/([^/]+)(/(output|stdin|eof|signal|resize))?")
JSON = "application/json"


class ApiError(Exception):
    """A request answered with an error object."""

    def __init__(self, status: int, code: str, message: str, *, retriable: bool = False,
                 errno: int | None = None, headers: list[tuple[str, str]] | None = None,
                 ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.retriable, self.errno, self.headers = retriable, errno, headers or []

    @classmethod
    def of(cls, error: RequestError) -> ApiError:
        retry = ([("Retry-After", str(max(1, math.ceil(error.retry_after_ms / 1000))))]
                 if error.retry_after_ms is not None else [])
        status = STATUS.get(str(error.code), 400)
        if error.code == ErrorCode.TARGET_UNREACHABLE and not error.retriable:
            status = 422  # its carrier failed in a way no wait mends (not_installed, config)
        return cls(status, str(error.code), error.message, retriable=error.retriable,
                   errno=error.errno, headers=retry)


def bad_request(message: str, status: int = 400) -> ApiError:
    return ApiError(status, ErrorCode.BAD_REQUEST, message)


class HttpApi:
    """Answers every request under /api/v1/ (the front door hands them here)."""

    async def answer(self, exchange: Exchange) -> None:
        try:
            if exchange.foreign is not None:
                raise ApiError(403, ErrorCode.FORBIDDEN, exchange.foreign)
            try:
                await self._route(exchange)
            except ExceptionGroup as group:  # (from a task group: what ended it)
                raise _first(group) from None
        except ApiError as error:
            await _error(exchange, error)
        except TooLarge as exc:
            await _error(exchange, bad_request(str(exc), 413))
        except RequestError as exc:
            await _error(exchange, ApiError.of(exc))
        except ConnectionLost as exc:  # (server_restarting, for one: its cause)
            await _error(exchange, ApiError.of(exc.__cause__) if isinstance(
                exc.__cause__, RequestError) else ApiError(
                    503, ErrorCode.SHUTTING_DOWN, f"the server ended the request: {exc}",
                    retriable=True, headers=[("Retry-After", "1")]))
        except (SessionDetached, SessionCancelled) as exc:  # a stream whose session was
            log.info("HTTP %s: %s", exchange.path, exc)  # taken or cancelled: it ends there
        except TtyserveError as exc:
            await _error(exchange, bad_request(str(exc)))

    async def _route(self, exchange: Exchange) -> None:
        path, method = exchange.path.removeprefix(API_PREFIX), exchange.method
        if path == "openapi.json":
            _allow(method, "GET")
            await exchange.answer(200, openapi_document())
            return
        if path == "sessions":
            _allow(method, "GET", "POST")
            await (self._create(exchange) if method == "POST" else self._list(exchange))
            return
        if path == "targets":
            _allow(method, "GET")
            await self._targets(exchange)
            return
        if (match := _SESSION.fullmatch(path)) is None:
            raise bad_request(f"nothing here at {exchange.path!r} (see {API_PREFIX}"
                              "openapi.json)", 404)
        session_id, action = match.group(1), match.group(3)
        handler = _ACTIONS.get(action)
        if handler is None:  # the session itself
            _allow(method, "GET", "DELETE")
            await (self._status(exchange, session_id) if method == "GET"
                   else self._cancel(exchange, session_id))
            return
        _allow(method, "GET" if action == "output" else "POST")
        await handler(self, exchange, session_id)

    # --- the requests ------------------------------------------------------------------

    async def _create(self, exchange: Exchange) -> None:
        request = _decode(await exchange.body(HTTP_MAX_JSON_BODY), CreateSession)
        key = exchange.header("idempotency-key")
        async with connection(exchange) as conn:
            if key is not None and (known := await _keyed(conn, key)) is not None:
                return await _created(exchange, 200, known)
            try:
                session = await conn.spawn(
                    request.argv, pty=request.pty, rows=request.rows, cols=request.cols,
                    term=request.term, env=request.env, cwd=request.cwd, detachable=True,
                    detached_timeout=request.detached_timeout, idempotency_key=key,
                    target=request.target)
            except RequestError as exc:  # the same key, started meanwhile on this worker
                if (exc.code != ErrorCode.SESSION_IN_USE or key is None
                        or (known := await _keyed(conn, key)) is None):
                    raise
                return await _created(exchange, 200, known)
            if request.stdin is not None:
                await session.send(request.stdin.encode())
                await session.eof()
            await _leave(session)
        assert session.id is not None and session.pid is not None
        await _created(exchange, 201, Created(session=session.id, pid=session.pid,
                                              pty=bool(session.pty)))

    async def _list(self, exchange: Exchange) -> None:
        async with connection(exchange) as conn:
            sessions = await conn.list_sessions()
        await exchange.answer(200, msgspec.json.encode(SessionList(
            sessions=[entry(info) for info in sessions])), JSON)

    async def _targets(self, exchange: Exchange) -> None:
        """`GET /api/v1/targets`: as the `targets` message (section 15)."""
        async with connection(exchange) as conn:
            targets = await conn.list_targets()
        await exchange.answer(200, msgspec.json.encode(TargetList(targets=targets)), JSON)

    async def _status(self, exchange: Exchange, session_id: str) -> None:
        wait = _seconds(exchange.query.get("wait"))
        async with connection(exchange) as conn:
            info = await _info(conn, session_id)
            if wait and info.exit is None:
                watching = None
                with anyio.move_on_after(wait):
                    watching = await conn.attach(session_id, offsets=info.offsets,
                                                 role=OBSERVER)
                    with contextlib.suppress(SessionDetached):
                        await watching.wait()
                try:
                    info = await _info(conn, session_id)
                except ApiError:  # ended and forgotten at once (its detached timeout was
                    if watching is None or watching.status is None:  # over): as seen
                        raise
                    info.exit = members(watching.status)
        await exchange.answer(200, msgspec.json.encode(SessionStatus(
            session=info.session, argv=info.argv, pid=info.pid, pty=info.pty,
            started=info.started, attached=info.attached, observers=info.observers,
            offsets=info.offsets or Offsets(),
            exit=None if info.exit is None else msgspec.convert(info.exit, ExitStatus))), JSON)

    async def _cancel(self, exchange: Exchange, session_id: str) -> None:
        """Cancel it (section 4), whoever is attached. The answer comes once the session has
        ended (its exit, which an observer of it is told once its tree is killed and
        reaped) and been released: `list` no longer has it."""
        async def cancel(conn: Connection, session: Session) -> None:
            watching: Session | None = None
            with contextlib.suppress(RequestError):  # (no_such_session: it had ended, and
                watching = await conn.attach(  # this request read its exit and released it)
                    session_id, role=OBSERVER, offsets=session.began)
            await session.cancel()
            if watching is not None:
                with anyio.move_on_after(CANCEL_WAIT), contextlib.suppress(TtyserveError):
                    await watching.wait()
            await conn.release(session_id)
            with contextlib.suppress(RequestError):  # (answered after the release: a
                await conn.list_sessions()  # grant, which may not list, is answered now)

        await self._write(exchange, session_id, cancel, leave=False)

    async def _output(self, exchange: Exchange, session_id: str) -> None:
        offsets = _offsets(exchange)
        hello = _hello(exchange)
        reader = StreamReader()
        modes = exchange.query.get("modes") == "true"  # section 14: `modes` objects too
        async with connection(exchange, hello, reader=reader) as conn:
            try:  # the first stream is the session's attachment; the others observe
                session = await conn.attach(session_id, offsets=offsets, role=STREAM,
                                            modes=modes)
            except RequestError as exc:
                if exc.code not in (ErrorCode.SESSION_IN_USE, ErrorCode.FORBIDDEN):
                    raise  # (forbidden: an observer grant may only watch)
                session = await conn.attach(session_id, offsets=offsets, role=OBSERVER,
                                            modes=modes)

            async def again(held: Offsets) -> Session:
                """The writer role back, once the client that stole it (the CLI, the page, a
                DELETE) let go: the server answers the attach then (`wait`)."""
                return await conn.attach(session_id, offsets=held, role=STREAM,
                                         wait=HANDBACK_WAIT, modes=modes)

            await stream_output(exchange, conn, session, reader, again)

    async def _stdin(self, exchange: Exchange, session_id: str) -> None:
        async def feed(_: Connection, session: Session) -> None:
            async for piece in exchange.body_pieces():  # paced by the session's window
                await session.send(piece)

        await self._write(exchange, session_id, feed)

    async def _eof(self, exchange: Exchange, session_id: str) -> None:
        await exchange.body(0)
        await self._write(exchange, session_id, lambda _, session: session.eof())

    async def _signal(self, exchange: Exchange, session_id: str) -> None:
        body = _decode(await exchange.body(HTTP_MAX_JSON_BODY), SignalBody)
        await self._write(exchange, session_id,
                          lambda _, session: session.signal(body.name))

    async def _resize(self, exchange: Exchange, session_id: str) -> None:
        body = _decode(await exchange.body(HTTP_MAX_JSON_BODY), ResizeBody)
        await self._write(exchange, session_id,
                          lambda _, session: session.resize(body.rows, body.cols))

    async def _write(self, exchange: Exchange, session_id: str,
                     act: Callable[[Connection, Session], Awaitable[None]],
                     leave: bool = True) -> None:
        """What only the writer may do, attached for this request's input (`input`: beside
        an HTTP output stream, never in its place; session_in_use while a client of the
        framed protocol is the writer), or, not to ``leave`` it (DELETE), as its writer,
        taking it from whoever holds it; then 204."""
        hello = _hello(exchange)
        async with connection(exchange, hello, release=not leave) as conn:
            offsets = None if hello.grant is not None else (  # (a grant may not list: its
                await _info(conn, session_id)).offsets  # ring's oldest byte, read and dropped)
            session = await (conn.attach(session_id, offsets=offsets, role=INPUT) if leave
                             else conn.attach(session_id, offsets=offsets, steal=True))
            async with anyio.create_task_group() as tg:
                tg.start_soon(_drain, session)  # (else what it is sent, unread, holds it up)
                await act(conn, session)
                if leave:
                    await session.detach()  # the drain ends at `detached` (or the exit)
        await exchange.answer(204)


_ACTIONS: dict[str | None, Callable[[HttpApi, Exchange, str], Awaitable[None]]] = {
    "output": HttpApi._output, "stdin": HttpApi._stdin, "eof": HttpApi._eof,
    "signal": HttpApi._signal, "resize": HttpApi._resize}


@contextlib.asynccontextmanager
async def connection(exchange: Exchange, hello: Hello | None = None, release: bool = False,
                     reader: StreamReader | None = None) -> AsyncIterator[Connection]:
    """A multiplexed, windowed connection to this server with the request's credentials;
    exits it reads are kept --keep-ended (a coordinator may ask for them again) unless
    ``release``; with ``reader``, its channels' output goes there, not to the library."""
    hello = hello or _hello(exchange)
    transport = await exchange.inner(reader)
    try:
        async with connect_over(transport, hello, release=release) as conn:
            yield conn
    finally:
        await transport.aclose()


def _hello(exchange: Exchange) -> Hello:
    """`Authorization: Bearer TOKEN` or `Bearer GRANT` as the `hello`'s token or grant."""
    credential = None
    if (authorization := exchange.header("authorization")) is not None:
        scheme, _, credential = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            raise ApiError(401, ErrorCode.UNAUTHORIZED,
                           "Authorization must be 'Bearer TOKEN' or 'Bearer GRANT'")
        credential = credential.strip()
    grant = credential is not None and GRANT_PATTERN.fullmatch(credential) is not None
    return Hello(protocol=PROTOCOL_VERSION, client=f"http {CLIENT_NAME}", multiplex=True,
                 window=DEFAULT_STDIN_WINDOW, token=None if grant else credential,
                 grant=credential if grant else None)


async def _keyed(conn: Connection, key: str) -> Created | None:
    """The principal's known session started with Idempotency-Key ``key``, if any (from
    every worker)."""
    for info in await conn.list_sessions():
        if info.idempotency_key == key:
            return Created(session=info.session, pid=info.pid, pty=info.pty)
    return None


async def _created(exchange: Exchange, status: int, body: Created) -> None:
    await exchange.answer(status, msgspec.json.encode(body), JSON,
                          [("Location", f"{API_PREFIX}sessions/{body.session}")])


async def _info(conn: Connection, session_id: str) -> SessionInfo:
    for info in await conn.list_sessions():
        if info.session == session_id:
            return info
    raise ApiError(404, ErrorCode.NO_SUCH_SESSION,
                   f"no session {session_id!r}: unknown, ended and collected, or not yours")


async def _leave(session: Session) -> None:
    """Detach, and read until the server says so (or the exit came first), so that nothing
    this request sent is lost and the session is left detached for the next client."""
    await session.detach()
    await _drain(session)


async def _drain(session: Session) -> None:
    """Read and drop ``session``'s output (its ring keeps it for the output streams) until
    its channel ends."""
    with contextlib.suppress(SessionDetached, SessionCancelled, ConnectionLost):
        while await session.receive() is not None:
            continue


def _first(group: ExceptionGroup[Exception]) -> Exception:
    """The first exception a task group ended with, out of its (nested) groups."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, ExceptionGroup) else first


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise ApiError(405, ErrorCode.BAD_REQUEST,
                       f"{method} is not answered here; {', '.join(allowed)} is",
                       headers=[("Allow", ", ".join(allowed))])


def _decode(body: bytes, kind: type[msgspec.Struct]) -> Any:
    """A request body as ``kind`` (types made by msgspec.defstruct: typed as Any here)."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.DecodeError as exc:
        raise bad_request(f"the body is not a valid {kind.__name__}: {exc}") from None


def _seconds(value: str | None) -> float:
    """`wait`: seconds, at most HTTP_MAX_WAIT."""
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        raise bad_request(f"wait={value!r} is not a number of seconds") from None
    if not 0 <= seconds <= HTTP_MAX_WAIT:
        raise bad_request(f"wait={value!r} is outside 0 to {HTTP_MAX_WAIT} seconds")
    return seconds


def _offsets(exchange: Exchange) -> Offsets | None:
    """Where an output stream begins: `?stdout=N&stderr=M`, or `Last-Event-ID: N,M`; None
    (the ring's oldest byte) when neither is given."""
    query = exchange.query
    if "stdout" in query or "stderr" in query:
        values = [query.get("stdout", "0"), query.get("stderr", "0")]
    elif (last := exchange.header("last-event-id")) is not None:
        values = last.split(",")
        if len(values) != 2:
            raise bad_request(f"Last-Event-ID {last!r} is not STDOUT,STDERR")
    else:
        return None
    if not all(value.strip().isascii() and value.strip().isdigit() for value in values):
        raise bad_request(f"offsets {values!r} are not whole numbers of bytes")
    return Offsets(stdout=int(values[0]), stderr=int(values[1]))


async def _error(exchange: Exchange, error: ApiError) -> None:
    log.info("HTTP %s %s from %s: %d %s: %s", exchange.method, exchange.path,
             exchange.peer_host, error.status, error.code, error.message)
    body = ErrorBody(error=ErrorDetail(code=error.code, message=error.message,
                                       retriable=error.retriable, errno=error.errno))
    with contextlib.suppress(Exception):  # an answer already begun cannot be an error
        await exchange.answer(error.status, msgspec.json.encode(body), JSON, error.headers)
