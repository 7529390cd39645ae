"""`ttyserve serve`: check the configuration, bind, print `listening ADDR`, serve, shut down."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

import anyio
import msgspec

from ..addresses import Address, default_address, is_loopback, parse_address
from ..backends.cgroups import Containment, Unavailable, open_containment, sweep_dead_servers
from ..backends.kinds import make_backend, unavailable_reason
from ..backends.local import ChildBackend
from ..credentials import read_token, tls_context
from ..errors import AddressError, ConfigError, LeaseError, ListenError, UsageError
from ..exitcodes import ServeExit
from ..server.activation import inherited_listeners
from ..server.auth import stdio_peer
from ..server.handover import CHECK_ENV, HandoverState, UnreadableState, take
from ..server.journal import Journal
from ..server.listener import Server
from ..server.mesh import (
    READY,
    REFUSED,
    RELOAD,
    STOP,
    UPGRADE,
    UPGRADED,
    WORKER_ENV,
    Mesh,
    WorkerSpec,
    die_with_supervisor,
    report,
)
from ..server.principals import load_principals
from ..server.settings import ServerSettings
from ..server.sockets import SocketLease, open_listeners, remove_socket_file
from ..server.targets.config import load_targets
from ..server.upgrade import (
    HELD_SIGNALS,
    Handover,
    adopted_listeners,
    check,
    restored_containment,
)
from ..transport.streams import PipeTransport
from ..version import __version__
from .logs import configure

if TYPE_CHECKING:
    from ..web.exchange import WebApi

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
def _held(leases: list[SocketLease], journal: Journal | None,
          containment: Containment | None = None) -> Iterator[None]:
    try:
        yield
    finally:
        for lease in leases:
            lease.release()
        if journal is not None:
            journal.close()
        if containment is not None:
            containment.close()


def contain(config: ServerSettings) -> Containment | None:
    """This server's containment (`--cgroup`): None when it is off (auto says why, in one
    line). Raises ConfigError when what was asked for cannot be had: a directory named or
    limits set with no writable cgroup v2, a missing controller."""
    if config.cgroup == "off":
        return None
    limits = config.limits
    try:
        containment = open_containment(config.cgroup, limits)
    except Unavailable as exc:
        if config.cgroup != "auto" or limits.controllers():
            raise ConfigError(f"--cgroup {config.cgroup}: {exc}") from None
        log.info("containment is off: %s (sessions' processes are not put in cgroups)", exc)
        return None
    kept = sweep_dead_servers(os.path.dirname(containment.root))
    if kept:
        log.info("%d session cgroup(s) of servers that are gone still hold processes (left "
                 "running by --leftovers leave, or by a server that died with no journal to "
                 "end them): left as they are. To see them: find %s -name cgroup.procs -exec "
                 "cat {} +; to end them: for d in %s; do echo 1 > $d/cgroup.kill; done",
                 len(kept), " ".join(kept), " ".join(kept))
    return containment


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


def _checked(config: ServerSettings, made: str | None, serving: list[Address] | None = None,
             ) -> tuple[list[Address], str | None, str | None, ssl.SSLContext | None]:
    """What the configuration asks for, checked: the addresses (``serving``, instead of
    --listen: those of the sockets a service manager handed over, or a worker's, its
    supervisor's), the token (and whether this server made it: ``made``, one made before,
    or a fresh one), the TLS context. Raises UsageError, AddressError, ConfigError or
    ValueError."""
    addresses = serving or listen_addresses(config)
    if config.targets:
        load_targets(config.targets)  # (ConfigError, exit 3, if unusable)
    if config.principals and not config.stdio:  # their tokens are the only ones
        if config.token_file or os.environ.get("TTYSERVE_TOKEN"):
            raise UsageError("--principals names every token the server takes: give no "
                             "--token-file (nor TTYSERVE_TOKEN) beside it")
        load_principals(config.principals)  # (ConfigError, exit 3, if unusable)
        check_exposure(addresses, "principals", config)
        return addresses, None, None, server_tls(config, addresses)
    token = None if config.stdio else read_token(config.token_file)
    generated: str | None = None
    if token is None and any(a.web for a in addresses):  # section 8: a fresh one, shown
        token = generated = made or secrets.token_urlsafe(32)
    check_exposure(addresses, token, config)
    return addresses, token, generated, server_tls(config, addresses)


def _bind(addresses: list[Address], leases: list[SocketLease], *, upgraded: bool = False,
          ) -> list[tuple[Address, Address, socket.socket]]:
    """Each address bound: (as asked, as bound, the socket). After an upgrade an address the
    new configuration added that cannot be bound is left out, logged: the sessions the
    server kept matter more than a new listener."""
    bound = []
    try:
        for address in addresses:
            try:
                opened = open_listeners([address], leases)
            except (ListenError, LeaseError) as exc:
                if not upgraded:
                    raise
                log.error("upgrade: %s; serving on without it", exc)
                continue
            bound += [(address, real, sock) for real, sock in opened]
    except BaseException:
        for _, _, sock in bound:
            sock.close()
        raise
    return bound


def _journal(config: ServerSettings, handed: HandoverState | None,
             spec: WorkerSpec | None) -> Journal | None:
    """The journal: after an upgrade, the one handed over (no recovery: nothing crashed; and
    kept whatever the configuration now says, since the sessions kept have their start
    records there); a worker's, its supervisor's; else the configured one, opened and
    recovered."""
    if spec is not None and handed is None:
        if spec.journal_fd is None or spec.journal_path is None:
            return None
        journal = Journal.adopted(spec.journal_fd, spec.journal_path)
        journal.supervisor = spec.supervisor
        return journal
    if handed is not None and handed.journal_fd is not None:
        assert handed.journal_path is not None
        if config.journal is None or (
                os.path.abspath(config.journal) != os.path.abspath(handed.journal_path)):
            log.warning("upgrade: the journal stays %s until the server restarts",
                        handed.journal_path)
        journal = Journal.adopted(handed.journal_fd, handed.journal_path)
        journal.supervisor = spec.supervisor if spec is not None else None
        return journal
    if config.journal is None:
        return None
    journal = Journal(config.journal)
    journal.recover()
    return journal


def _contained(config: ServerSettings, handed: HandoverState | None,
               spec: WorkerSpec | None) -> Containment | None:
    """The containment: after an upgrade, the one handed over (its directory holds the
    sessions kept); a worker's, in its supervisor's directory; else `contain`'s. Raises
    ConfigError, but not after an upgrade: the sessions kept matter more than containing
    new ones."""
    if handed is not None and handed.containment is not None:
        return restored_containment(handed.containment)
    if spec is not None:
        config = msgspec.structs.replace(config, cgroup=spec.containment_base or "off")
    try:
        return contain(config)
    except ConfigError as exc:
        if handed is None:
            raise
        log.error("upgrade: %s; new sessions run without containment", exc)
        return None


def _worker_listeners(spec: WorkerSpec, handed: HandoverState | None,
                      leases: list[SocketLease],
                      ) -> list[tuple[Address, Address, socket.socket]]:
    """A worker's one listener, its link listener (after an upgrade, the one handed over):
    its clients' connections come from its supervisor, who accepts them."""
    link = Address("unix", path=os.path.join(spec.link_dir, f"w{spec.slot}.sock"))
    for fd in (spec.control_fd, spec.census_fd):
        os.set_inheritable(fd, False)
    if handed is not None:
        listeners, leases[:], unbound = adopted_listeners(handed, [link])
        return listeners + _bind(unbound, leases, upgraded=True)
    return _bind([link], leases)


