"""Protocol section 9 over real sockets: detachable sessions, the ring, contention, timeouts,
`list`, principals, and the journal's records of it all."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import pytest
from helpers import (
    HELLO,
    SH,
    ServerProcess,
    ctrl,
    processes_in_group,
    raw_peer,
    reattached,
    split_output,
    start_server,
    wait_until,
)

from ttyserve.client import Connection, Session, connect
from ttyserve.defaults import STDIN_LIMIT
from ttyserve.errors import LocalProtocolError, RequestError, SessionDetached
from ttyserve.protocol.messages import Attach, Detach, Offsets, Open, SessionInfo
from ttyserve.server.journal import SessionAttach, SessionDetach, SessionEnd, read_file
from ttyserve.transport.streams import SocketTransport

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
COUNTER = "i=0; while :; do echo $i; i=$((i+1)); sleep 0.05; done"
TOKEN = "detach-token"
SHORT_TIMEOUT = 2  # --detached-timeout of the tests of the timeout (indirect parameter)


@pytest.fixture(params=["600"])
def server(short_dir: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A server of detachable sessions; tests of the timeout set it to 2 s (indirect)."""
    token = short_dir / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    process = start_server(short_dir, "--command", SH, "--scrollback", "4096",
                           "--detached-timeout", request.param,
                           "--journal", str(short_dir / "j.jsonl"),
                           "--token-file", str(token),
                           listen=[f"unix:{short_dir / 's.sock'}", "tcp:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def address(server: ServerProcess) -> str:
    return server.addresses[0]


async def lines_until(session: Session, done: Callable[[list[int]], bool]) -> list[int]:
    """The counter's numbers as they come, until ``done`` says enough."""
    text = b""
    numbers: list[int] = []
    while not done(numbers):
        chunk = await session.receive()
        assert chunk is not None, "the session ended"
        text += chunk.data
        *whole, text = text.split(b"\n")
        numbers += [int(n) for n in whole]
    return numbers


def consecutive(numbers: list[int]) -> bool:
    return numbers == list(range(numbers[0], numbers[0] + len(numbers)))


async def listing(address: str) -> list[SessionInfo]:
    async with connect(address, multiplex=True) as conn:
        return await conn.list_sessions()


async def until_listed(address: str, predicate: Callable[[list[SessionInfo]], bool],
                       timeout: float = 10) -> list[SessionInfo]:
    """Poll `list` (a detached session tells nobody when it changes: that is the point)."""
    with anyio.fail_after(timeout):
        while not predicate(sessions := await listing(address)):
            await anyio.sleep(0.05)
        return sessions


@pytest.fixture
async def opened(address: str) -> AsyncIterator[tuple[Connection, Session]]:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", COUNTER], pty=False, detachable=True)
        yield conn, session


async def test_replay_then_live_with_no_gap_and_no_duplicate(address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", COUNTER], pty=False, detachable=True)
        assert session.id is not None and len(session.id) >= 22  # 128 random bits
        first = await lines_until(session, lambda n: len(n) >= 5)
        await session.detach()
        with pytest.raises(SessionDetached):
            while True:  # output that came before `detached`, then the end of the channel
                chunk = await session.receive()
                assert chunk is not None
                first += [int(n) for n in chunk.data.split()]
    assert consecutive(first) and first[0] == 0
    previous = first
    for _ in range(3):  # the cycle again through new connections; the last one just drops
        await anyio.sleep(0.3)  # the process prints into the ring meanwhile: nobody listens
        async with connect(address, multiplex=True) as conn:
            again = await conn.attach(session.id)
            assert again.pid == session.pid and again.dropped == 0
            wanted = len(previous) + 8
            seen = await lines_until(again, lambda n, wanted=wanted: len(n) > wanted)
        # The ring (all of the output so far, here) comes first, then live output: one
        # consecutive count from 0, past everything the previous attachment saw.
        assert consecutive(seen) and seen[0] == 0 and seen[:len(previous)] == previous, seen
        previous = seen
    async with connect(address) as conn:
        last = await conn.attach(session.id)
        await last.cancel()


async def test_the_ring_keeps_the_newest_output_and_counts_what_it_dropped(
        address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", "read go; seq 1 20000; exit 3"], pty=False,
                                   detachable=True)
        await session.send(b"go\n")
        await session.detach()
    sessions = await until_listed(address, lambda s: bool(s) and s[0].exit is not None)
    assert sessions[0].exit == {"code": 3} and sessions[0].attached is False
    full = b"".join(b"%d\n" % n for n in range(1, 20001))
    async with connect(address) as conn:
        again = await conn.attach(sessions[0].session)
        replay = b"".join([chunk.data async for chunk in again])
        assert again.status is not None and again.status.code == 3  # delivered after the ring
    assert len(replay) <= 4096 and full.endswith(replay) and len(replay) > 3000
    assert again.dropped == len(full) - len(replay)
    assert again.offsets == Offsets(stdout=len(full))  # (it began at len(full) - len(replay))
    # Kept --keep-ended (section 10): a single-session connection closes after the exit, so
    # its client could not release it; attached again where it stopped, only the exit comes.
    async with connect(address, multiplex=True) as conn:
        tail = await conn.attach(sessions[0].session, offsets=again.offsets)
        assert [chunk async for chunk in tail] == [] and tail.offsets == again.offsets
        assert tail.status == again.status
        # ...and this client released it on reading the exit: it is gone.
        with pytest.raises(RequestError) as info:
            await conn.attach(sessions[0].session)
        assert info.value.code == "no_such_session"


async def test_session_in_use_steal_and_no_such_session(address: str) -> None:
    async with connect(address, multiplex=True) as first:
        session = await first.spawn([SH, "-c", COUNTER], pty=False, detachable=True)
        async with connect(address, multiplex=True) as second:
            with pytest.raises(RequestError) as info:
                await second.attach(session.id or "")
            assert (info.value.code, info.value.retriable) == ("session_in_use", False)
            stolen = await second.attach(session.id or "", steal=True)
            with pytest.raises(SessionDetached) as detached:
                while (chunk := await session.receive()) is not None:
                    assert chunk.data  # the counter's lines, until it is taken
            assert detached.value.reason == "stolen"
            assert consecutive(await lines_until(stolen, lambda n: len(n) >= 3))
            for unknown in ("nope", "x" * 22):
                with pytest.raises(RequestError) as info:
                    await second.attach(unknown)
                assert info.value.code == "no_such_session"
            await stolen.cancel()


async def test_a_stolen_channel_ends_with_detached_on_the_wire(address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", COUNTER], pty=False, detachable=True)
        session_id = session.id or ""
        await session.detach()
    async with raw_peer(address) as first, raw_peer(address) as second:
        await first.send(HELLO + ctrl(1, Attach(session=session_id)))
        assert (await first.next_control())["type"] == "welcome"
        assert (await first.next_control())["type"] == "attached"
        await second.send(HELLO + ctrl(1, Attach(session=session_id, steal=True)))
        frames = await first.frames_until_eof()  # single-session: closed after `detached`
        assert split_output(frames, 1)[2][-1] == {"type": "detached", "reason": "stolen"}
        await second.send(ctrl(1, {"type": "cancel"}))


async def test_an_exit_while_detached_is_delivered_once(
        server: ServerProcess, address: str, short_dir: Path) -> None:
    gate = short_dir / "gate"
    os.mkfifo(gate)
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", f"read go; read x < {gate}; echo bye; exit 7"],
                                   pty=True, detachable=True)
        await session.detach()
    async with connect(address, multiplex=True) as conn:
        again = await conn.attach(session.id or "")
        await again.send(b"go\n")
        await again.detach()
    await until_listed(address, lambda s: bool(s) and not s[0].attached)  # (detach is a send)
    await anyio.to_thread.run_sync(gate.write_text, "\n")  # it ends while nobody is attached
    await until_listed(address, lambda s: bool(s) and s[0].exit is not None)
    async with connect(address, multiplex=True) as conn:
        last = await conn.attach(session.id or "")
        output = b"".join([chunk.data async for chunk in last])
        assert last.status is not None and last.status.code == 7
        assert b"bye" in output
        with pytest.raises(RequestError):
            await conn.attach(session.id or "")
    assert await listing(address) == []
    server.stop()
    records = [type(r).__name__ for r in read_file(str(short_dir / "j.jsonl")).records
               if getattr(r, "id", None) == session.id]
    # The attach that collected the exit is the session's last record: it left nothing
    # attached for the connection's close to detach.
    assert records == ["SessionStart", "SessionDetach", "SessionAttach", "SessionDetach",
                       "SessionEnd", "SessionAttach"]


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "later"])
async def test_a_connection_its_last_channel_closed_reads_the_client_until_its_eof(
        address: str, batched: bool) -> None:
    """After the last frame of a single-session connection (here `detached`) the server
    sends its EOF and reads what the client still sends until the client's EOF: closing
    on unread bytes resets the connection, and a reset can destroy frames the client has
    not read yet. The detach comes with the open (read by the reader task, as a rule) or
    after `opened` (read by the socket's readiness callback)."""
    detach = ctrl(1, Detach())
    async with raw_peer(address) as peer:
        await peer.send(HELLO + ctrl(1, Open(argv=["sleep", "30"], pty=False,
                                             detachable=True)) + (detach if batched else b""))
        assert (await peer.next_control())["type"] == "welcome"
        assert (await peer.next_control())["type"] == "opened"
        if not batched:
            await peer.send(detach)
        assert (await peer.next_control())["type"] == "detached"
        assert await peer.next_frame() is None  # the server's EOF
        await peer.send(bytes(1 << 20))  # more than a socket buffers: only a reader takes it
        await peer.transport.send_eof()


async def assert_abandoned(address: str, server: ServerProcess, short_dir: Path,
                           session_id: str, pid: int, detached_at: float) -> list[object]:
    """The detached session expired on time (section 9: within a second of its deadline;
    one more for the listing's polling), its processes were hung up, and its journal end
    says `abandoned`; the session's journal records, once the server has stopped."""
    await until_listed(address, lambda s: s == [], timeout=10)
    assert SHORT_TIMEOUT - 0.5 < anyio.current_time() - detached_at < SHORT_TIMEOUT + 2
    assert await wait_until(lambda: processes_in_group(pid) == [], timeout=5)
    server.stop()
    records = [r for r in read_file(str(short_dir / "j.jsonl")).records
               if getattr(r, "id", None) == session_id]
    assert [r.reason for r in records if isinstance(r, SessionEnd)] == ["abandoned"]
    return records


@pytest.mark.parametrize("server", [str(SHORT_TIMEOUT)], indirect=True)
async def test_detached_timeout_hangs_up_and_the_journal_says_abandoned(
        server: ServerProcess, address: str, short_dir: Path) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sleep", "30"], pty=False, detachable=True)
        await session.detach()
    detached_at = anyio.current_time()
    assert session.id is not None and session.pid is not None
    records = await assert_abandoned(address, server, short_dir, session.id, session.pid,
                                     detached_at)
    assert [type(r) for r in records
            if isinstance(r, SessionDetach | SessionAttach)] == [SessionDetach]


@pytest.mark.parametrize("server", [str(SHORT_TIMEOUT)], indirect=True)
async def test_a_detach_whose_answer_cannot_be_sent_still_counts(
        server: ServerProcess, address: str, short_dir: Path) -> None:
    """A client that asks to detach and hangs up at once: `detached` cannot be sent, and
    that ends the connection; the session is detached all the same, noted in the journal,
    and hung up after the detached timeout like any other (it once waited forever)."""
    async with raw_peer(address) as peer:
        await peer.send(HELLO + ctrl(1, Open(argv=["sleep", "30"], pty=False,
                                             detachable=True)))
        assert (await peer.next_control())["type"] == "welcome"
        opened = await peer.next_control()
        assert opened["type"] == "opened"
        assert isinstance(peer.transport, SocketTransport)
        peer.transport.sock.shutdown(socket.SHUT_RD)  # the server's next send fails: EPIPE
        await peer.send(ctrl(1, Detach()))
    detached_at = anyio.current_time()
    records = await assert_abandoned(address, server, short_dir, opened["session"],
                                     opened["pid"], detached_at)
    assert [type(r) for r in records
            if isinstance(r, SessionDetach | SessionEnd)] == [SessionDetach, SessionEnd]


@pytest.mark.parametrize("server", [str(SHORT_TIMEOUT)], indirect=True)
async def test_an_uncollected_exit_expires_too(address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sleep", "30"], pty=False, detachable=True)
        await session.detach()
        assert session.pid is not None
    # (`detach` only sends: until the server has read it, the exit would go to this client)
    await until_listed(address, lambda s: bool(s) and not s[0].attached)
    os.kill(session.pid, signal.SIGTERM)  # it ends detached: its exit waits for an attach
    await until_listed(address, lambda s: bool(s) and s[0].exit is not None)
    await until_listed(address, lambda s: s == [], timeout=10)
    async with connect(address) as conn:
        with pytest.raises(RequestError):
            await conn.attach(session.id or "")


async def test_list_describes_each_session(address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", COUNTER], pty=True, detachable=True)
        plain = await conn.spawn(["sleep", "30"], pty=False)  # not detachable: not listed
        (info,) = await conn.list_sessions()
        assert (info.session, info.pid, info.pty, info.attached, info.exit) == (
            session.id, session.pid, True, True, None)
        assert info.argv == [SH, "-c", COUNTER]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", info.started)
        await session.detach()
        (info,) = await conn.list_sessions()
        assert info.attached is False
        await plain.cancel()
        again = await conn.attach(info.session)
        await again.cancel()


async def test_principals_do_not_see_each_others_sessions(server: ServerProcess) -> None:
    unix, tcp = server.addresses
    async with connect(tcp, token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(["sleep", "30"], pty=False, detachable=True)
        await session.detach()
        async with connect(unix, multiplex=True) as other:  # uid 0 is not special
            assert await other.list_sessions() == []
            with pytest.raises(RequestError) as info:
                await other.attach(session.id or "")
            assert info.value.code == "no_such_session"
        assert [s.session for s in await conn.list_sessions()] == [session.id]
        again = await conn.attach(session.id or "")
        await again.cancel()


async def test_a_plain_session_is_still_cancelled_when_its_connection_ends(
        address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sleep", "30"], pty=False)
        with pytest.raises(LocalProtocolError):  # the library knows: it was not detachable
            await session.detach()
    assert await wait_until(lambda: processes_in_group(session.pid or 0) == [], timeout=5)


async def test_detach_of_a_plain_session_is_refused_and_it_goes_on(address: str) -> None:
    async with raw_peer(address) as peer:
        await peer.send(HELLO + ctrl(1, Open(argv=[SH, "-c", "read x; echo still-$x"],
                                             pty=False))
                        + ctrl(1, {"type": "detach"}))
        assert (await peer.next_control())["type"] == "welcome"
        assert (await peer.next_control())["type"] == "opened"
        refusal = await peer.next_control()
        assert (refusal["type"], refusal["code"]) == ("error", "bad_request")
        await peer.send(b"\x00\x00\x00\x00\x01\x00\x00\x00\x05here\n")  # STDIN "here\n"
        frames = await peer.frames_until_eof()
    assert split_output(frames, 1)[0] == b"still-here\n"


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_100_detached_sessions_of_4_mb_each_hold_no_more_than_their_rings(
        short_dir: Path) -> None:
    count, size = 100, 4_000_000  # each prints four rings' worth with nobody attached
    server = start_server(short_dir, "--command", SH, "--max-sessions-per-connection", "256")
    try:
        baseline = server.rss_kib()
        async with connect(server.addresses[0], multiplex=True) as conn:
            detached = 0
            for _ in range(count):
                session = await conn.spawn(["head", "-c", str(size), "/dev/zero"],
                                           pty=False, detachable=True)
                await session.detach()
                try:
                    async for chunk in session:  # what came before `detached`
                        assert chunk.data == bytes(len(chunk.data))
                except SessionDetached:
                    detached += 1
                # else it ended before the detach was read: its exit came, it is gone
            assert detached > count // 2
            sessions = await until_listed(
                server.addresses[0], lambda s: len(s) == detached and all(i.exit for i in s),
                timeout=150)
            held = server.rss_kib() - baseline
            print(f"{count} detached sessions x {size} B: server RSS {baseline} KiB before, "
                  f"+{held} KiB after ({held / count:.0f} KiB per session, ring 1024 KiB)")
            assert all(i.exit == {"code": 0} for i in sessions)
            assert held < detached * (1024 + 128), held  # the ring plus a small constant each
            again = await conn.attach(sessions[0].session)
            replay = b"".join([chunk.data async for chunk in again])
            assert replay == bytes(len(replay)) and again.dropped == size - len(replay)
    finally:
        server.stop()


async def test_a_graceful_shutdown_hangs_up_detached_sessions_and_records_them(
        server: ServerProcess, address: str, short_dir: Path) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sleep", "30"], pty=True, detachable=True)
        await session.detach()
    assert server.stop() == 0  # drained: the detached session was hung up, not waited for
    ends = [r for r in read_file(str(short_dir / "j.jsonl")).records
            if isinstance(r, SessionEnd) and r.id == session.id]
    assert [(e.reason, e.code, e.signal) for e in ends] == [("shutdown", -1, "HUP")]
    assert processes_in_group(session.pid or 0) == []


async def test_a_steal_frees_the_session_from_a_client_that_stopped_reading(
        address: str) -> None:
    async with raw_peer(address) as stalled:  # reads nothing after the first frames
        stalled.transport.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # type: ignore[attr-defined]
        await stalled.send(HELLO + ctrl(1, Open(argv=["yes", "x" * 100], pty=False,
                                                detachable=True)))
        assert (await stalled.next_control())["type"] == "welcome"
        opened = await stalled.next_control()
        async with connect(address, multiplex=True) as conn:
            taken = await conn.attach(str(opened["session"]), steal=True)
            received = 0
            with anyio.fail_after(20):
                while received < (8 << 20):  # far beyond the ring: live output flows again
                    chunk = await taken.receive()
                    assert chunk is not None
                    received += len(chunk.data)
            await taken.cancel()


async def test_a_single_session_attach_to_an_ended_session_closes_after_its_exit(
        address: str, short_dir: Path) -> None:
    go = short_dir / "go"  # the process ends once it was detached, not before
    async with connect(address) as conn:
        session = await conn.spawn(
            ["sh", "-c", f"echo done; while [ ! -e {go} ]; do sleep 0.01; done; exit 4"],
            pty=False, detachable=True)
        await session.detach()
    await until_listed(address, lambda s: bool(s) and not s[0].attached)
    go.touch()
    await until_listed(address, lambda s: bool(s) and s[0].exit is not None)
    async with raw_peer(address) as peer:
        await peer.send(HELLO + ctrl(1, Attach(session=session.id or "")))
        with anyio.fail_after(10):
            frames = await peer.frames_until_eof()  # the server closes after the exit
    out, _, controls = split_output(frames, 1)
    assert out == b"done\n" and [c["type"] for c in controls] == ["attached", "exit"]
    assert controls[-1]["code"] == 4


async def test_a_cancel_during_the_replay_ends_it(address: str) -> None:
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", "head -c 4000 /dev/zero; sleep 30"],
                                   pty=False, detachable=True)
        await session.detach()
    async with connect(address, multiplex=True, window=1024) as conn:  # the replay waits
        again = await conn.attach(session.id or "")  # for credit nobody grants
        await again.cancel()
    await until_listed(address, lambda s: s == [], timeout=10)
    assert await wait_until(lambda: processes_in_group(session.pid or 0) == [], timeout=5)


@pytest.mark.parametrize("leaving", ["detach", "close"])
async def test_input_the_server_took_reaches_the_process_after_its_writer_left(
        address: str, short_dir: Path, leaving: str) -> None:
    """200,000 bytes and `eof` sent, then the writer detaches (or its connection closes)
    before the process reads any: it gets them all and their end, with nobody attached."""
    gate = short_dir / "gate"
    os.mkfifo(gate)
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", f"cat {gate} >/dev/null; exec wc -c"],
                                   pty=False, detachable=True)
        await session.send(b"x" * 200_000)  # (more than the pipe holds: the rest is queued)
        await session.eof()
        if leaving == "detach":
            await session.detach()
            with pytest.raises(SessionDetached):
                await session.wait()  # (its channel ends with `detached`)
    await until_listed(address, lambda s: bool(s) and not s[0].attached)

    def open_the_gate() -> None:
        os.close(os.open(gate, os.O_WRONLY))  # (meets cat's open; cat then reads its end)

    await anyio.to_thread.run_sync(open_the_gate)
    await until_listed(address, lambda s: bool(s) and s[0].exit is not None)
    async with connect(address, multiplex=True) as conn:
        again = await conn.attach(session.id or "")
        output = b"".join([chunk.data async for chunk in again])
        assert output.split() == [b"200000"]
        assert again.status is not None and again.status.code == 0


async def test_writers_that_come_and_go_cannot_grow_a_sessions_queued_input_without_bound(
        short_dir: Path) -> None:
    """Each writer's window bounds what it adds; input earlier writers left counts too: past
    STDIN_LIMIT plus the window, the writer's connection waits for the process (and then
    every byte arrives)."""
    window = 64 << 10
    server = start_server(short_dir, "--command", SH, "--stdin-window", str(window),
                          listen=[f"unix:{short_dir / 'w.sock'}"])
    gate = short_dir / "gate"
    os.mkfifo(gate)
    try:
        address = server.addresses[0]
        async with connect(address, multiplex=True, window=1 << 20) as conn:
            first = await conn.spawn([SH, "-c", f"cat {gate} >/dev/null; exec wc -c"],
                                     pty=False, detachable=True)
            await first.detach()
        sent = writers = 0
        bound = (STDIN_LIMIT + window) // window + 2  # writers before one must wait
        while writers <= bound:
            async with connect(address, multiplex=True, window=1 << 20) as conn:
                writer = await conn.attach(first.id or "")
                await writer.send(b"x" * window)
                sent += window
                await writer.detach()
                with anyio.move_on_after(2):  # (the one that waits is released below)
                    with pytest.raises(SessionDetached):
                        await writer.wait()  # (its channel ends with `detached`)
                    writers += 1
                    continue
                break
        assert writers < bound, "no writer waited"

        def open_the_gate() -> None:
            os.close(os.open(gate, os.O_WRONLY))

        await anyio.to_thread.run_sync(open_the_gate)
        async with connect(address, multiplex=True) as conn:
            last = await conn.attach(first.id or "", steal=True)
            await last.eof()
            output = b"".join([chunk.data async for chunk in last])
            assert output.split() == [str(sent).encode()]
    finally:
        server.stop()


async def test_journal_records_carry_members_with_their_usual_value(
        server: ServerProcess, address: str, short_dir: Path) -> None:
    """A writer's attach and detach say `"role": "writer"`, a contained session's end
    `"oom": false`: a coordinator's `select(.role == "writer")` finds them (contracts.md,
    the journal)."""
    async with reattached(address, "read line; exit 3") as again:
        await again.send(b"go\n")
        assert (await again.wait()).code == 3
    server.stop()
    lines = [json.loads(line) for line in (short_dir / "j.jsonl").read_text().splitlines()]
    ours = [line for line in lines if line.get("id") == again.id]
    assert [(line["event"], line.get("role")) for line in ours
            if line["event"] in ("session.attach", "session.detach")] == [
        ("session.detach", "writer"), ("session.attach", "writer")]
    [end] = [line for line in ours if line["event"] == "session.end"]
    contained = "leftovers" in end  # (where cgroups are had: then `oom` is known)
    assert end["code"] == 3 and end.get("oom") is (False if contained else None)
