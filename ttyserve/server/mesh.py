"""A worker's place among the server's workers (`serve --workers N`): its slot, the ids that
name it, where the other workers listen for hops, and the counts every worker shares.

A session lives in the worker that spawned it, and its id says which (`s2.…`), as a grant's
secret does (`g2.…`): any worker routes a request by the name alone, with no directory. A
worker reaches another's session over a link of its own, a protocol-v1 connection to the
other worker's link socket that begins with a `LinkHello` (the server's secret and the
client's identity, so the far worker admits, journals and counts as for the client).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import hmac
import mmap
import os
import signal
import socket
import sys

import anyio
import msgspec

from ..ids import slot_of, slot_prefix
from .auth import TABLE_BYTES, FailedHellos, Peer
from .handover import ListenerState

WORKER_ENV = "TTYSERVE_WORKER"  # a worker's WorkerSpec, as JSON
LINK_HELLO_LIMIT = 4096  # the longest LinkHello a link listener reads
# What a supervisor tells its workers over their control sockets (besides connections).
STOP, FORCE, UPGRADE, RELOAD = "stop", "force", "upgrade", "reload"


class Report(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A worker's word to its supervisor: it serves, it upgraded, or it refused to."""

    event: str  # READY, UPGRADED, REFUSED
    sessions: int = 0  # UPGRADED: the sessions it kept
    from_version: str = ""
    to_version: str = ""


READY, UPGRADED, REFUSED = "ready", "upgraded", "refused"


def report(fd: int, event: str, **members: object) -> None:
    """A worker tells its supervisor ``event`` (one datagram; lost if it is gone)."""
    try:
        os.write(fd, msgspec.json.encode(Report(event=event, **members)))  # type: ignore[arg-type]
    except OSError:
        pass


class WorkerSpec(msgspec.Struct, kw_only=True):
    """What the supervisor hands a worker it starts (and the worker keeps across its own
    upgrades in place): its slot, the server's listeners and journal, where links go."""

    slot: int
    workers: int
    supervisor: int  # its pid
    listeners: list[ListenerState]
    link_dir: str
    secret: str  # hex: what a link's first line must carry
    control_fd: int  # a SOCK_SEQPACKET socket to the supervisor
    census_fd: int  # the shared counts (a memfd)
    journal_fd: int | None = None
    journal_path: str | None = None
    containment_base: str | None = None  # the supervisor's cgroup directory
    token: str | None = None  # the web listeners' token the supervisor made


_PR_SET_PDEATHSIG = 1