async def _serve(config: ServerSettings, handed: HandoverState | None = None,
                 spec: WorkerSpec | None = None,
                 inherited: list[tuple[Address, socket.socket]] | None = None) -> int:
    """Serve ``config`` (what flags, environment and file said), going on with what an
    upgrade handed over if anything was; as a worker where ``spec`` says; on the sockets a
    service manager handed over (``inherited``) instead of --listen; the server's exit
    code."""
    activated = [address for address, _ in inherited or []] if handed is None else [
        parse_address(listener.requested) for listener in handed.listeners
        if listener.activated]
    # What its token and TLS are for: a worker's, what its supervisor accepts for it (the
    # sockets a service manager handed the supervisor too); else the activated ones, if any.
    serving = activated if spec is None else [
        parse_address(listener.requested) for listener in spec.listeners]
    try:
        addresses, token, generated, tls = _checked(
            config, handed.token if handed is not None else spec.token if spec else None,
            serving)
        # (what it serves, whoever bound it: the API goes with a web listener it serves)
        settings = msgspec.structs.replace(config, token=token,
                                           listen=[str(address) for address in addresses])
    except UsageError as exc:
        log.error("%s", exc)
        return ServeExit.USAGE
    except (AddressError, ConfigError, ValueError) as exc:
        log.error("configuration: %s", exc)
        return ServeExit.CONFIG
    leases: list[SocketLease] = []
    journal: Journal | None = None
    containment: Containment | None = None
    listeners: list[tuple[Address, Address, socket.socket]] = []
    link: Address | None = None
    with anyio.open_signal_receiver(*HELD_SIGNALS) as signals:
        if handed is not None:  # (held across the upgrade's execve: the mask there was)
            signal.pthread_sigmask(signal.SIG_SETMASK, handed.blocked)
        try:
            journal = _journal(config, handed, spec)
            unbound = addresses
            if spec is not None:
                listeners = _worker_listeners(spec, handed, leases)
                link, unbound = listeners[0][1], []
            elif handed is not None:
                listeners, leases, unbound = adopted_listeners(handed, addresses)
            elif inherited:
                listeners, unbound = [(a, a, sock) for a, sock in inherited], []
            containment = _contained(config, handed, spec)
            listeners += _bind(unbound, leases, upgraded=handed is not None)
        except (LeaseError, ListenError, OSError, ConfigError) as exc:
            for _, _, sock in listeners:
                sock.close()
            with _held(leases, journal, containment):
                log.error("%s", exc)
            return ServeExit.LEASE if isinstance(exc, LeaseError) else ServeExit.CONFIG
        if spec is None and handed is None and config.worker_count > 1:
            from ..server.supervisor import Supervisor  # (3-5 ms of every other start)

            with _held(leases, journal, containment):
                try:
                    return await Supervisor(config.worker_count, listeners, journal,
                                            containment, generated).run(
                        signals, announcer(generated))
                finally:
                    for asked, bound, _ in listeners:
                        if asked not in activated:  # (the service manager's to remove)
                            remove_socket_file(bound)
        return await _run(config, settings, signals, handed, spec, tls, generated, listeners,
                          link, leases, journal, containment, activated)


