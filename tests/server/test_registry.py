"""The session registry: attach admission and steal, and the sweeper, with no event loop;
open's admission and its journal record in process, on the memory backend."""

from __future__ import annotations

import base64
import re
import threading
from pathlib import Path

import anyio
import pytest
from backends.memory import open_memory_backend
from server.fakes import Wire, controls, exited, make_session

from ttyserve.errors import ErrorCode, RequestError
from ttyserve.ids import new_session_id
from ttyserve.protocol.messages import Attach, Exit, Open
from ttyserve.server.channels.attachment import Attachment
from ttyserve.server.journal import Journal, Reason, SessionStart, read_file
from ttyserve.server.registry.registry import SessionRegistry
from ttyserve.server.sessions.life import Phase
from ttyserve.server.sessions.session import ServerSession
from ttyserve.server.settings import ServerSettings


def registry(**settings: object) -> SessionRegistry:
    return SessionRegistry(ServerSettings(command=["sh"], **settings),  # type: ignore[arg-type]
                           backend=None)  # type: ignore[arg-type]


def registered(reg: SessionRegistry, session_id: str = "s1", owner: str = "uid:0",
               detachable: bool = True) -> ServerSession:
    session, _ = make_session(session_id=session_id, owner=owner, detachable=detachable)
    session.detached_timeout = reg.settings.detached_timeout  # as the registry opens it
    session.on_forget = reg.forget
    reg.sessions[session.id] = session
    return session


def refused(reg: SessionRegistry, request: Attach, owner: str = "uid:0",
            here: int = 0) -> str:
    with pytest.raises(RequestError) as info:
        reg.attach(request, owner, here)
    return str(info.value.code)


def test_a_session_id_is_unguessable_and_can_be_typed_as_an_argument() -> None:
    """128 random bits, URL-safe, and never a leading `-` (argparse would take
    `ttyserve attach -xyz` for an option): a random id begins with one in 64 times."""
    ids = [new_session_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_-]{21,}", i) for i in ids), ids
    assert all(len(base64.urlsafe_b64decode(i[1:] + "==")) >= 16 for i in ids)


def test_attach_to_what_is_not_yours_is_no_such_session_alike() -> None:
    reg = registry()
    registered(reg, "mine")
    registered(reg, "theirs", owner="uid:1000")
    registered(reg, "plain", detachable=False)
    for session_id in ("nosuch", "theirs", "plain"):
        assert refused(reg, Attach(session=session_id)) == ErrorCode.NO_SUCH_SESSION
    assert reg.attach(Attach(session="mine"), "uid:0", 0).id == "mine"


def test_a_session_attached_elsewhere_is_in_use_unless_stolen() -> None:
    reg = registry()
    session = registered(reg)
    wire = Wire()
    writer = wire.opened(session)
    assert refused(reg, Attach(session="s1")) == ErrorCode.SESSION_IN_USE
    assert session.sink is writer and not writer.released  # the refusal changed nothing
    assert reg.attach(Attach(session="s1", steal=True), "uid:0", 0) is session
    assert session.sink is None and writer.released
    assert controls(wire.frames(), writer.channel)[-1] == {"type": "detached",
                                                         "reason": "stolen"}


def test_attach_is_refused_while_shutting_down_and_beyond_a_connection_s_room() -> None:
    reg = registry(max_sessions_per_connection=2)
    registered(reg)
    assert refused(reg, Attach(session="s1"), here=2) == ErrorCode.BUSY
    reg.closing = True
    assert refused(reg, Attach(session="s1")) == ErrorCode.SHUTTING_DOWN


