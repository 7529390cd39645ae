"""The client library's entry points: `connect` (a connection, its reader beside the block)
and `run` (one command to completion, in the spirit of `subprocess.run`).

    async with connect("unix:/run/user/1000/ttyserve.sock") as conn:
        session = await conn.spawn(["make", "test"], pty=False)
        async for chunk in session:
            print(chunk.stream, chunk.data)
        print(session.status.code)
"""

from __future__ import annotations

import contextlib
import math
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from ..addresses import Address, default_address, parse_address
from ..credentials import tls_context
from ..defaults import CLIENT_NAME, DEFAULT_REMOTE_COMMAND
from ..errors import ConnectionLost
from ..protocol.messages import PROTOCOL_VERSION, Exit, Hello
from ..transport.background import beside
from ..transport.streams import Transport, send_all
from .connection import Connection
from .dial import open_transport
from .session import ResumeEvent

if TYPE_CHECKING:
    from ..backends.carrier import Carrier, StderrLine


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
    heartbeat: int | None = None,
    on_resume: Callable[[ResumeEvent], None] | None = None,
    persist: bool = False,
    grant: str | None = None,
) -> AsyncIterator[Connection]:
    """Connect and say `hello`; `open` may follow at once (pipelined).

    A ``grant`` (made by `Connection.share`, section 11) stands for the token: the
    connection may then attach that one session, in at most the grant's role
    (`connection.welcome.grant` says which), and nothing else.

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

    ``heartbeat`` (seconds, section 10): each side sends something at least that often,
    and gives the other up after three times that of silence. Sessions spawned or
    attached with ``resume`` survive a lost connection: it is dialled again, and
    ``on_resume`` hears each loss and each return. Through a carrier they need
    ``persist``: the far side runs `serve --stdio --persist`, which relays to the user's
    own server there (started when none answers), so the session outlives the carrier.

    ``tls`` verifies a `tls:` server (default: the system's CAs). Raises OSError
    (ssl.SSLError for a server that cannot be verified) when the server cannot
    be reached.
    """
    addr = address if isinstance(address, Address) else (
        parse_address(address) if address else default_address())
    context = tls or (client_tls_context() if addr.encrypted else None)
    show_stderr = carrier_stderr
    if addr.carried:
        token = None  # a far side takes none: never hand a secret to every host we reach
        if show_stderr is None:
            from ..backends.carrier import show_on_stderr  # subprocess only for carriers

            show_stderr = show_on_stderr(str(addr))

    async def dial(stack: contextlib.AsyncExitStack,
                   within: float = math.inf) -> tuple[Transport, Carrier | None]:
        if addr.carried:
            from ..backends.carrier import run_carrier

            assert show_stderr is not None
            carrier = await stack.enter_async_context(
                run_carrier(addr, show_stderr, remote_command, persist))
            return carrier.transport, carrier
        with anyio.fail_after(within):  # (TimeoutError is an OSError: a retriable failure)
            transport = await open_transport(addr, context)
        stack.push_async_callback(transport.aclose)
        return transport, None

    hello = Hello(protocol=PROTOCOL_VERSION, token=None if grant else token,
                  client=client_name, multiplex=multiplex, window=window, heartbeat=heartbeat,
                  grant=grant)
    async with contextlib.AsyncExitStack() as stack:
        transport, carrier = await dial(stack)
        connection = Connection(transport, hello, carrier, redial=dial, on_resume=on_resume)
        try:
            await send_all(transport, connection.greeting())
        except anyio.BrokenResourceError as exc:
            if carrier is not None:
                raise await carrier.failure() from exc
            raise ConnectionResetError(f"the server closed the connection: {exc}") from exc
        async with beside() as tasks:
            connection.start(tasks)
            yield connection


@contextlib.asynccontextmanager
async def connect_over(transport: Transport, hello: Hello, *, release: bool = True,
                       ) -> AsyncIterator[Connection]:
    """`connect` over a transport the caller opened (and closes): no dialling again.
    ``release``: as `Connection` takes it."""
    connection = Connection(transport, hello, release=release)
    try:
        await send_all(transport, connection.greeting())
    except anyio.BrokenResourceError as exc:
        raise ConnectionResetError(f"the server closed the connection: {exc}") from exc
    async with beside() as tasks:
        connection.start(tasks)
        yield connection


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

        async with beside() as tasks:
            tasks.start_soon(feed)
            async for chunk in session:
                (stderr if chunk.stream == "stderr" else stdout).append(chunk.data)
        assert session.status is not None
        return CompletedSession(list(argv), session.status, b"".join(stdout), b"".join(stderr))