def die_with_supervisor(supervisor: int) -> None:
    """A worker dies with its supervisor (SIGKILL when it goes): a server killed hard is
    gone whole, and the next one's recovery finds all it left, as after a single process.
    Raises SystemExit when the supervisor is gone already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != supervisor:
        raise SystemExit("the supervisor is gone")


class LinkHello(msgspec.Struct, kw_only=True):
    """A link's first line: the secret, the client's peer, and whom the client was admitted
    as (None: its `hello` carries a grant, which the far worker checks itself)."""

    secret: str
    transport: str
    host: str = ""
    uid: int | None = None
    pid: int | None = None
    principal: str | None = None

    @property
    def peer(self) -> Peer:
        return Peer(self.transport, self.host, self.uid, self.pid)


def _census_size(workers: int) -> int:
    return 2 * workers * 8 + TABLE_BYTES


class Census:
    """Sessions and connections per worker, and failed hellos per peer, in memory every
    worker maps: each writes its own slot of the counts (one aligned 8-byte store) and
    reads the sum, so the server's limits hold for the whole server. An admission counts
    itself first and then checks, so racing workers may both refuse at the limit, never
    both pass it."""

    SESSIONS, CONNECTIONS = 0, 1

    def __init__(self, fd: int, workers: int, slot: int) -> None:
        self._fd = fd
        self._map = mmap.mmap(fd, _census_size(workers))
        self._counts = memoryview(self._map).cast("q")
        self.workers = workers
        self.slot = slot
        self.throttle = FailedHellos(self._counts[2 * workers:])

    @staticmethod
    def create(workers: int) -> int:
        """A new, zeroed census for ``workers`` workers: its descriptor."""
        fd = os.memfd_create("ttyserve-census", os.MFD_CLOEXEC)
        os.ftruncate(fd, _census_size(workers))
        return fd

    def publish(self, kind: int, count: int) -> None:
        self._counts[kind * self.workers + self.slot] = count

    def total(self, kind: int, own: int) -> int:
        """The whole server's count, with ``own`` for this worker."""
        base = kind * self.workers
        return own + sum(self._counts[base + i] for i in range(self.workers)
                         if i != self.slot)

    def claim(self, name: str) -> bool:
        """Hold ``name`` (a principal's idempotency key) for this worker, server-wide; False
        when another worker holds it. A record lock on the census at an offset the name's
        digest gives: one process at a time may hold it, and the kernel frees it when that
        process dies (a crashed worker's keys are free again), or closes any descriptor of
        the census (an upgrade in place does: its new code claims its sessions' keys
        again)."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _claim_offset(name))
        except OSError:  # EACCES or EAGAIN: held by another worker
            return False
        return True

    def release(self, name: str) -> None:
        """Let go of ``name`` (its session was forgotten, or its open failed)."""
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _claim_offset(name))

    def forget(self, slot: int) -> None:
        """A worker died: its counts go (the supervisor's)."""
        for kind in (self.SESSIONS, self.CONNECTIONS):
            self._counts[kind * self.workers + slot] = 0


def _claim_offset(name: str) -> int:
    """Where ``name``'s lock is: 62 bits of its digest (a lock may lie past the file's end)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") >> 2


class Mesh:
    """This worker's view of the others."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.slot = spec.slot
        self.workers = spec.workers
        self.link_dir = spec.link_dir
        self._secret = spec.secret
        self.census = Census(spec.census_fd, spec.workers, spec.slot)

    @property
    def prefix(self) -> str:
        return slot_prefix(self.slot)

    def link_path(self, slot: int) -> str:
        return os.path.join(self.link_dir, f"w{slot}.sock")

    def owner(self, name: str) -> int | None:
        """The slot a session id or grant names (`s2.…`, `g2.…`), None when it names none."""
        return slot_of(name, self.workers)

    def elsewhere(self, name: str) -> int | None:
        """The slot of another worker that ``name`` names; None for this one's or none."""
        slot = self.owner(name)
        return None if slot == self.slot else slot

    def others(self) -> list[int]:
        return [slot for slot in range(self.workers) if slot != self.slot]

    def link_hello(self, peer: Peer, principal: str | None) -> bytes:
        """A link's first bytes: the LinkHello's length (4 bytes, big-endian), then it."""
        body = msgspec.json.encode(LinkHello(
            secret=self._secret, transport=peer.transport, host=peer.host, uid=peer.uid,
            pid=peer.pid, principal=principal))
        return len(body).to_bytes(4, "big") + body

    def admit_link(self, line: bytes) -> LinkHello | None:
        """The link's hello when it carries the secret, else None."""
        try:
            hello = msgspec.json.decode(line, type=LinkHello)
        except msgspec.DecodeError:
            return None
        return hello if hmac.compare_digest(hello.secret, self._secret) else None

    async def receive_link_hello(self, sock: socket.socket) -> LinkHello | None:
        """A link's first bytes (`link_hello`), read to their last byte and no further: its
        hello when it carries the secret; None when it does not, is over LINK_HELLO_LIMIT,
        or the link closed first."""
        size = int.from_bytes(await _receive(sock, 4) or b"\xff" * 4, "big")
        return None if size > LINK_HELLO_LIMIT else self.admit_link(await _receive(sock, size))


async def _receive(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes of ``sock``; b"" when it closed first."""
    data = b""
    while len(data) < size:
        await anyio.wait_readable(sock)
        try:
            chunk = sock.recv(size - len(data))
        except BlockingIOError:
            continue
        except OSError:
            return b""
        if not chunk:
            return b""
        data += chunk
    return data
