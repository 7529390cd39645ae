"""`serve --workers 2`: connections take turns between the workers, any connection reaches
any session (attach with offsets, observers, steal, list, share, grants, flow control across
the hop), the limits are the whole server's, and a worker killed with SIGKILL takes only its
own sessions and connections with it."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
from helpers import SH, RawPeer, ServerProcess, ctrl, raw_peer, split_output, start_server

from ttyserve.client import Connection, connect
from ttyserve.errors import RequestError, SessionDetached
from ttyserve.protocol.frames import Frame
from ttyserve.protocol.messages import Hello, Offsets, Open, Window
from ttyserve.server.journal import SessionEnd, SessionStart, read_file
from ttyserve.server.mesh import LINK_HELLO_LIMIT, LinkHello

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
WINDOW = 65536


@pytest.fixture
def served(short_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(short_dir, "--workers=2", "--command", SH, "--max-sessions", "6",
                          "--journal", str(short_dir / "j.jsonl"))
    try:
        yield server
    finally:
        server.stop()


async def worker_of(conn: Connection) -> int:
    """The worker that serves ``conn``: the parent of a session it starts."""
    probe = await conn.spawn([SH, "-c", "echo $PPID"], pty=False)
    said = b"".join([chunk.data async for chunk in probe])
    await probe.wait()
    return int(said)


@asynccontextmanager
async def on_worker(address: str, worker: int | None, avoid: int | None = None,
                    **options: object) -> AsyncIterator[tuple[Connection, int]]:
    """A connection served by ``worker`` (or by any but ``avoid``), found as the client sees
    it: the parent of a session it starts. Connections take turns, so one of two does."""
    for _ in range(8):
        async with connect(address, multiplex=True, **options) as conn:  # type: ignore[arg-type]
            here = await worker_of(conn)
            if here == worker or (worker is None and here != avoid):
                yield conn, here
                return
    raise AssertionError(f"no connection reached worker {worker or f'other than {avoid}'}")


async def test_connections_take_turns_between_the_workers(served: ServerProcess) -> None:
    parents = []
    for _ in range(4):
        async with connect(served.addresses[0], multiplex=True) as conn:
            parents.append(await worker_of(conn))
    assert len(set(parents)) == 2 and parents[0] == parents[2] and parents[1] == parents[3]
    assert set(parents) == set(served.worker_pids())


async def test_a_session_is_reached_from_the_other_worker_at_its_offsets(
        served: ServerProcess) -> None:
    address = served.addresses[0]
    async with on_worker(address, None) as (conn, home):
        session = await conn.spawn([SH, "-c", "seq 1 1000; read line; echo got $line"],
                                   pty=False, detachable=True)
        first = await session.receive()
        assert first is not None
        await session.detach()
    assert session.id is not None and session.id.startswith("s")
    async with on_worker(address, None, avoid=home) as (conn, _):
        listed = [info.session for info in await conn.list_sessions()]
        assert session.id in listed  # gathered from the worker that runs it
        again = await conn.attach(session.id, offsets=Offsets(stdout=len(first.data)))
        assert again.offsets.stdout == len(first.data)
        await again.send(b"hello\n")
        rest = b"".join([chunk.data async for chunk in again])
        assert (await again.wait()).code == 0
    expected = b"".join(b"%d\n" % n for n in range(1, 1001)) + b"got hello\n"
    assert first.data + rest == expected


async def test_observers_steal_and_grants_work_across_workers(served: ServerProcess) -> None:
    address = served.addresses[0]
    async with on_worker(address, None) as (owner, home):
        session = await owner.spawn(["cat"], pty=False, detachable=True)
        assert session.id is not None
        async with on_worker(address, None, avoid=home) as (other, _):
            watcher = await other.attach(session.id, role="observer")
            shared = await other.share(session.id, role="observer", ttl=60)
            assert shared.grant.startswith("g")
            await session.send(b"seen by all\n")
            chunk = await watcher.receive()
            assert chunk is not None and chunk.data == b"seen by all\n"
            thief = await other.attach(session.id, steal=True)
            with pytest.raises(SessionDetached) as stolen:
                while await session.receive() is not None:
                    continue
            assert stolen.value.reason == "stolen"
            await thief.send(b"now mine\n")
            got = await watcher.receive()
            assert got is not None and got.data == b"now mine\n"
            for _ in range(2):  # the grant admits on either worker (they take turns)
                async with connect(address, multiplex=True, grant=shared.grant) as guest:
                    seen = await guest.attach(session.id, role="observer")
                    await thief.send(b"guest\n")
                    replay = b""
                    while not replay.endswith(b"guest\n"):  # the scrollback, then it
                        chunk = await seen.receive()
                        assert chunk is not None
                        replay += chunk.data
            await thief.eof()
            assert (await thief.wait()).code == 0


async def test_credit_holds_across_the_hop(served: ServerProcess) -> None:
    """A windowed client attached through another worker gets no more than its window."""
    address = served.addresses[0]
    async with on_worker(address, None) as (conn, home):
        session = await conn.spawn(["yes"], pty=False, detachable=True)
        assert session.id is not None
        await session.detach()
    for _ in range(8):  # a raw connection served by the other worker: found by a probe
        async with raw_peer(address) as peer:
            await peer.send(ctrl(0, Hello(protocol=1, multiplex=True, window=WINDOW))
                            + ctrl(2, Open(argv=[SH, "-c", "echo $PPID"], pty=False)))
            probe: list[Frame] = []
            while not any(c.get("type") == "exit" for c in split_output(probe, 2)[2]):
                frame = await peer.next_frame()
                assert frame is not None
                probe.append(frame)
            if int(split_output(probe, 2)[0]) != home:
                await credit_across_a_hop(peer, session.id)
                return
    raise AssertionError("no raw connection reached the other worker")


async def credit_across_a_hop(peer: RawPeer, session_id: str) -> None:
    """Attach ``session_id`` (a `yes`) through a hop: no more than the window comes, then
    no more than the window granted again."""
    await peer.send(ctrl(1, {"type": "attach", "session": session_id}))
    frames = []
    with anyio.move_on_after(1):
        while (frame := await peer.next_frame()) is not None:
            frames.append(frame)
    assert 0 < len(split_output(frames, 1)[0]) <= WINDOW
    await peer.send(ctrl(1, Window(bytes=WINDOW)))
    with anyio.move_on_after(1):
        while (frame := await peer.next_frame()) is not None:
            frames.append(frame)
    assert WINDOW < len(split_output(frames, 1)[0]) <= 2 * WINDOW
    await peer.send(ctrl(1, {"type": "cancel"}))


async def test_max_sessions_is_the_whole_servers(served: ServerProcess) -> None:
    address = served.addresses[0]
    async with connect(address, multiplex=True) as first, \
            connect(address, multiplex=True) as second:
        assert {await worker_of(first), await worker_of(second)} == set(served.worker_pids())
        sessions = [await conn.spawn(["sleep", "30"], pty=False)
                    for conn in (first, second, first, second, first, second)]
        for conn in (first, second):
            with pytest.raises(RequestError) as refused:
                await conn.spawn(["true"], pty=False)
            assert refused.value.code == "busy"
        for session in sessions[0::2]:  # the first worker's end: the other learns of it
            await session.cancel()
        with anyio.fail_after(10):
            while True:  # (their ends are written in the background: no event says so)
                try:
                    again = await second.spawn(["true"], pty=False)
                    break
                except RequestError as exc:
                    assert exc.code == "busy"
                    await anyio.sleep(0.05)
        assert (await again.wait()).code == 0
        for session in sessions[1::2]:
            await session.cancel()


async def test_one_idempotency_key_starts_one_session_in_the_whole_server(
        served: ServerProcess) -> None:
    """A key has one owner for the whole server: a second open with it on the other worker
    is refused while the first session is known (a retry never runs the command twice),
    and the key is free again, on either worker, once that session is forgotten."""
    address = served.addresses[0]
    async with on_worker(address, None) as (first, home), \
            on_worker(address, None, avoid=home) as (second, _):
        session = await first.spawn(["sleep", "30"], pty=False, detachable=True,
                                     idempotency_key="job-1")
        with pytest.raises(RequestError) as refused:
            await second.spawn(["sleep", "30"], pty=False, detachable=True,
                               idempotency_key="job-1")
        assert refused.value.code == "session_in_use"
        await session.cancel()
        with anyio.fail_after(10):
            while True:  # (the cancel's end is written in the background: no event says so)
                try:
                    again = await second.spawn(["true"], pty=False, detachable=True,
                                                 idempotency_key="job-1")
                    break
                except RequestError as exc:
                    assert exc.code == "session_in_use"
                    await anyio.sleep(0.05)
        assert again.id != session.id


async def test_a_key_whose_open_failed_is_free_again(served: ServerProcess) -> None:
    """An open that fails (here its spawn) lets its key go: a retry is refused for what is
    wrong with it, never for the key of a session that never began."""
    async with connect(served.addresses[0], multiplex=True) as conn:
        for _ in range(2):
            with pytest.raises(RequestError) as refused:
                await conn.spawn(["/nonexistent/command"], pty=False, detachable=True,
                                 idempotency_key="failed")
            assert refused.value.code == "spawn_failed"


async def test_an_idempotency_key_stays_the_whole_servers_across_an_upgrade(
        served: ServerProcess) -> None:
    """The upgrade's execve lets the worker's record locks go: its new code claims its
    sessions' keys again, so the other worker still refuses a second open with one."""
    address = served.addresses[0]
    async with on_worker(address, None) as (conn, home):
        session = await conn.spawn(["sleep", "30"], pty=False, detachable=True,
                                   idempotency_key="kept")
        await session.detach()
    served.proc.send_signal(signal.SIGUSR2)
    with anyio.fail_after(30):
        while served.stderr_tail().count("upgraded:") < 2:  # (a log line: no event)
            await anyio.sleep(0.05)
    async with on_worker(address, None, avoid=home) as (other, _):
        with pytest.raises(RequestError) as refused:
            await other.spawn(["sleep", "30"], pty=False, detachable=True,
                              idempotency_key="kept")
        assert refused.value.code == "session_in_use"
        await (await other.attach(session.id or "", steal=True)).cancel()