_COMMANDS = {signal.SIGUSR2: UPGRADE, signal.SIGHUP: RELOAD}  # (the others: a shutdown;
# so is SIGHUP for `serve --stdio`, whose carrier hung up)


class Orders:
    """What a serving process is told, by signals or (a worker) by its supervisor alone:
    drain, force, upgrade in place."""

    def __init__(self, server: Server, handover: Handover, backend: ChildBackend,
                 config: ServerSettings, spec: WorkerSpec | None) -> None:
        self.server, self.handover, self.backend = server, handover, backend
        self.config, self.spec = config, spec

    async def upgrade(self) -> None:
        server, handover = self.server, self.handover
        if self.config.stdio:
            log.warning("SIGUSR2: serve --stdio does not upgrade in place (its one "
                        "connection is the server's life)")
        elif not server.upgrading and not server.stopping and await handover.dry_run():
            log.info("upgrading from %s", __version__)
            server.upgrade(lambda: handover.execute(self.backend))
        elif self.spec is not None:
            report(self.spec.control_fd, REFUSED)

    def act(self, command: str, upgrades: anyio.abc.TaskGroup) -> None:
        server = self.server
        if command == UPGRADE:
            upgrades.start_soon(self.upgrade)
        elif command == RELOAD:
            server.reload()
        elif not server.stopping:
            log.info("%s: shutting down gracefully", command)
            server.shutdown()
        elif command != STOP:
            log.warning("%s again: forcing shutdown", command)
            server.force()

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async with anyio.create_task_group() as upgrades:
            self.server.on_command = lambda command: self.act(command, upgrades)
            async for signum in signals:
                if self.spec is not None:  # a worker takes its orders from its supervisor
                    log.warning("%s: ignored: signals go to the supervisor (pid %d)",
                                signal.Signals(signum).name, os.getppid())
                    continue
                name = signal.Signals(signum)
                command = _COMMANDS.get(name)
                if command == RELOAD and self.config.stdio:
                    command = None
                self.act(command or name.name, upgrades)


def _http_api(settings: ServerSettings) -> WebApi | None:
    """The HTTP API (section 13) for `ws:` and `wss:` listeners it serves (its imports: only
    then)."""
    if not any(parse_address(address).web for address in settings.listen):
        return None
    from ..api.routes import HttpApi

    return HttpApi()


