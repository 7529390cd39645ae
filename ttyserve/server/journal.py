"""The session journal: fsync'd JSON lines, exactly one `session.end` per `session.start`.

A server that dies hard writes no end records; the next one to open the
journal appends a `crash-inferred` end for every start without one, and hangs
up what is left of those sessions (verified by the process's start time, so
a reused pid is never signalled). A torn last line is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import errno
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import anyio
import msgspec

from ..backends.cgroups import SERVER_LEAF, kill_tree, populated, remove_tree, server_gone
from ..backends.groups import group_alive, process_start_time, signal_group
from ..lines import write_all
from .lease import acquire

log = logging.getLogger("ttyserve")


class Reason(enum.StrEnum):
    """The `reason` of a `session.end` record (contracts.md)."""

    EXIT = "exit"
    CANCELLED = "cancelled"
    SPAWN_FAILED = "spawn_failed"
    SHUTDOWN = "shutdown"
    CRASH_INFERRED = "crash-inferred"
    ABANDONED = "abandoned"  # a detached session nobody reattached in time


# A record's target: the name, or None (null) on this host; UNSET (absent) only in a record
# of an older server, so this server writes it always.
Where = str | None | msgspec.UnsetType


class Record(msgspec.Struct, tag_field="event", omit_defaults=True, kw_only=True):
    """One line of the journal; `event` is the tag. Members we do not know are ignored.

    Only members that do not apply (None) are left out: every member the contracts name
    is written even with its usual value (a writer's attach says `"role": "writer"`), so
    such members default to None, which only a record of an older server reads as.
    Subclasses repeat ``kw_only=True``: without it msgspec writes their members
    before `id` and `at`, and the contract's order is `event`, `id`, `at`, ...
    """

    id: str
    at: str  # RFC 3339, UTC, milliseconds


class SessionStart(Record, tag="session.start", kw_only=True):
    """A session began (or its spawn failed: `pid` is then null)."""

    peer: str
    argv: list[str]
    pty: bool
    pid: int | None  # null when the spawn failed: always written
    start_time: int | None = None  # the process's start, clock ticks since boot
    cgroup: str | None = None  # the directory of its cgroup, where the server contains trees
    principal: str | None = None  # whom the session belongs to: a principal's name
    # (--principals), else `token` or `uid:N` (section 9); none in an older server's record
    target: Where = msgspec.UNSET  # section 15: the target it runs on, or null on this host


class SessionRefused(Record, tag="session.refused", kw_only=True):
    """An `open` refused for who asked or where (contracts.md, "One door to many hosts"):
    `id` is the one the session would have had."""

    code: str
    principal: str | None = None  # (as SessionStart's)
    target: Where = msgspec.UNSET


class SessionEnd(Record, tag="session.end", kw_only=True):
    """How a session ended: exactly one per start."""

    reason: str  # a Reason; read as text, so an end a newer server wrote still pairs up
    code: int | None = None
    signal: str | None = None
    error: str | None = None
    errno: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    leftovers: int | None = None  # processes of its cgroup killed after its process ended
    oom: bool | None = None  # its cgroup's memory limit killed one of its processes (None:
    # not contained)
    principal: str | None = None  # (as SessionStart's)
    target: Where = msgspec.UNSET


class SessionDetach(Record, tag="session.detach", kw_only=True):
    """A channel let go of a detachable session (section 9): the writer's (the session goes
    on without a client), or an observer's."""

    peer: str
    role: str | None = None  # section 11: WRITER or OBSERVER, or the HTTP API's STREAM or
    # INPUT (None: an older record's writer)
    grant: str | None = None  # the public id of the grant it was attached through
    reason: str | None = None  # `detached`'s: stolen, revoked, expired
    principal: str | None = None  # (as SessionStart's)
    target: Where = msgspec.UNSET


class SessionAttach(Record, tag="session.attach", kw_only=True):
    """A client attached to a detachable session, as writer or observer (section 11)."""

    peer: str
    role: str | None = None  # as SessionDetach's
    grant: str | None = None  # the public id of the grant it came with: never the grant
    principal: str | None = None  # (as SessionStart's)
    target: Where = msgspec.UNSET


