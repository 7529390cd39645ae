"""Protocol section 11 over real sockets, rule by rule: one writer, observers (replay, live,
exit; read_only; STDIN discarded; the limit; audience), skipping a slow observer, and grants
(scope, expiry, revocation, the journal)."""

from __future__ import annotations

import base64
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import (
    SH,
    RawPeer,
    ServerProcess,
    ctrl,
    raw_peer,
    start_server,
    token_file,
    wait_until,
)

from ttyserve.client import connect
from ttyserve.errors import RequestError, SessionDetached
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Attach, Hello, Open
from ttyserve.server.journal import (
    SessionAttach,
    SessionDetach,
    SessionShare,
    SessionUnshare,
    read_file,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "shared-token"
MAX_OBSERVERS = 3
SCROLLBACK = 64 * 1024
CAT = ["cat"]


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    process = start_server(short_dir, "--command", SH, "--scrollback", str(SCROLLBACK),
                           "--max-observers", str(MAX_OBSERVERS), "--max-share-ttl", "600",
                           "--journal", str(short_dir / "j.jsonl"),
                           "--token-file", str(token_file(short_dir, TOKEN)),
                           listen=[f"unix:{short_dir / 's.sock'}", "tcp:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def unix(server: ServerProcess) -> str:
    return server.addresses[0]


@pytest.fixture
def tcp(server: ServerProcess) -> str:
    return server.addresses[1]


def hello(**members: object) -> bytes:
    return ctrl(0, Hello(protocol=1, multiplex=True, **members))  # type: ignore[arg-type]


async def watch(peer: RawPeer, session: str, channel: int = 1, **members: object,
                ) -> dict[str, object]:
    """Attach ``channel`` as an observer; its `attached`."""
    await peer.send(ctrl(channel, {"type": "attach", "session": session, "role": "observer",
                                   **members}))
    return await next_on(peer, channel)


async def next_on(peer: RawPeer, channel: int) -> dict[str, object]:
    """The next control message on ``channel`` (output frames before it are kept)."""
    while True:
        with anyio.fail_after(10):
            frame = await peer.next_frame()
        assert frame is not None, f"connection closed before a control message on {channel}"
        if frame.kind is FrameKind.CTRL_OUT and frame.channel == channel:
            return json.loads(frame.payload)
        peer.seen.append(frame)


async def output_until(peer: RawPeer, channel: int, wanted: bytes) -> bytes:
    """Output of ``channel`` until it holds ``wanted``."""
    got = b"".join(f.payload for f in peer.seen if f.channel == channel
                   and f.kind is FrameKind.STDOUT)
    peer.seen = [f for f in peer.seen if f.channel != channel]
    while wanted not in got:
        frame = await peer.next_frame()
        assert frame is not None, f"closed; got {got!r}"
        if frame.channel == channel and frame.kind is FrameKind.STDOUT:
            got += frame.payload
        elif frame.channel == channel:
            raise AssertionError(f"{json.loads(frame.payload)} before {wanted!r}; got {got!r}")
        else:
            peer.seen.append(frame)
    return got


# --- one writer, observers ---------------------------------------------------------------


async def test_observers_get_the_replay_live_output_and_the_exit(unix: str) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        await session.send(b"before\n")
        assert (await session.receive()).data == b"before\n"  # type: ignore[union-attr]
        async with raw_peer(unix) as peer:
            await peer.send(hello())
            assert (await next_on(peer, 0))["type"] == "welcome"
            attached = await watch(peer, session.id or "", offsets={"stdout": 2})
            assert attached["role"] == "observer"
            assert attached["offsets"] == {"stdout": 2, "stderr": 0}
            assert await output_until(peer, 1, b"fore\n") == b"fore\n"  # the replay, from 2 on
            await session.send(b"live\n")
            assert await output_until(peer, 1, b"live\n") == b"live\n"
            await session.eof()
            assert (await session.wait()).code == 0
            last = await next_on(peer, 1)
            assert last["type"] == "exit" and last["code"] == 0, last


async def test_one_writer_and_session_in_use_between_writers_only(unix: str) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        async with connect(unix, multiplex=True) as other:
            watchers = [await other.attach(session.id or "", role="observer") for _ in range(2)]
            assert [w.role for w in watchers] == ["observer", "observer"]
            with pytest.raises(RequestError) as refused:
                await other.attach(session.id or "")
            assert refused.value.code == "session_in_use"
            # A writer that detaches leaves the observers watching; a new writer comes in.
            await session.detach()
            with pytest.raises(SessionDetached):
                await session.wait()  # (`detached` came: the server has let go of it)
            writer = await other.attach(session.id or "")
            await writer.send(b"after\n")
            for watcher in watchers:
                chunk = await watcher.receive()
                assert chunk is not None and chunk.data == b"after\n"
            await writer.eof()
            assert (await writer.wait()).code == 0
            assert [(await w.wait()).code for w in watchers] == [0, 0]


async def test_read_only_for_each_writer_only_message_and_the_session_goes_on(
        unix: str) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        async with raw_peer(unix) as peer:
            await peer.send(hello())
            await next_on(peer, 0)
            await watch(peer, session.id or "")
            for message in ({"type": "resize", "rows": 5, "cols": 5},
                            {"type": "signal", "name": "KILL"}, {"type": "eof"},
                            {"type": "cancel"}):
                await peer.send(ctrl(1, message))
                refused = await next_on(peer, 1)
                assert refused["type"] == "error" and refused["code"] == "read_only", refused
                assert str(message["type"]) in str(refused["message"])
            # STDIN from the observer is discarded without a word; the writer's goes in.
            await peer.send(encode_frame(FrameKind.STDIN, 1, b"from the observer\n"))
            await session.send(b"from the writer\n")
            assert await output_until(peer, 1, b"from the writer\n") == b"from the writer\n"
            chunk = await session.receive()
            assert chunk is not None and chunk.data == b"from the writer\n"
            # `detach` and `window` are an observer's to send.
            await peer.send(ctrl(1, {"type": "detach"}))
            assert (await next_on(peer, 1)) == {"type": "detached"}
        await session.eof()
        assert (await session.wait()).code == 0


async def test_the_observer_limit_and_audience_counts(unix: str) -> None:
    """The writer hears every change of the number watching, in order; one past the limit
    is busy (and changes nothing)."""
    async with raw_peer(unix) as writer, connect(unix, multiplex=True) as owner:
        await writer.send(hello() + ctrl(1, Open(argv=CAT, pty=False, detachable=True)))
        await next_on(writer, 0)
        session_id = str((await next_on(writer, 1))["session"])
        async with connect(unix, multiplex=True) as other:
            watchers = [await other.attach(session_id, role="observer")
                        for _ in range(MAX_OBSERVERS)]
            with pytest.raises(RequestError) as refused:
                await other.attach(session_id, role="observer")
            assert refused.value.code == "busy" and refused.value.retriable
            assert str(MAX_OBSERVERS) in refused.value.message
            await watchers[0].detach()
            with pytest.raises(SessionDetached):
                await watchers[0].wait()
            listed = {s.session: s for s in await owner.list_sessions()}
            assert listed[session_id].observers == MAX_OBSERVERS - 1
        counts = [(await next_on(writer, 1))["observers"] for _ in range(2 * MAX_OBSERVERS)]
        # 1, 2, 3 as they came; 2 at the detach; 1, 0 as their connection closed.
        assert counts == [*range(1, MAX_OBSERVERS + 1), *range(MAX_OBSERVERS - 1, -1, -1)]
        await writer.send(ctrl(1, {"type": "eof"}))
        assert (await next_on(writer, 1))["type"] == "exit"


async def test_a_writer_attaching_is_told_how_many_watch(
        unix: str) -> None:
    """A writer that attaches while observers watch is told their number at once."""
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        async with connect(unix, multiplex=True) as other:
            await other.attach(session.id or "", role="observer")
            await session.detach()
            with pytest.raises(SessionDetached):
                await session.wait()
            async with raw_peer(unix) as peer:
                await peer.send(hello() + ctrl(1, Attach(session=session.id or "")))
                await next_on(peer, 0)
                assert (await next_on(peer, 1))["role"] == "writer"
                assert await next_on(peer, 1) == {"type": "audience", "observers": 1}
                await peer.send(ctrl(1, {"type": "cancel"}))


# --- a slow observer costs nothing ----------------------------------------------------


async def test_an_observer_that_never_reads_is_skipped_and_its_offsets_line_up(
        unix: str) -> None:
    """200 MB through a session watched by an observer that never grants credit: the writer
    gets every byte and the exit (the process was never held back); the observer then gets
    `skipped` with exact counts, and its offsets go on from where `skipped` says."""
    async with connect(unix, multiplex=True) as owner:
        total = 200 << 20
        session = await owner.spawn(["sh", "-c", f"read go; head -c {total} /dev/zero"],
                                    pty=False, detachable=True)
        async with raw_peer(unix) as peer:
            await peer.send(hello(window=4096))  # credit for one frame, never granted again
            await next_on(peer, 0)
            attached = await watch(peer, session.id or "")
            position = attached["offsets"].get("stdout", 0)  # type: ignore[attr-defined]
            await session.send(b"go\n")
            received = 0
            with anyio.fail_after(45):
                async for chunk in session:
                    received += len(chunk.data)
            assert received == total and session.status is not None and session.status.code == 0
            await peer.send(ctrl(1, {"type": "window", "bytes": 1 << 30}))
            skipped_total = 0
            got = 0
            with anyio.fail_after(30):
                while True:
                    frame = await peer.next_frame()
                    assert frame is not None
                    if frame.channel != 1:
                        continue
                    if frame.kind is FrameKind.STDOUT:
                        assert set(frame.payload) == {0}
                        position += len(frame.payload)
                        got += len(frame.payload)
                        continue
                    message = json.loads(frame.payload)
                    if message["type"] == "exit":
                        break
                    if message["type"] == "window":
                        continue
                    assert message["type"] == "skipped", message
                    skipped_total += message["bytes"]
                    position += message["bytes"]
                    assert message["offsets"] == {"stdout": position, "stderr": 0}
            assert position == total  # every byte was sent or skipped, and counted once
            assert skipped_total > total - 2 * SCROLLBACK
            assert got + skipped_total == total


# --- grants ---------------------------------------------------------------------------


def tcp_hello(grant: str | None = None, token: str | None = None) -> bytes:
    return hello(grant=grant, token=token)


async def test_a_grant_over_tcp_with_no_token_for_its_session_and_role_only(unix: str,
        tcp: str, server: ServerProcess, short_dir: Path) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        other = await owner.spawn(CAT, pty=False, detachable=True)
        shared = await owner.share(session.id or "", ttl=300)
        assert shared.role == "observer" and shared.session == session.id
        raw = base64.urlsafe_b64decode(shared.grant[1:] + "=" * (-len(shared.grant[1:]) % 4))
        assert len(raw) * 8 >= 128  # at least 128 random bits
        async with raw_peer(tcp) as peer:
            await peer.send(tcp_hello(grant=shared.grant))
            welcome = await next_on(peer, 0)
            assert welcome["type"] == "welcome"
            assert welcome["grant"]["session"] == session.id  # type: ignore[index]
            assert welcome["grant"]["role"] == "observer"  # type: ignore[index]
            # Only its session, only its role, nothing else.
            for channel, request in ((1, {"type": "attach", "session": session.id}),
                                     (2, {"type": "attach", "session": other.id,
                                          "role": "observer"}),
                                     (3, {"type": "open", "argv": ["true"]})):
                await peer.send(ctrl(channel, request))
                refused = await next_on(peer, channel)
                assert refused["type"] == "error" and refused["code"] == "forbidden", refused
            for request in ({"type": "list"}, {"type": "share", "session": session.id, "ttl": 5},
                            {"type": "unshare", "grant": shared.grant}):
                await peer.send(ctrl(0, request))
                refused = await next_on(peer, 0)
                assert refused["type"] == "error" and refused["code"] == "forbidden", refused
            attached = await watch(peer, session.id or "", channel=4)
            assert attached["type"] == "attached" and attached["role"] == "observer"
            # An observer through a grant cannot write either.
            await peer.send(encode_frame(FrameKind.STDIN, 4, b"typed\n") + ctrl(4, {"type": "eof"}))
            assert (await next_on(peer, 4))["code"] == "read_only"
            await session.send(b"seen\n")
            assert await output_until(peer, 4, b"seen\n") == b"seen\n"
        # The token still works as before, and a wrong grant is unauthorized.
        async with raw_peer(tcp) as peer:
            await peer.send(tcp_hello(grant=shared.grant[:-2] + "xx"))
            refused = await next_on(peer, 0)
            assert refused["type"] == "error" and refused["code"] == "unauthorized"
        await session.eof()
        await other.eof()


async def test_a_writer_grant_writes(unix: str, tcp: str) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        shared = await owner.share(session.id or "", role="writer", ttl=60)
        await session.detach()
        with pytest.raises(SessionDetached):
            await session.wait()
        async with connect(tcp, grant=shared.grant, multiplex=True) as guest:
            writer = await guest.attach(session.id or "")
            assert guest.welcome is not None and guest.welcome.grant is not None
            assert guest.welcome.grant.role == "writer"
            await writer.send(b"guest\n")
            chunk = await writer.receive()
            assert chunk is not None and chunk.data == b"guest\n"
            await writer.eof()
            assert (await writer.wait()).code == 0


async def test_unshare_detaches_the_grants_channels_at_once_with_revoked(
        unix: str, tcp: str, short_dir: Path) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        shared = await owner.share(session.id or "", ttl=300)
        kept = await owner.share(session.id or "", ttl=300)
        async with connect(tcp, grant=shared.grant, multiplex=True) as guest, \
                connect(tcp, grant=kept.grant, multiplex=True) as second:
            watchers = [await guest.attach(session.id or "", role="observer") for _ in range(2)]
            other = await second.attach(session.id or "", role="observer")
            listed = {s.session: s for s in await owner.list_sessions()}
            assert {g.id for g in listed[session.id or ""].grants} == {shared.id, kept.id}
            answer = await owner.unshare(shared.grant)
            assert answer.id == shared.id and answer.channels == 2
            for watcher in watchers:
                with anyio.fail_after(5), pytest.raises(SessionDetached):
                    await watcher.wait()
                assert watcher.detached is not None and watcher.detached.reason == "revoked"
            # ... and the other grant's observer watches on.
            await session.send(b"still\n")
            chunk = await other.receive()
            assert chunk is not None and chunk.data == b"still\n"
            with pytest.raises(RequestError) as refused:
                await guest.attach(session.id or "", role="observer")
            assert refused.value.code == "unauthorized"
            with pytest.raises(RequestError) as again:
                await owner.unshare(shared.grant)
            assert again.value.code == "no_such_session"
        await session.eof()
        # (records of a share, an unshare and a detach are written in a task, soon after)
        journal = short_dir / "j.jsonl"
        def written() -> bool:
            records = read_file(str(journal)).records
            return any(isinstance(r, SessionUnshare) for r in records) and sum(
                isinstance(r, SessionDetach) and r.reason == "revoked" for r in records) == 2

        assert await wait_until(written, timeout=10)
        records = read_file(str(journal)).records
        text = journal.read_text()
        assert shared.grant not in text and kept.grant not in text  # never the grant itself
        shares = [r for r in records if isinstance(r, SessionShare)]
        assert {(r.grant, r.role) for r in shares} == {(shared.id, "observer"),
                                                       (kept.id, "observer")}
        unshares = [r for r in records if isinstance(r, SessionUnshare)]
        assert [(u.grant, u.reason, u.channels) for u in unshares] == [(shared.id, "revoked", 2)]
        attaches = [r for r in records if isinstance(r, SessionAttach) and r.grant == shared.id]
        assert [a.role for a in attaches] == ["observer", "observer"]
        revoked = [r for r in records if isinstance(r, SessionDetach) and r.reason == "revoked"]
        assert len(revoked) == 2 and {r.grant for r in revoked} == {shared.id}


async def test_an_expired_grant_detaches_its_channels_and_is_unauthorized(unix: str,
        tcp: str) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        shared = await owner.share(session.id or "", ttl=1)
        async with raw_peer(tcp) as peer:
            await peer.send(tcp_hello(grant=shared.grant))
            assert (await next_on(peer, 0))["type"] == "welcome"
            await watch(peer, session.id or "")
            with anyio.fail_after(5):  # the sweeper ends it within a second of its time
                ended = await next_on(peer, 1)
            assert ended == {"type": "detached", "reason": "expired"}
        async with raw_peer(tcp) as peer:
            await peer.send(tcp_hello(grant=shared.grant))
            refused = await next_on(peer, 0)
            assert refused["type"] == "error" and refused["code"] == "unauthorized"
        listed = {s.session: s for s in await owner.list_sessions()}
        assert listed[session.id or ""].grants == []
        await session.eof()


async def test_share_refusals_name_what_was_wrong(unix: str) -> None:
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        with pytest.raises(RequestError) as too_long:
            await owner.share(session.id or "", ttl=601)
        assert too_long.value.code == "bad_request" and "601" in too_long.value.message
        with pytest.raises(RequestError) as unknown:
            await owner.share("snosuchsession")
        assert unknown.value.code == "no_such_session"
        # The connection goes on after each refusal.
        assert [s.session for s in await owner.list_sessions()] == [session.id]
        await session.eof()


async def test_an_observer_reading_the_exit_leaves_it_for_the_writer(
        unix: str, tmp_path: Path) -> None:
    """The writer detached; the session ends while an observer watches: the observer gets
    the exit, and the session is still kept, with it, for its writer (an observer's client
    does not `release` it)."""
    go = tmp_path / "go"
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; '
                                     "done; echo bye; exit 7"], pty=False, detachable=True)
        await session.detach()
        async with connect(unix, multiplex=True) as other:
            watcher = await other.attach(session.id or "", role="observer")
            go.touch()
            assert (await watcher.wait()).code == 7
            await other.list_sessions()  # (a round trip: whatever it sent is taken)
        again = await owner.attach(session.id or "")
        chunk = await again.receive()
        assert chunk is not None and chunk.data == b"bye\n"
        assert (await again.wait()).code == 7


async def test_a_steal_and_a_revoked_writer_grant_are_journaled_and_release_nothing(
        unix: str, tcp: str, tmp_path: Path, short_dir: Path) -> None:
    """A steal writes the stolen channel's detach (reason stolen); a writer grant's
    connection cannot make the server forget its session's kept exit once the grant was
    revoked (the owner still gets it)."""
    go = tmp_path / "go"
    async with connect(unix, multiplex=True) as owner:
        session = await owner.spawn(["sh", "-c", f'while [ ! -e "{go}" ]; do sleep 0.01; '
                                     "done; exit 7"], pty=False, detachable=True)
        shared = await owner.share(session.id or "", role="writer", ttl=60)
        async with connect(tcp, grant=shared.grant, multiplex=True) as guest:
            await guest.attach(session.id or "", steal=True)
            with pytest.raises(SessionDetached):
                await session.wait()
            assert session.detached is not None and session.detached.reason == "stolen"
        async with raw_peer(tcp) as peer:
            await peer.send(hello(grant=shared.grant))
            assert (await next_on(peer, 0))["type"] == "welcome"
            await owner.unshare(shared.id or "")
            watcher = await owner.attach(session.id or "", role="observer")
            go.touch()
            assert (await watcher.wait()).code == 7  # ended, detached: its exit is kept
            await peer.send(ctrl(0, {"type": "release", "session": session.id})
                            + ctrl(0, {"type": "ping"}))
            assert await next_on(peer, 0) == {"type": "pong"}  # the release was read first
        again = await owner.attach(session.id or "")
        assert (await again.wait()).code == 7
    records = read_file(str(short_dir / "j.jsonl")).records
    stolen = [r for r in records if isinstance(r, SessionDetach) and r.reason == "stolen"]
    assert [(r.id, r.role) for r in stolen] == [(session.id, "writer")]


async def test_a_graceful_shutdown_ends_observers_with_the_sessions_exit(
        server: ServerProcess, unix: str) -> None:
    """SIGTERM with a writer and observers attached: the session is hung up, every channel
    gets the exit (a SIGHUP death), and the server exits 0 (an observer never keeps it)."""
    async with connect(unix, multiplex=True) as owner, connect(unix, multiplex=True) as other:
        session = await owner.spawn(CAT, pty=False, detachable=True)
        watchers = [await other.attach(session.id or "", role="observer") for _ in range(2)]
        server.proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(15):
            codes = [(await s.wait()).signal for s in (session, *watchers)]
        assert codes == ["HUP", "HUP", "HUP"]
    assert server.wait() == 0