async def _run(config: ServerSettings, settings: ServerSettings, signals: AsyncIterator[int],
               handed: HandoverState | None, spec: WorkerSpec | None,
               tls: ssl.SSLContext | None, generated: str | None,
               listeners: list[tuple[Address, Address, socket.socket]], link: Address | None,
               leases: list[SocketLease], journal: Journal | None,
               containment: Containment | None, activated: list[Address]) -> int:
    """Serve in this process (one of `--workers 1`, or a worker of many)."""
    backend = make_backend(settings.spawn, settings.default_cwd, containment)
    server = Server(settings, backend, journal=journal, tls=tls,
                    mesh=Mesh(spec) if spec is not None else None, link=link,
                    api=_http_api(settings))
    handover = Handover(listeners, leases, journal, containment, generated, server.registry,
                        keep=[spec.control_fd, spec.census_fd] if spec is not None else [],
                        activated=[sock.fileno() for asked, _, sock in listeners
                                   if asked in activated])
    announce = announcer(generated) if handed is None else None
    if spec is not None:
        announce = _as_worker(server, spec, handed)
    orders = Orders(server, handover, backend, config, spec)
    quiet_collector()
    with _held(leases, journal, containment):
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(orders.watch, signals)
                only = (stdio_transport(), stdio_peer()) if config.stdio else None
                drained = await server.serve(
                    [(bound, sock) for _, bound, sock in listeners], announce, only=only,
                    adopt=handed)
                tg.cancel_scope.cancel()
        finally:
            for asked, bound, _ in listeners:  # (the supervisor's and the service
                if (spec is None or bound == link) and asked not in activated:  # manager's
                    remove_socket_file(bound)  # are theirs to remove)
    return ServeExit.OK if drained else ServeExit.ERROR


def _as_worker(server: Server, spec: WorkerSpec, handed: HandoverState | None,
               ) -> Callable[[Address], None] | None:
    """A worker's ways to its supervisor: the connections it is handed, its report of an
    upgrade, and of its start (what it says instead of `listening`)."""
    control = spec.control_fd
    server.dispatched = (socket.socket(fileno=os.dup(control)),
                         [parse_address(state.address) for state in spec.listeners])
    server.registry.on_upgraded = lambda version, kept: report(
        control, UPGRADED, sessions=kept, from_version=version, to_version=__version__)
    return (lambda _: report(control, READY)) if handed is None else None


def quiet_collector() -> None:
    """Freeze what start-up made (modules, classes, settings) out of every collection, so
    that the collections sessions cause do not walk it again and again. (A rarer youngest
    generation was tried too: it let the cycles sessions leave grow the heap by 4 MiB
    over 80,000 sessions, twice what they grow it now.)"""
    gc.freeze()  # no collection first: it would cost start-up (6 ms) what it saves later


def serve_main(config: ServerSettings) -> int:
    # Through a carrier, stderr reaches the user of each `exec`: only what needs them.
    level = logging.WARNING if config.stdio else logging.INFO
    spec = worker_spec()
    configure(level, config.log_format, spec.slot if spec is not None else None)
    reason = unavailable_reason(config.spawn)
    if reason is not None:
        log.error("this platform cannot serve: %s", reason)
        return ServeExit.UNAVAILABLE
    if CHECK_ENV in os.environ:
        return _dry_run(config)
    try:
        handed = take()
    except UnreadableState as exc:  # the dry run read the same: only a new bug gets here
        log.error("upgrade: %s", exc)
        return ServeExit.ERROR
    if spec is not None:
        die_with_supervisor(spec.supervisor)
    try:  # (a worker, and the code an upgrade started, find no LISTEN_PID of theirs)
        inherited = inherited_listeners()
    except ConfigError as exc:
        log.error("socket activation: %s", exc)
        return ServeExit.CONFIG
    return anyio.run(_serve, config, handed, spec, inherited)


def worker_spec() -> WorkerSpec | None:
    """This process's place as a worker of a supervisor (WORKER_ENV), if it is one."""
    text = os.environ.get(WORKER_ENV)
    return None if not text else msgspec.json.decode(text, type=WorkerSpec)


def _dry_run(config: ServerSettings) -> int:
    """An upgrade's dry run, in the new code: 0 when it can take over from the old one."""
    try:
        state = take(CHECK_ENV)
        check(state)
        spec = worker_spec()  # (checked as the real start will be: what it will serve)
        serving = spec.listeners if spec is not None else [
            listener for listener in (state.listeners if state else []) if listener.activated]
        _checked(config, None, [parse_address(listener.requested) for listener in serving])
    except UsageError as exc:
        log.error("dry run: %s", exc)
        return ServeExit.USAGE
    except Exception as exc:  # whatever the new code cannot do is a refusal, said here
        log.error("dry run: %s: %s", type(exc).__name__, exc)
        return ServeExit.CONFIG
    return ServeExit.OK