def _ends(journal: Path) -> dict[str, SessionEnd]:
    return {r.id: r for r in read_file(str(journal)).records if isinstance(r, SessionEnd)}


async def test_a_worker_killed_takes_only_its_own(short_dir: Path) -> None:
    """SIGKILL one worker: the other's session goes on with no byte lost; the dead one's
    trees (a setsid escapee too) are gone within 2 s; their ends are crash-inferred and
    written at once; a client attached to one of them from the other worker gets exit -1
    with an error; a replacement serves; one end per start."""
    journal = short_dir / "j.jsonl"
    server = start_server(short_dir, "--workers=2", "--command", SH, "--journal", str(journal))
    try:
        address = server.addresses[0]
        async with on_worker(address, None) as (victim_conn, victim):
            doomed = await victim_conn.spawn(
                [SH, "-c", "setsid sleep 300 & echo $!; exec sleep 300"], pty=False)
            escapee = int((await doomed.receive()).data)  # type: ignore[union-attr]
            remote = await victim_conn.spawn(["sleep", "300"], pty=False, detachable=True)
            assert remote.id is not None
            await remote.detach()
            async with on_worker(address, None, avoid=victim) as (survivor_conn, _):
                kept = await survivor_conn.spawn(
                    [SH, "-c", "read go; seq 1 100000"], pty=False)
                watched = await survivor_conn.attach(remote.id)
                os.kill(victim, signal.SIGKILL)
                killed = time.monotonic()
                exit_ = await watched.wait()
                assert exit_.code == -1 and exit_.error
                await kept.send(b"go\n")
                out = b"".join([chunk.data async for chunk in kept])
                assert out == b"".join(b"%d\n" % n for n in range(1, 100001))
                assert (await kept.wait()).code == 0
                while os.path.exists(f"/proc/{escapee}") and (
                        Path(f"/proc/{escapee}/stat").read_text().split()[2] != "Z"):
                    assert time.monotonic() - killed < 2, "the setsid escapee outlived 2 s"
                    await anyio.sleep(0.02)
                ends = _ends(journal)
                assert ends[remote.id].reason == "crash-inferred"
                assert sum(e.reason == "crash-inferred" for e in ends.values()) == 2
                assert time.monotonic() - killed < 2
        replaced = set(server.worker_pids())
        deadline = time.monotonic() + 5
        while victim in replaced or len(replaced) < 2:
            assert time.monotonic() < deadline, "no replacement worker"
            await anyio.sleep(0.05)
            replaced = set(server.worker_pids())
        for _ in range(2):  # each worker in turn, the replacement among them
            async with connect(address, multiplex=True) as conn:
                assert await worker_of(conn) in replaced
    finally:
        assert server.stop() == 0
    records = read_file(str(journal)).records
    starts = [r.id for r in records if isinstance(r, SessionStart)]
    ends = [r.id for r in records if isinstance(r, SessionEnd)]
    assert sorted(starts) == sorted(ends) and len(ends) == len(set(ends))


