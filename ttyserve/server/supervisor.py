"""`serve --workers N`: the supervisor, one server to the outside over N worker processes.

The supervisor is the process `serve` started. It binds the listeners, holds the leases
and the journal's lock, and starts N workers (the same program, told its place in
WORKER_ENV), each a whole server of its own that accepts from the same listening sockets,
runs the sessions it spawns, writes their records to the same journal (O_APPEND, one
write per group commit) and reaches the others' sessions over links (mesh.py). The
supervisor runs no session and reads no client byte: it prints `listening` once the
workers serve, passes on signals, writes the one `server.upgrade` record of an upgrade,
and when a worker dies, kills what is left of its sessions, ends their records
`crash-inferred` and starts another in its place.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import msgspec

from ..addresses import Address
from ..backends.cgroups import Containment, instance_name, kill_tree, remove_tree, until_empty
from ..backends.reaper import become_subreaper, run_orphan_reaper
from ..exitcodes import ServeExit
from .accepting import Acceptor
from .handover import ListenerState
from .journal import Journal, ServerUpgrade, hang_up_survivors
from .mesh import (
    FORCE,
    READY,
    REFUSED,
    RELOAD,
    STOP,
    UPGRADE,
    UPGRADED,
    WORKER_ENV,
    Census,
    Report,
    WorkerSpec,
)
from .upgrade import entry_point

log = logging.getLogger("ttyserve")

DISPATCH_WAIT = 1.0  # seconds a connection waits for a worker to take it
RESTART_PAUSE = 1.0  # a worker that died before it served is started again after this
TREE_GRACE = 2.0  # seconds a dead worker's session cgroups have to empty


@dataclass
class Worker:
    slot: int
    process: subprocess.Popen[bytes]
    control: socket.socket
    instance: str | None  # its cgroup directory's name (PID-STARTTIME)
    ready: anyio.Event = field(default_factory=anyio.Event)
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    """Starts, watches and replaces the workers; speaks for them to the outside."""

    def __init__(self, count: int, listeners: list[tuple[Address, Address, socket.socket]],
                 journal: Journal | None, containment: Containment | None,
                 token: str | None) -> None:
        self.count = count
        self.listeners = listeners
        self.journal = journal
        self.containment = containment
        self.token = token
        self.workers: dict[int, Worker] = {}
        self.stopping = False
        self.serving = False  # every worker came to serve, and `listening` was said
        self.forced = False  # a worker's drain did not finish: the exit is ERROR
        self._secret = secrets.token_hex(32)
        self._link_dir = ""
        self._census_fd = -1
        self._census: Census | None = None
        self._upgrade: dict[int, Report | None] | None = None  # a round: each worker's word
        self._paused: anyio.Event | None = None  # accepting waits (an upgrade)
        self._again = False  # SIGUSR2 came during an upgrade: another follows it
        self._turn = 0

    async def run(self, signals: AsyncIterator[int],
                  announce: Callable[[Address], None] | None) -> int:
        """Serve until every worker has stopped; the exit code."""
        become_subreaper()
        self._link_dir = tempfile.mkdtemp(prefix="ttyserve-links-")
        self._census_fd = Census.create(self.count)
        self._census = Census(self._census_fd, self.count, 0)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_orphan_reaper, frozenset())
                for slot in range(self.count):
                    self._start(slot, tg)
                if not await self._all_ready():
                    tg.cancel_scope.cancel()
                    return ServeExit.ERROR
                self.serving = True
                for index, (_, bound, sock) in enumerate(self.listeners):
                    tg.start_soon(self._accept_loop, index, sock)
                    if announce is not None:
                        announce(bound)
                tg.start_soon(self._signals, signals)
                await self._until_all_stopped()
                tg.cancel_scope.cancel()
        finally:
            for worker in self.workers.values():
                if worker.process.poll() is None:
                    worker.process.kill()
                    worker.process.wait()
            os.close(self._census_fd)
            shutil.rmtree(self._link_dir, ignore_errors=True)
        return ServeExit.ERROR if self.forced else ServeExit.OK

    # --- workers -------------------------------------------------------------------------

    def _spec(self, slot: int, control: socket.socket) -> WorkerSpec:
        journal = self.journal
        return WorkerSpec(
            slot=slot, workers=self.count, supervisor=os.getpid(), link_dir=self._link_dir,
            secret=self._secret,
            listeners=[ListenerState(requested=str(asked), address=str(bound), fd=-1)
                       for asked, bound, _ in self.listeners],
            control_fd=control.fileno(), census_fd=self._census_fd,
            journal_fd=journal.fd if journal is not None else None,
            journal_path=journal.path if journal is not None else None,
            containment_base=self.containment.root if self.containment is not None else None,
            token=self.token)

    def _start(self, slot: int, tg: anyio.abc.TaskGroup) -> None:
        """Start the worker for ``slot``: the same program, in a process group of its own
        (a terminal's Ctrl-C is the supervisor's to pass on, once)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec = self._spec(slot, theirs)
        fds = [theirs.fileno(), self._census_fd]
        if self.journal is not None:
            fds.append(self.journal.fd)
        try:
            process = subprocess.Popen(
                entry_point(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                pass_fds=fds, process_group=0,
                env={**os.environ, WORKER_ENV: msgspec.json.encode(spec).decode()})
        finally:
            theirs.close()
        ours.setblocking(False)
        worker = Worker(slot, process, ours, instance_name(process.pid))
        self.workers[slot] = worker
        tg.start_soon(self._watch, worker, tg)
        tg.start_soon(self._listen, worker)

    async def _all_ready(self) -> bool:
        """Whether every worker came to serve (one that stopped first fails the start)."""
        for worker in list(self.workers.values()):
            await worker.ready.wait()
            if worker.process.poll() is not None:
                log.error("worker %d stopped as it started (exit %s)", worker.slot,
                          worker.process.returncode)
                self.stopping = True
                for other in self.workers.values():
                    if other.process.poll() is None:
                        other.process.terminate()
                return False
        return True

    async def _listen(self, worker: Worker) -> None:
        """What the worker reports, until it is gone."""
        while True:
            await anyio.wait_readable(worker.control)
            try:
                data = worker.control.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                return
            try:
                said = msgspec.json.decode(data, type=Report)
            except msgspec.DecodeError:
                continue
            if said.event == READY:
                worker.ready.set()
            else:
                self._upgrade_reported(worker, said)

    async def _watch(self, worker: Worker, tg: anyio.abc.TaskGroup) -> None:
        """Wait for the worker's end; a death while serving is contained (`_died`)."""
        pidfd = os.pidfd_open(worker.process.pid)
        try:
            await anyio.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        code = worker.process.wait()
        worker.control.close()
        worker.ready.set()
        if self._upgrade is not None and self._upgrade.get(worker.slot, 0) is None:
            self._upgrade_reported(worker, Report(event=REFUSED))
        if self.stopping or not self.serving:
            if code != ServeExit.OK:
                self.forced = True  # its drain was forced (or it failed): so was the server's
            del self.workers[worker.slot]
            self._changed()
            return
        log.error("worker %d (pid %d) died (%s): its sessions end; another takes its place",
                  worker.slot, worker.process.pid, _status(code))
        await self._died(worker)
        if time.monotonic() - worker.started < RESTART_PAUSE:  # no restart loop at full speed
            await anyio.sleep(RESTART_PAUSE)
        if not self.stopping:
            self._start(worker.slot, tg)
        else:
            del self.workers[worker.slot]
            self._changed()

    async def _died(self, worker: Worker) -> None:
        """What a dead worker leaves: its counts, its sessions' trees (their cgroups: a
        `setsid` escapee too), and their records, ended `crash-inferred` at once."""
        assert self._census is not None
        self._census.forget(worker.slot)
        tree = None
        if self.containment is not None and worker.instance is not None:
            tree = os.path.join(self.containment.root, worker.instance)
            try:
                kill_tree(tree)
            except OSError as exc:
                log.warning("cannot kill what worker %d left in %s: %s", worker.slot, tree,
                            exc.strerror)
        survivors: list[int] = []
        if self.journal is not None:
            survivors = self.journal.crashed(f"s{worker.slot}.", contained=tree is not None)
        if survivors:
            await anyio.to_thread.run_sync(hang_up_survivors, survivors, 1.0)
        if tree is not None:
            await until_empty(tree, TREE_GRACE)
            remove_tree(tree)

    # --- connections ------------------------------------------------------------------

    async def _accept_loop(self, index: int, listener: socket.socket) -> None:
        """Accept the listener's connections and hand each to the next worker in turn (its
        descriptor over the worker's control socket): the load spreads evenly, and a
        client's next connection usually meets another worker (which the tests count
        on). TLS and WebSocket handshakes are the worker's."""
        acceptor = Acceptor(listener)
        while True:
            if self._paused is not None:
                await self._paused.wait()
                continue
            await anyio.wait_readable(listener)
            accepted = acceptor.accept_batch()
            try:
                for sock in accepted:
                    await self._dispatch(index, sock)
            finally:
                for sock in accepted:
                    sock.close()
            await acceptor.pause_if_starved()

    async def _dispatch(self, index: int, sock: socket.socket) -> None:
        """Hand ``sock`` to a worker: the next in turn that takes it now, else wait (up to a
        second) for one that will; closed when none does."""
        deadline = time.monotonic() + DISPATCH_WAIT
        while time.monotonic() < deadline:
            live = [w for w in self.workers.values()
                    if w.ready.is_set() and w.process.poll() is None]
            for _ in range(len(live)):
                worker = live[self._turn % len(live)]
                self._turn += 1
                try:
                    socket.send_fds(worker.control, [bytes([index])], [sock.fileno()])
                    return
                except OSError:
                    continue  # its queue is full, or it is gone: the next one
            await anyio.sleep(0.005)
        log.warning("no worker took a connection within %g s: closed", DISPATCH_WAIT)

    # --- signals, upgrades, the end -----------------------------------------------------

    async def _signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if signum == signal.SIGUSR2:
                self._begin_upgrade()
                continue
            if signum == signal.SIGHUP:  # each worker reads the files again
                self._tell_all(RELOAD)
                continue
            if self.stopping:
                log.warning("%s again: forcing shutdown", signal.Signals(signum).name)
                self.forced = True
                self._tell_all(FORCE)
            else:
                log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                self.stopping = True
                self._paused = anyio.Event()  # accepting stops for good
                self._tell_all(STOP)

    def _tell_all(self, command: str) -> None:
        for worker in self.workers.values():
            try:
                worker.control.send(command.encode())
            except OSError:
                pass  # gone: its watcher knows

    def _begin_upgrade(self) -> None:
        """SIGUSR2: every worker upgrades itself in place (section 12), each keeping its
        sessions; the journal gets one `server.upgrade` once every worker has said."""
        if self.stopping:
            return
        if self._upgrade is not None:  # one under way: another once it is done (section 12)
            self._again = True
            return
        self._upgrade = {slot: None for slot in self.workers}
        self._paused = anyio.Event()  # connections wait in the backlog for the new code
        self._tell_all(UPGRADE)

    def _upgrade_reported(self, worker: Worker, said: Report) -> None:
        round_ = self._upgrade
        if round_ is None or worker.slot not in round_:
            return
        round_[worker.slot] = said
        if any(word is None for word in round_.values()):
            return
        self._upgrade = None
        if self._paused is not None and not self.stopping:
            self._paused.set()
            self._paused = None
        done = [word for word in round_.values() if word is not None and word.event == UPGRADED]
        if done and self.journal is not None and not self.stopping:  # (a shutdown ended it)
            record = ServerUpgrade(at=self.journal.now(), from_version=done[0].from_version,
                                   to_version=done[0].to_version,
                                   sessions=sum(word.sessions for word in done))
            self.journal.write_now(record)
        log.info("upgrade: %d of %d workers upgraded", len(done), len(round_))
        if self._again:
            self._again = False
            self._begin_upgrade()

    _all_stopped: anyio.Event | None = None

    def _changed(self) -> None:
        if self._all_stopped is not None and not self.workers:
            self._all_stopped.set()

    async def _until_all_stopped(self) -> None:
        self._all_stopped = anyio.Event()
        self._changed()
        await self._all_stopped.wait()


def _status(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