class SessionShare(Record, tag="session.share", kw_only=True):
    """A grant was made for the session (section 11): its public id, never the grant."""

    peer: str
    grant: str
    role: str
    expires: str  # RFC 3339
    principal: str | None = None  # (as SessionStart's)
    target: Where = msgspec.UNSET


class SessionUnshare(Record, tag="session.unshare", kw_only=True):
    """A grant ended before its time (`unshare`), or at it (``reason`` expired)."""

    peer: str | None = None  # who revoked it (none when it expired)
    grant: str
    reason: str  # REVOKED or EXPIRED
    channels: int | None = None  # the channels attached through it, detached
    principal: str | None = None  # (as SessionStart's)
    target: Where = msgspec.UNSET


class ServerUpgrade(msgspec.Struct, tag="server.upgrade", tag_field="event", kw_only=True,
                    rename={"from_version": "from", "to_version": "to"}):
    """The server upgraded itself in place (section 12): its sessions went on."""

    at: str
    from_version: str
    to_version: str
    sessions: int  # the sessions kept


AnyRecord = (SessionStart | SessionEnd | SessionDetach | SessionAttach | SessionShare
             | SessionUnshare | ServerUpgrade)
_decoder = msgspec.json.Decoder(AnyRecord)
_encoder = msgspec.json.Encoder()


def rfc3339(when: float) -> str:
    """``when`` (seconds since the epoch) as RFC 3339, UTC, to the millisecond."""
    return datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def now_rfc3339() -> str:
    return rfc3339(time.time())


@dataclass
class ParsedJournal:
    records: list[AnyRecord]
    torn: int  # lines that did not parse (a crash mid-write leaves at most one)
    ends_with_newline: bool


def parse(data: bytes) -> ParsedJournal:
    """The records of a journal; a torn or unreadable line is counted and skipped."""
    records: list[AnyRecord] = []
    torn = 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            records.append(_decoder.decode(line))
        except msgspec.DecodeError:  # ValidationError included
            torn += 1
    return ParsedJournal(records, torn, not data or data.endswith(b"\n"))


def read_file(path: str) -> ParsedJournal:
    with open(path, "rb") as file:
        return parse(file.read())


def open_sessions(records: list[AnyRecord]) -> list[SessionStart]:
    """`session.start` records that have no `session.end`, in order."""
    ended = {r.id for r in records if isinstance(r, SessionEnd)}
    return [r for r in records if isinstance(r, SessionStart) and r.id not in ended]


def pair_sessions(records: list[AnyRecord],
                  ) -> Iterator[tuple[SessionStart, SessionEnd | None]]:
    """Every start with its end (None while it runs), in the order the sessions started."""
    ends = {r.id: r for r in records if isinstance(r, SessionEnd)}
    for record in records:
        if isinstance(record, SessionStart):
            yield record, ends.get(record.id)


class _Batch:
    """Records that go to disk together, with one fsync; who waits for them."""

    __slots__ = ("data", "done", "error")

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.done = anyio.Event()
        self.error: OSError | None = None


class OpenStarts:
    """The `session.start` records with no end yet, kept up to date by reading only what
    was appended since the last look: what a supervisor, whose workers append the records,
    needs when one of them dies, in memory bounded by the sessions open rather than by the
    journal (which it once read and parsed whole at every death)."""

    def __init__(self) -> None:
        self.offset = 0  # read up to here
        self._partial = b""  # a line whose end has not been appended yet
        self.open: dict[str, SessionStart] = {}

    def follow(self, fd: int) -> dict[str, SessionStart]:
        """Read what was appended to ``fd`` since the last call; the starts without an end."""
        while chunk := os.pread(fd, 1 << 20, self.offset):
            self.offset += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                self._take(line)
        return self.open

    def _take(self, line: bytes) -> None:
        try:
            record = _decoder.decode(line)
        except msgspec.DecodeError:  # a blank or torn line, as `parse` skips it
            return
        if isinstance(record, SessionStart):
            self.open[record.id] = record
        elif isinstance(record, SessionEnd):
            self.open.pop(record.id, None)


