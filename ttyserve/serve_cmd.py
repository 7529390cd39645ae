"""`ttyserve serve`: bind, print `listening ADDR`, serve, shut down on signals."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
from dataclasses import dataclass

import anyio

from .addresses import Address
from .backends.spawn import spawn_supported
from .exitcodes import ServeExit
from .handler import ServerSettings
from .listeners import LeaseError, ListenError, open_listeners, remove_socket_file
from .server import DEFAULT_SHUTDOWN_TIMEOUT, Server, login_shell
from .session import DEFAULT_LINGER

log = logging.getLogger("ttyserve")


@dataclass(frozen=True)
class ServeOptions:
    addresses: list[Address]
    command: str | None = None
    linger: float = DEFAULT_LINGER
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT


def pty_supported() -> bool:
    """Whether this platform can allocate a PTY and spawn into it."""
    if not spawn_supported():
        return False
    try:
        master, slave = os.openpty()
    except OSError:
        return False
    os.close(master)
    os.close(slave)
    return True


def _announce(address: Address) -> None:
    sys.stdout.write(f"listening {address}\n")
    sys.stdout.flush()


async def _serve(options: ServeOptions) -> int:
    settings = ServerSettings(
        default_argv=shlex.split(options.command) if options.command else login_shell(),
        linger=options.linger,
    )
    server = Server(settings, shutdown_timeout=options.shutdown_timeout)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            listeners = open_listeners(options.addresses)
        except ListenError as exc:
            log.error("%s", exc)
            return ServeExit.CONFIG
        except LeaseError as exc:
            log.error("%s", exc)
            return ServeExit.LEASE

        async def watch_signals() -> None:
            async for signum in signals:
                if not server.state.shutting_down and not server._stop.is_set():
                    log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                    server.shutdown()
                else:
                    log.warning("%s again: forcing shutdown", signal.Signals(signum).name)
                    server.force()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_signals)
                drained = await server.serve(listeners, _announce)
                tg.cancel_scope.cancel()
        finally:
            for address, _ in listeners:
                remove_socket_file(address)
    return ServeExit.OK if drained else ServeExit.ERROR


def serve_main(options: ServeOptions) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="ttyserve: %(message)s")
    if not pty_supported():
        log.error("this platform cannot serve: no PTY or posix_spawn support (Linux only)")
        return ServeExit.UNAVAILABLE
    return anyio.run(_serve, options)