def test_the_sweeper_hangs_up_the_abandoned_and_drops_uncollected_exits() -> None:
    reg = registry(detached_timeout=10, keep_ended=3)
    abandoned = registered(reg, "abandoned")
    ended = registered(reg, "ended")
    waiting = registered(reg, "waiting")
    attached = registered(reg, "attached")
    short = registered(reg, "short")  # opened with detached_timeout 2
    delivered = registered(reg, "delivered")  # its exit went out at 108: kept 3 s more
    Wire().opened(attached)
    abandoned.detached_at = ended.detached_at = 100.0
    waiting.detached_at = 105.0
    short.detached_at, short.detached_timeout = 107.0, 2
    exited(ended, Exit(code=0))
    exited(delivered, Exit(code=0), delivered=True)
    delivered.detached_at = delivered.delivered_at = 108.0
    assert reg.sweep(now=110.0) == 111.0  # the next deadline: delivered's
    assert abandoned.life.reason is Reason.ABANDONED  # cancelled: killed and reaped, as `cancel`
    assert short.life.reason is Reason.ABANDONED  # by its own timeout, not the server's
    assert sorted(reg.sessions) == ["abandoned", "attached", "delivered", "short", "waiting"]
    assert waiting.life.reason is None and attached.life.reason is None
    assert reg.sweep(now=110.9) == 111.0  # nothing moves before its deadline
    assert reg.sweep(now=111.0) == 115.0 and "delivered" not in reg.sessions
    assert delivered.life.phase is ended.life.phase is Phase.GONE  # (ended: uncollected)
    # On its way out, the abandoned session is expired: an attach now would get no exit.
    assert refused(reg, Attach(session="abandoned")) == ErrorCode.NO_SUCH_SESSION


@pytest.mark.asyncio
@pytest.mark.timeout(10)
async def test_open_refuses_beyond_the_limits_and_while_shutting_down(tmp_path: Path) -> None:
    async with open_memory_backend() as backend:
        reg = SessionRegistry(ServerSettings(command=["true"], max_sessions=1,
                                             max_sessions_per_connection=1), backend)
        async with reg.running():
            with pytest.raises(RequestError) as info:
                await reg.open(Open(), "uid:0", "test", sessions_here=1)
            assert info.value.code == ErrorCode.BUSY and "connection" in info.value.message
            first = await reg.open(Open(argv=["sleep"]), "uid:0", "test", sessions_here=0)
            with pytest.raises(RequestError) as info:
                await reg.open(Open(), "uid:0", "test", sessions_here=0)
            assert info.value.code == ErrorCode.BUSY and "server" in info.value.message
            reg.hang_up_all()
            with pytest.raises(RequestError) as info:
                await reg.open(Open(), "uid:0", "test", sessions_here=0)
            assert info.value.code == ErrorCode.SHUTTING_DOWN
            reg.ends.start(first)
            with anyio.fail_after(5):
                await reg.ends.wait_empty()


@pytest.mark.asyncio
@pytest.mark.timeout(10)
async def test_an_open_held_by_its_start_record_counts_and_is_hung_up_by_a_shutdown(
        tmp_path: Path) -> None:
    """An open that awaits its start record (a slow disk, held here) counts against
    --max-sessions, and a shutdown that begins meanwhile hangs its process up too."""
    journal = Journal(str(tmp_path / "journal.jsonl"))
    write = journal._write
    held, release = anyio.Event(), threading.Event()

    def held_write(data: bytes) -> None:
        anyio.from_thread.run_sync(held.set)
        release.wait(5)
        write(data)

    journal._write = held_write  # type: ignore[method-assign]  # the same write, held
    try:
        async with open_memory_backend() as backend:
            reg = SessionRegistry(ServerSettings(command=["sleep"], max_sessions=1),
                                  backend, journal)
            async with reg.running(), anyio.create_task_group() as tg:
                opened: list[ServerSession] = []
                answered = anyio.Event()

                async def open_one() -> None:
                    opened.append(await reg.open(Open(), "uid:0", "test", sessions_here=0))
                    answered.set()

                tg.start_soon(open_one)
                await held.wait()
                with pytest.raises(RequestError) as info:
                    await reg.open(Open(), "uid:0", "test", sessions_here=0)
                assert info.value.code == ErrorCode.BUSY
                reg.hang_up_all()
                release.set()
                with anyio.fail_after(5):
                    await answered.wait()
                (session,) = opened
                assert session.life.reason is Reason.SHUTDOWN
                reg.ends.start(session)
                with anyio.fail_after(5):
                    await reg.ends.wait_empty()
                assert session.process.status is not None
                assert session.process.status.signal == "HUP"
    finally:
        release.set()
        journal.close()


