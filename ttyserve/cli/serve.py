"""`ttyserve serve`: check the configuration, bind, print `listening ADDR`, serve, shut down."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import signal
import ssl
import sys
from collections.abc import Callable, Iterator

import anyio
import msgspec

from ..addresses import Address, default_address, is_loopback, parse_address
from ..backends.kinds import make_backend, unavailable_reason
from ..credentials import read_token, tls_context
from ..errors import AddressError, ConfigError, LeaseError, ListenError, UsageError
from ..exitcodes import ServeExit
from ..server.auth import stdio_peer
from ..server.journal import Journal
from ..server.listener import Server
from ..server.settings import ServerSettings
from ..server.sockets import SocketLease, open_listeners, remove_socket_file
from ..transport.streams import PipeTransport

log = logging.getLogger("ttyserve")


def announcer(generated_token: str | None) -> Callable[[Address], None]:
    """What the server prints per listener: `listening ADDR`, and for a web listener whose
    token the server made itself, `browse URL#token=TOKEN` (a configured one never shows)."""

    def announce(address: Address) -> None:
        lines = [f"listening {address}"]
        if address.web and generated_token is not None:
            scheme = "https" if address.encrypted else "http"
            lines.append(f"browse {scheme}://{address.netloc}/#token={generated_token}")
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()

    return announce


def check_exposure(addresses: list[Address], token: str | None, config: ServerSettings) -> None:
    """Refuse by default: TCP, TLS and web listeners need a token; beyond loopback, TLS too."""
    if config.insecure:
        for address in addresses:
            if address.scheme != "unix" and (token is None or not address.encrypted):
                log.warning("%s: serving without %s because of --insecure", address,
                            "a token" if token is None else "TLS")
        return
    for address in addresses:
        if address.scheme == "unix":
            continue
        if token is None:
            raise ConfigError(f"{address}: TCP and TLS listeners need a token (--token-file or "
                              "TTYSERVE_TOKEN), or --insecure")
        if not address.encrypted and not is_loopback(address.host):
            secure = "wss" if address.web else "tls"
            raise ConfigError(f"{address}: a non-loopback address needs TLS ({secure}:HOST:PORT "
                              "with --tls-cert and --tls-key), or --insecure")


def server_tls(config: ServerSettings, addresses: list[Address]) -> ssl.SSLContext | None:
    """The context of the `tls:` and `wss:` listeners, or None when there are none."""
    if not any(a.encrypted for a in addresses):
        return None
    if not config.tls_cert or not config.tls_key:
        raise ConfigError("tls: and wss: listeners need --tls-cert and --tls-key")
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


def stdio_transport() -> PipeTransport:
    """`serve --stdio`: the protocol on stdin and stdout, which are moved to private
    descriptors so that nothing else can ever write to stdout (anything that tries
    reaches stderr) or read from stdin (it reads /dev/null)."""
    transport = PipeTransport(os.dup(0), os.dup(1))
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return transport


def listen_addresses(config: ServerSettings) -> list[Address]:
    """The listeners; none with --stdio (then no --listen may be given either)."""
    if config.stdio:
        if config.listen:
            raise UsageError("--stdio serves stdin and stdout: it takes no --listen")
        return []
    addresses = [parse_address(a) for a in config.listen] or [default_address()]
    for address in addresses:
        if address.carried:
            raise ConfigError(f"{address}: a server listens on unix:, tcp:, tls:, ws: or "
                              "wss:; the far side of a carrier runs serve --stdio")
    return addresses


async def _serve(config: ServerSettings) -> int:
    """Serve ``config`` (what flags, environment and file said); the server's exit code."""
    try:
        addresses = listen_addresses(config)
    except UsageError as exc:
        log.error("%s", exc)
        return ServeExit.USAGE
    except (AddressError, ConfigError) as exc:
        log.error("configuration: %s", exc)
        return ServeExit.CONFIG
    try:
        token = None if config.stdio else read_token(config.token_file)
        generated: str | None = None
        if token is None and any(a.web for a in addresses):  # section 8: a fresh one, shown
            token = generated = secrets.token_urlsafe(32)
        check_exposure(addresses, token, config)
        tls = server_tls(config, addresses)
        settings = msgspec.structs.replace(config, token=token)
    except (AddressError, ConfigError, ValueError) as exc:
        log.error("configuration: %s", exc)
        return ServeExit.CONFIG
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
        server = Server(settings, make_backend(settings.spawn, settings.default_cwd),
                        journal=journal, tls=tls)
        quiet_collector()

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
                    only = (stdio_transport(), stdio_peer()) if config.stdio else None
                    drained = await server.serve(listeners, announcer(generated), only=only)
                    tg.cancel_scope.cancel()
            finally:
                for address, _ in listeners:
                    remove_socket_file(address)
    return ServeExit.OK if drained else ServeExit.ERROR


def quiet_collector() -> None:
    """Freeze what start-up made (modules, classes, settings) out of every collection, so
    that the collections sessions cause do not walk it again and again. (A rarer youngest
    generation was tried too: it let the cycles sessions leave grow the heap by 4 MiB
    over 80,000 sessions, twice what they grow it now.)"""
    gc.freeze()  # no collection first: it would cost start-up (6 ms) what it saves later


def serve_main(config: ServerSettings) -> int:
    # Through a carrier, stderr reaches the user of each `exec`: only what needs them.
    level = logging.WARNING if config.stdio else logging.INFO
    logging.basicConfig(stream=sys.stderr, level=level, format="ttyserve: %(message)s")
    reason = unavailable_reason(config.spawn)
    if reason is not None:
        log.error("this platform cannot serve: %s", reason)
        return ServeExit.UNAVAILABLE
    return anyio.run(_serve, config)