class Journal:
    """An open, locked journal file. Records are appended and fsync'd in batches: those
    appended while a write is under way go together in the next one (group commit)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._next: _Batch | None = None  # what the next write takes
        self._writing = False
        self._starts = OpenStarts()  # (a supervisor's: `crashed`)
        try:
            acquire(self.fd, f"journal {path}")
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def adopted(cls, fd: int, path: str) -> Journal:
        """The journal code before an upgrade in place had open (and locked: the lock is this
        process's, and holds while the descriptor is open)."""
        journal = cls.__new__(cls)
        journal.path, journal.fd = path, fd
        journal._next, journal._writing = None, False
        journal._starts = OpenStarts()
        os.set_inheritable(fd, False)
        return journal

    @property
    def idle(self) -> bool:
        """No write is under way or waiting."""
        return not self._writing and self._next is None

    now = staticmethod(now_rfc3339)

    supervisor: int | None = None  # a worker's (mesh.py): it writes only while that lives

    def _write(self, data: bytes) -> None:
        if self.supervisor is not None and os.getppid() != self.supervisor:
            # The server died (its supervisor killed): this worker dies as it would have
            # a moment later, writing nothing; the next server's recovery ends the records.
            os.kill(os.getpid(), signal.SIGKILL)
        write_all(self.fd, data)
        os.fsync(self.fd)

    async def append(self, *records: Record | ServerUpgrade) -> None:
        """Write ``records`` (in order, on one line each) and fsync them, off the event loop.

        Records appended while a write is under way wait for the next write, which takes
        them all: sessions opened together share one fsync. Raises OSError when the write
        failed (for every record of its batch)."""
        batch = self._next
        if batch is None:
            batch = self._next = _Batch()
        batch.data.extend(_encoder.encode(record) + b"\n" for record in records)
        if self._writing:  # the writer takes this batch next
            await batch.done.wait()
        else:
            self._writing = True
            try:
                while (current := self._next) is not None:
                    self._next = None
                    try:
                        await anyio.to_thread.run_sync(self._write, b"".join(current.data))
                    except OSError as exc:
                        current.error = exc
                    finally:
                        current.done.set()
            finally:
                self._writing = False
                left, self._next = self._next, None
                if left is not None:  # the writer was cancelled: nobody writes these now
                    left.error = OSError(errno.ECANCELED, "the journal write was cancelled")
                    left.done.set()
        if batch.error is not None:
            raise batch.error

    def _read_all(self) -> bytes:
        chunks = []
        offset = 0
        while chunk := os.pread(self.fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def _append_now(self, record: Record | ServerUpgrade) -> None:
        self._write(_encoder.encode(record) + b"\n")

    write_now = _append_now  # (on the loop: for the rare record of a process with no other)

    def crashed(self, prefix: str, contained: bool) -> list[int]:
        """A worker of this server died (`serve --workers`): a `crash-inferred` end for each
        start of its sessions (ids beginning with ``prefix``) that has none, written now;
        the process groups of those not ``contained`` (their cgroups killed) that are
        still theirs, to hang up."""
        survivors = []
        open_now = self._starts.follow(self.fd)
        for start in [s for s in open_now.values() if s.id.startswith(prefix)]:
            if not contained and _here(start) and start.pid is not None and start.pid > 0 and (
                    _still_ours(start.pid, start.start_time)):
                survivors.append(start.pid)
            self._append_now(SessionEnd(id=start.id, at=now_rfc3339(),
                                        reason=Reason.CRASH_INFERRED,
                                        principal=start.principal, target=start.target))
        return survivors

    def recover(self, grace: float = 1.0) -> list[SessionEnd]:
        """Close what a crashed server left open; return the `crash-inferred` ends written."""
        parsed = parse(self._read_all())
        if parsed.torn:
            log.warning("journal %s: skipped %d torn or unreadable line(s)", self.path,
                        parsed.torn)
        if not parsed.ends_with_newline:
            os.write(self.fd, b"\n")  # the next record starts on a line of its own
        ends = []
        survivors = []
        cgroups = orphaned_cgroups(parsed.records)
        for start in open_sessions(parsed.records):
            if start.cgroup is None and _here(start) and start.pid is not None and (
                    start.pid > 0 and _still_ours(start.pid, start.start_time)):
                survivors.append(start.pid)
            end = SessionEnd(id=start.id, at=now_rfc3339(), reason=Reason.CRASH_INFERRED,
                             principal=start.principal, target=start.target)
            self._append_now(end)
            ends.append(end)
        if ends or cgroups:
            log.warning("journal %s: %d session(s) ended by a crash; hanging up %d survivor(s)"
                        " and killing %d cgroup(s)", self.path, len(ends), len(survivors),
                        len(cgroups))
        hang_up_survivors(survivors, grace)
        _kill_cgroups(cgroups, grace)
        return ends

    def start_record(self, session_id: str, peer: str, argv: list[str], pty: bool,
                     pid: int | None, principal: str, cgroup: str | None = None,
                     target: str | None = None) -> SessionStart:
        """A session's `session.start` (with its process's start time, which tells the pid
        from its reuse after a crash, and its cgroup, which a crash's recovery kills)."""
        start_time = process_start_time(pid) if pid is not None and target is None else None
        return SessionStart(id=session_id, at=now_rfc3339(), peer=peer, argv=argv, pty=pty,
                            pid=pid, principal=principal, target=target,
                            start_time=start_time, cgroup=cgroup)

    def close(self) -> None:
        os.close(self.fd)


def _here(start: SessionStart) -> bool:
    """Whether the session ran on this host (a target's `pid` is the far side's)."""
    return not isinstance(start.target, str)


def _still_ours(pid: int, recorded_start: int | None) -> bool:
    """Whether process group ``pid`` can only be what the crashed session left.

    A live leader must have the recorded start time (else the pid was reused).
    With the leader gone, members that still carry its group id are its own:
    the id cannot be taken by a new group while any of them lives.
    """
    current = process_start_time(pid)
    return current == recorded_start if current is not None else group_alive(pid)


def orphaned_cgroups(records: list[AnyRecord]) -> list[str]:
    """The session cgroups that crashed servers of this journal left: in the directory of a
    server that is gone and that recorded sessions here, every session cgroup but those of
    sessions that ended (what `--leftovers leave` kept). So a process spawned just before the
    kill, whose start record never reached the disk, is found too: by its cgroup."""
    ended = {r.id for r in records if isinstance(r, SessionEnd)}
    servers = {os.path.dirname(r.cgroup) for r in records
               if isinstance(r, SessionStart) and r.cgroup is not None}
    found = []
    for server in sorted(servers):
        if not server_gone(server):
            continue
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(server)):
                path = os.path.join(server, name)
                if name not in ended and name != SERVER_LEAF and os.path.isdir(path):
                    found.append(path)
    return found


def _kill_cgroups(directories: list[str], grace: float) -> None:
    """Kill what crashed sessions left in their cgroups, and remove the cgroups once empty
    (one that is not, within ``grace``, is left for the next start)."""
    for directory in directories:
        try:
            kill_tree(directory)
        except OSError as exc:
            log.warning("cannot kill what a crashed session left in %s: %s", directory,
                        exc.strerror)
    deadline = time.monotonic() + grace
    for directory in directories:
        while populated(directory) and time.monotonic() < deadline:
            time.sleep(0.005)
        remove_tree(directory)


def hang_up_survivors(groups: list[int], grace: float) -> None:
    """SIGHUP the process groups of crashed sessions, SIGKILL what is left after ``grace``."""
    for group in groups:
        signal_group(group, signal.SIGHUP)
        signal_group(group, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline and any(group_alive(g) for g in groups):
        time.sleep(0.02)
    for group in groups:
        signal_group(group, signal.SIGKILL)