@pytest.mark.asyncio
@pytest.mark.timeout(10)
async def test_an_open_admitted_during_the_kill_grace_is_killed_after_it(
        tmp_path: Path) -> None:
    """A shutdown's kill grace ends every session still running then, one that ignores
    SIGHUP and was admitted during the grace (its open held by its start record when the
    shutdown began) included: a process that ignores SIGHUP never holds the drain."""
    journal = Journal(str(tmp_path / "journal.jsonl"))
    write = journal._write
    held, release = anyio.Event(), threading.Event()

    def held_write(data: bytes) -> None:
        anyio.from_thread.run_sync(held.set)
        release.wait(5)
        write(data)

    journal._write = held_write  # type: ignore[method-assign]  # the same write, held
    try:
        async with open_memory_backend() as backend:
            reg = SessionRegistry(ServerSettings(command=["sleep", "HUP"]), backend, journal)
            async with reg.running(), anyio.create_task_group() as tg:
                opened: list[ServerSession] = []
                answered = anyio.Event()

                async def open_one() -> None:
                    opened.append(await reg.open(Open(), "uid:0", "test", sessions_here=0))
                    answered.set()

                tg.start_soon(open_one)
                await held.wait()
                reg.hang_up_all()  # (nothing admitted yet when the grace begins)
                release.set()
                with anyio.fail_after(5):
                    await answered.wait()
                reg.ends.start(opened[0])
                with anyio.fail_after(5):
                    await reg.ends.wait_empty()
                assert opened[0].process.status is not None
                assert opened[0].process.status.signal == "KILL"
    finally:
        release.set()
        journal.close()


@pytest.mark.asyncio
@pytest.mark.timeout(10)
async def test_the_start_record_is_on_disk_when_open_returns_and_shares_fsyncs(
        tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(str(path))
    writes: list[bytes] = []
    write = journal._write

    def counted(data: bytes) -> None:
        writes.append(data)
        write(data)

    journal._write = counted  # type: ignore[method-assign]  # the same write, counted
    try:
        async with open_memory_backend() as backend:
            reg = SessionRegistry(ServerSettings(command=["sleep"]), backend, journal)
            async with reg.running():
                sessions = []
                async with anyio.create_task_group() as tg:  # opened together: group commit

                    async def open_one() -> None:
                        session = await reg.open(Open(), "uid:0", "test", sessions_here=0)
                        starts = [r.id for r in read_file(str(path)).records
                                  if isinstance(r, SessionStart)]
                        assert session.id in starts  # before the caller could send `opened`
                        sessions.append(session)

                    for _ in range(5):
                        tg.start_soon(open_one)
                assert len(writes) == 2  # the first start alone, the other four in one fsync
                for session in sessions:
                    reg.ends.start(session)
                    session.cancel()
                with anyio.fail_after(5):
                    await reg.ends.wait_empty()
    finally:
        journal.close()
    ends = [r for r in read_file(str(path)).records if not isinstance(r, SessionStart)]
    assert sorted(e.id for e in ends) == sorted(s.id for s in sessions)


def test_an_ended_session_attached_again_is_kept_from_its_new_delivery() -> None:
    """Its exit went out at 100; a client came back at 140 and lost that link too, before the
    exit went out again: it is not forgotten at 100 + --keep-ended, it waits for its exit
    to be collected as any ended session does."""
    reg = registry(detached_timeout=600, keep_ended=60)
    ended = registered(reg, "ended")
    exited(ended, Exit(code=0), delivered=True)
    ended.delivered_at = ended.detached_at = 100.0
    wire = Wire()
    replaying = Attachment(wire, wire.open_channel(), ended)
    replaying.live = False  # attached again, the replay under way: no exit yet
    ended.attach(replaying)
    ended.detach()
    ended.detached_at = 150.0  # (that link lost at 150)
    assert reg.sweep(now=165.0) == 750.0 and "ended" in reg.sessions