async def test_signals_to_a_worker_are_ignored_the_supervisor_takes_them(
        served: ServerProcess) -> None:
    worker = served.worker_pids()[0]
    os.kill(worker, signal.SIGTERM)
    async with connect(served.addresses[0], multiplex=True) as conn:
        for _ in range(2):
            session = await conn.spawn(["true"], pty=False)
            await session.wait()
    assert worker in served.worker_pids()
    assert "signals go to the supervisor" in served.stderr_tail()


async def test_a_link_without_the_servers_secret_is_closed_unanswered(short_dir: Path) -> None:
    """A worker's link socket serves only its own server's workers: a LinkHello with
    another secret, or a length over LINK_HELLO_LIMIT (nothing more is read), is closed
    with no answer to the `hello` behind it, and said on stderr; the server goes on."""
    server = start_server(short_dir, "--workers=2", "--command", SH,  # (a link that read
                          "--handshake-timeout", "60",  # on would wait far past our recv's)
                          env={"TMPDIR": str(short_dir)})
    try:
        link = next(short_dir.glob("ttyserve-links-*/w1.sock"))
        guess = msgspec.json.encode(LinkHello(secret="a guess", transport="unix", uid=0,
                                              principal=f"uid:{os.getuid()}"))
        for first in (len(guess).to_bytes(4, "big") + guess,
                      (LINK_HELLO_LIMIT + 1).to_bytes(4, "big") + b"{" * 64):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(link))
                sock.sendall(first + ctrl(0, Hello(protocol=1)))
                try:
                    answer = sock.recv(4096)
                except ConnectionResetError:  # (closed with our bytes unread)
                    answer = b""
                assert answer == b""  # no `welcome`: closed unanswered
        deadline = time.monotonic() + 10
        while server.stderr_tail().count("without this server's secret") < 2:
            assert time.monotonic() < deadline, server.stderr_tail()  # (a log line: no
            await anyio.sleep(0.05)  # event tells a client)
        assert server.proc.poll() is None
    finally:
        server.stop()
