"""Upgrading the server in place on SIGUSR2 (section 12): the dry run, the execve that hands
everything over, and the new code's side of it.

The process id stays, so every session's process stays our child and no exit status is
lost. The old code checks the new one first: a child process started the way this server
was (the same interpreter and arguments, so the code now installed at the same path)
imports every module, reads the configuration and a state of the very shape the old code
would hand over, and exits; only if it exits 0 does anything change. Then the server
(listener.py) stops accepting, ends what cannot be kept, closes every connection with
`server_restarting`, and calls `execute`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pkgutil
import signal
import socket
import subprocess
import sys
from collections.abc import Collection

import anyio

from ..addresses import Address, parse_address
from ..backends.cgroups import Containment, Limits
from ..backends.local import ChildBackend
from ..version import __version__
from .handover import (
    CHECK_ENV,
    HANDOVER_ENV,
    HANDOVER_VERSION,
    ContainmentState,
    HandoverState,
    LeaseState,
    ListenerState,
    encode,
    write,
)
from .journal import Journal
from .lease import SocketLease
from .registry.registry import SessionRegistry

log = logging.getLogger("ttyserve")

DRY_RUN_TIMEOUT = 60.0  # seconds the new code has to show that it starts
# Blocked across the execve; the new code restores the mask there was once it receives them
# (serve.py), so what a carrier or supervisor blocked stays blocked.
HELD_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGHUP})


def entry_point() -> list[str]:
    """How this server was started: the interpreter and its arguments as given (`python -m
    ttyserve serve ...`, or the `ttyserve` script's path), so the code at the same path runs."""
    return [sys.executable, *sys.orig_argv[1:]]


class Handover:
    """What one server hands over: its listeners, leases, journal and containment (fixed
    while it serves) and, at the moment of the execve, its registry's sessions."""

    def __init__(self, listeners: list[tuple[Address, Address, socket.socket]],
                 leases: list[SocketLease], journal: Journal | None,
                 containment: Containment | None, token: str | None,
                 registry: SessionRegistry, keep: list[int] | None = None,
                 activated: Collection[int] = ()) -> None:
        """``keep``: more descriptors the new code finds where they are (a worker's);
        ``activated``: the listeners' descriptors a service manager handed over."""
        self.listeners = listeners  # (as configured, as bound, the socket)
        self.activated = set(activated)
        self.keep = keep or []
        self.leases = leases
        self.journal = journal
        self.containment = containment
        self.token = token
        self.registry = registry

    def state(self, dry: bool = False, blocked: Collection[int] | None = None,
              ) -> HandoverState:
        """The state to hand over (``dry``: what it would be now, changing nothing), with the
        signal mask to restore (``blocked``: the one before the hand-over's)."""
        if blocked is None:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        containment, handing_over = self.containment, self.registry.handing_over
        return HandoverState(
            version=HANDOVER_VERSION, from_version=__version__,
            listeners=[ListenerState(requested=str(asked), address=str(bound),
                                     fd=sock.fileno(),
                                     activated=sock.fileno() in self.activated)
                       for asked, bound, sock in self.listeners],
            leases=[LeaseState(socket_path=lease.path.removesuffix(".lock"), fd=lease.fd)
                    for lease in self.leases],
            journal_fd=self.journal.fd if self.journal is not None else None,
            journal_path=self.journal.path if self.journal is not None else None,
            token=self.token, blocked=sorted(int(signum) for signum in blocked),
            containment=None if containment is None else ContainmentState(
                root=containment.root, home=containment.home,
                memory_max=containment.limits.memory_max,
                pids_max=containment.limits.pids_max, cpu_max=containment.limits.cpu_max,
                left=sorted(containment.left)),
            sessions=handing_over.describe() if dry else handing_over.handover(),
            grants=handing_over.describe_grants())

    async def dry_run(self) -> bool:
        """Start the new code on a state of the shape it would be handed; whether it starts,
        reads it and accepts the configuration (its stderr is ours: it says why not)."""
        try:
            fd = write(encode(self.state(dry=True)))
        except Exception as exc:  # (out of memory or descriptors): nothing changed
            log.error("upgrade refused: the state cannot be written: %s", exc)
            return False
        try:
            process = await anyio.open_process(
                entry_point(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=None, pass_fds=(fd,), env={**os.environ, CHECK_ENV: str(fd)})
        except OSError as exc:
            log.error("upgrade refused: cannot start the new code: %s", exc)
            return False
        finally:
            os.close(fd)
        async with process:
            with anyio.move_on_after(DRY_RUN_TIMEOUT):
                code = await process.wait()
                if code == 0:
                    return True
                log.error("upgrade refused: the new code's dry run failed (exit %d); "
                          "serving on, unchanged", code)
                return False
            process.kill()
            log.error("upgrade refused: the new code's dry run did not finish in %g s",
                      DRY_RUN_TIMEOUT)
            return False

    def execute(self, backend: ChildBackend) -> None:
        """Hand everything over and execute the new code in this process. Returns only when
        that failed: then every session is taken back and serving goes on.

        The state is written before anything changes (what can fail, fails first), and the
        signals the server acts on are blocked across the execve: one sent while the new
        code starts waits for it, instead of killing the process and every session."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            state = self.state(dry=True, blocked=held)
            fd = write(encode(state))
        except Exception as exc:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            log.error("upgrade failed: the state cannot be written: %s; serving on", exc)
            return
        # The same sessions (nothing ran since): the new code's from now on.
        handed = self.registry.handing_over.handover()
        assert len(handed) == len(state.sessions)
        descriptors = [*state.descriptors(), *self.keep, fd]
        for kept in descriptors:
            os.set_inheritable(kept, True)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(sys.executable, entry_point(), {**os.environ, HANDOVER_ENV: str(fd)})
        except OSError as exc:
            log.error("upgrade failed: cannot execute %s: %s; serving on", sys.executable,
                      exc.strerror)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(fd)
        for kept in descriptors[:-1]:
            os.set_inheritable(kept, False)
        self.registry.handing_over.adopt(state.sessions, backend)


def check(state: HandoverState | None) -> None:
    """The dry run's own work, in the new code: every module imports (a broken install fails
    here, not after the execve), and the state was read (by the caller). Raises what
    failed."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for module in pkgutil.walk_packages([package], "ttyserve."):
        if not module.name.endswith(".__main__"):  # (importing that one runs the program)
            importlib.import_module(module.name)
    if state is None:
        raise ValueError(f"{CHECK_ENV} names no state")


def restored_containment(state: ContainmentState) -> Containment:
    containment = Containment(state.root, state.home,
                              Limits(state.memory_max, state.pids_max, state.cpu_max))
    containment.left.update(state.left)
    return containment


def adopted_listeners(state: HandoverState, addresses: list[Address],
                      ) -> tuple[list[tuple[Address, Address, socket.socket]], list[SocketLease],
                                 list[Address]]:
    """The handed-over listeners the configuration still asks for, with their leases, and
    the addresses it asks for that were not handed over (to bind anew). What it no longer
    asks for is closed."""
    wanted = {str(address): address for address in addresses}
    kept: list[tuple[Address, Address, socket.socket]] = []
    leases: list[SocketLease] = []
    found: set[str] = set()
    for listener in state.listeners:
        sock = socket.socket(fileno=listener.fd)
        os.set_inheritable(listener.fd, False)
        asked = wanted.get(listener.requested)
        if asked is None:
            bound = parse_address(listener.address)
            sock.close()
            if bound.scheme == "unix":
                with contextlib.suppress(OSError):
                    os.unlink(bound.path)
            continue
        sock.setblocking(False)
        kept.append((asked, parse_address(listener.address), sock))
        found.add(listener.requested)
    for lease in state.leases:
        adopted = SocketLease.adopted(lease.socket_path, lease.fd)
        if f"unix:{lease.socket_path}" in found:
            leases.append(adopted)
        else:
            adopted.release()
    return kept, leases, [a for key, a in wanted.items() if key not in found]
