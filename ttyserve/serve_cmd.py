"""`ttyserve serve`: check the configuration, bind, print `listening ADDR`, serve, shut down."""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import ssl
import sys
from collections.abc import Iterator

import anyio

from .addresses import Address, default_address, is_loopback, parse_address
from .auth import Access
from .backends.kinds import make_backend, unavailable_reason
from .config import ServeConfig
from .credentials import read_token, tls_context
from .errors import AddressError, ConfigError, LeaseError, ListenError
from .exitcodes import ServeExit
from .journal import Journal
from .listeners import SocketLease, open_listeners, remove_socket_file
from .policy import Policy
from .server import Server, login_shell
from .settings import ServerSettings

log = logging.getLogger("ttyserve")


def _announce(address: Address) -> None:
    sys.stdout.write(f"listening {address}\n")
    sys.stdout.flush()


def check_exposure(addresses: list[Address], token: str | None, config: ServeConfig) -> None:
    """Refuse by default: TCP needs a token; beyond loopback it needs TLS too."""
    if config.insecure:
        for address in addresses:
            if address.scheme != "unix" and (token is None or address.scheme == "tcp"):
                log.warning("%s: serving without %s because of --insecure", address,
                            "a token" if token is None else "TLS")
        return
    for address in addresses:
        if address.scheme == "unix":
            continue
        if token is None:
            raise ConfigError(f"{address}: TCP and TLS listeners need a token (--token-file or "
                              "TTYSERVE_TOKEN), or --insecure")
        if address.scheme == "tcp" and not is_loopback(address.host):
            raise ConfigError(f"{address}: a non-loopback address needs TLS (tls:HOST:PORT "
                              "with --tls-cert and --tls-key), or --insecure")


def server_tls(config: ServeConfig, addresses: list[Address]) -> ssl.SSLContext | None:
    """The context of the `tls:` listeners, or None when there are none."""
    if not any(a.scheme == "tls" for a in addresses):
        return None
    if not config.tls_cert or not config.tls_key:
        raise ConfigError("tls: listeners need --tls-cert and --tls-key")
    return tls_context("server", certfile=config.tls_cert, keyfile=config.tls_key)


@contextlib.contextmanager
def _held(leases: list[SocketLease], journal: Journal | None) -> Iterator[None]:
    try:
        yield
    finally:
        for lease in leases:
            lease.release()
        if journal is not None:
            journal.close()


async def _serve(config: ServeConfig) -> int:
    try:
        addresses = [parse_address(a) for a in config.listen] or [default_address()]
        token = read_token(config.token_file)
        check_exposure(addresses, token, config)
        tls = server_tls(config, addresses)
        default_argv = shlex.split(config.command) if config.command else login_shell()
        if not default_argv:
            raise ConfigError(f"command {config.command!r} names no program")
    except (AddressError, ConfigError, ValueError) as exc:
        log.error("configuration: %s", exc)
        return ServeExit.CONFIG
    settings = ServerSettings(
        default_argv=default_argv, linger=config.linger, max_frame=config.max_frame,
        stdin_window=config.stdin_window,
        access=Access(token=token, allowed_uids=frozenset(config.allow_uid)),
        policy=Policy(config.allow_command, config.allow_env, config.max_argv_bytes,
                      config.max_env_bytes, config.max_cwd_bytes),
        max_sessions=config.max_sessions,
        max_sessions_per_connection=config.max_sessions_per_connection,
        handshake_timeout=config.handshake_timeout, max_connections=config.max_connections,
        shutdown_timeout=config.shutdown_timeout,
    )
    leases: list[SocketLease] = []
    journal: Journal | None = None
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            if config.journal is not None:
                journal = Journal(config.journal)
                journal.recover()
            listeners = open_listeners(addresses, leases)
        except (LeaseError, ListenError, OSError) as exc:
            with _held(leases, journal):
                log.error("%s", exc)
            return ServeExit.LEASE if isinstance(exc, LeaseError) else ServeExit.CONFIG
        server = Server(settings, make_backend(config.spawn, settings.default_cwd),
                        journal=journal, tls=tls)

        async def watch_signals() -> None:
            async for signum in signals:
                if not server.stopping:
                    log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                    server.shutdown()
                else:
                    log.warning("%s again: forcing shutdown", signal.Signals(signum).name)
                    server.force()

        with _held(leases, journal):
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watch_signals)
                    drained = await server.serve(listeners, _announce)
                    tg.cancel_scope.cancel()
            finally:
                for address, _ in listeners:
                    remove_socket_file(address)
    return ServeExit.OK if drained else ServeExit.ERROR


def serve_main(config: ServeConfig) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="ttyserve: %(message)s")
    reason = unavailable_reason(config.spawn)
    if reason is not None:
        log.error("this platform cannot serve: %s", reason)
        return ServeExit.UNAVAILABLE
    return anyio.run(_serve, config)
