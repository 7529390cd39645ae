"""Sessions on targets through the door (protocol section 15): a session there is a session
of the door in every way: the far side's exit exactly and last, output whole, flow control
end to end, control messages, detach and attach, observers, the journal; who may reach what;
the `targets` message; and a carrier that dies mid-session."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from helpers import ServerProcess, worker_of, zombie_children
from target_doors import Far, carriers

from ttyserve.client import connect
from ttyserve.errors import ErrorCode, RequestError

pytestmark = [pytest.mark.timeout(90)]

Door = Callable[..., ServerProcess]
FarMaker = Callable[[str], Far]


def records(short_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (short_dir / "journal").read_text().splitlines()]


async def ended(short_dir: Path, count: int) -> list[dict[str, object]]:
    """The journal once it holds ``count`` ends (an end is written as its exit goes out)."""
    with anyio.fail_after(20):
        while len([r for r in records(short_dir) if r["event"] == "session.end"]) < count:
            await anyio.sleep(0.05)  # (no event a client sees: the journal's line)
    return records(short_dir)


async def read_all(session: object) -> tuple[bytes, bytes]:
    out, err = b"", b""
    async for chunk in session:  # type: ignore[attr-defined]
        if chunk.stream == "stdout":
            out += chunk.data
        else:
            err += chunk.data
    return out, err


@pytest.mark.asyncio
async def test_a_target_session_is_the_far_sides_exactly(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    web = far("web-1")
    door = start_door(web.entry({"role": "web"}))
    async with connect(door.addresses[0], multiplex=True, window=1 << 16) as conn:
        session = await conn.spawn(
            ["sh", "-c", "echo out; echo err >&2; head -c 3000000 /dev/zero; exit 7"],
            pty=False, target="web-1")
        assert session.target == "web-1"
        assert Path(f"/proc/{session.pid}").exists()  # the far side's pid (this machine)
        out, err = await read_all(session)
        assert out == b"out\n" + bytes(3000000) and err == b"err\n"
        assert (await session.wait()).code == 7
        killed = await conn.spawn(["sh", "-c", "kill -TERM $$"], pty=True, target="web-1")
        status = await killed.wait()
        assert (status.code, status.signal) == (-15, "TERM")
    journal = await ended(short_dir, 2)
    starts = [r for r in journal if r["event"] == "session.start"]
    ends = [r for r in journal if r["event"] == "session.end"]
    assert [(r["target"], r["pid"] == session.pid) for r in starts][:1] == [("web-1", True)]
    assert all(r["target"] == "web-1" and "principal" in r for r in starts + ends)
    assert sorted(r["code"] for r in ends) == [-15, 7]


@pytest.mark.asyncio
async def test_an_unknown_target_and_a_forbidden_one_get_the_same_answer(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    import hashlib

    web, db = far("web-1"), far("db-0")
    principals = short_dir / "principals.toml"
    principals.write_text(
        f'[principals.alice]\ntoken_sha256 = "{hashlib.sha256(b"alice").hexdigest()}"\n'
        'targets = ["web-*"]\nlocal = false\n')
    door = start_door(web.entry({"role": "web"}) + db.entry({"role": "db"}),
                      "--principals", str(principals))
    answers = []
    async with connect(door.addresses[0], token="alice", multiplex=True) as alice:
        for name in ("db-0", "nowhere"):
            with pytest.raises(RequestError) as refused:
                await alice.spawn(["true"], pty=False, target=name)
            answers.append((refused.value.code, refused.value.retriable,
                            str(refused.value).replace(name, "NAME")))
        assert [t.name for t in await alice.list_targets()] == ["web-1"]
        session = await alice.spawn(["echo", "hi"], pty=False, target="web-1")
        assert (await session.wait()).code == 0
    assert answers[0] == answers[1] and answers[0][:2] == (ErrorCode.NO_SUCH_TARGET, False)
    refusals = [(r["principal"], r["target"], r["code"]) for r in records(short_dir)
                if r["event"] == "session.refused"]
    assert refusals == [("alice", "db-0", "no_such_target"),
                        ("alice", "nowhere", "no_such_target")]


@pytest.mark.asyncio
async def test_targets_lists_states_sorted_and_the_connection_closes_when_idle(
        start_door: Door, far: FarMaker) -> None:
    b, a = far("b-host"), far("a-host")
    broken = "[targets.c-host]\nvia = \"via:false\"\n"
    door = start_door(b.entry({"env": "x"}) + a.entry() + broken, "--target-idle", "1")
    async with connect(door.addresses[0], multiplex=True) as conn:
        listed = await conn.list_targets()
        assert [(t.name, t.state) for t in listed] == [
            ("a-host", "idle"), ("b-host", "idle"), ("c-host", "idle")]
        assert listed[1].labels == {"env": "x"}
        with pytest.raises(RequestError) as refused:
            await conn.spawn(["true"], pty=False, target="c-host")
        assert refused.value.code == ErrorCode.TARGET_UNREACHABLE
        assert "crashed" in str(refused.value) and refused.value.retriable
        session = await conn.spawn(["sh", "-c", "read x"], pty=False, target="b-host")
        states = {t.name: t.state for t in await conn.list_targets()}
        assert states == {"a-host": "idle", "b-host": "connected", "c-host": "unreachable"}
        await session.eof()
        await session.wait()
        with anyio.fail_after(20):
            while carriers(door, b):  # closed after --target-idle without a session
                await anyio.sleep(0.05)
        assert {t.name: t.state for t in await conn.list_targets()}["b-host"] == "idle"


@pytest.mark.asyncio
async def test_a_carrier_that_is_not_installed_and_one_that_hangs_are_refused_clearly(
        start_door: Door, far: FarMaker) -> None:
    web = far("web-1")
    door = start_door(web.entry(via="via:/nonexistent/carrier") +
                      web.entry(via="via:sh -c 'exec sleep 60' --").replace("web-1", "hangs"),
                      "--handshake-timeout", "1")
    async with connect(door.addresses[0], multiplex=True) as conn:
        with pytest.raises(RequestError) as missing:
            await conn.spawn(["true"], pty=False, target="web-1")
        assert missing.value.code == ErrorCode.TARGET_UNREACHABLE
        assert "not_installed" in str(missing.value) and not missing.value.retriable
        started = time.monotonic()
        with pytest.raises(RequestError) as hung:
            await conn.spawn(["true"], pty=False, target="hangs")
        assert hung.value.code == ErrorCode.TARGET_UNREACHABLE and hung.value.retriable
        assert "handshake" in str(hung.value) and time.monotonic() - started < 10


@pytest.mark.asyncio
async def test_control_messages_reach_the_far_side(start_door: Door, far: FarMaker) -> None:
    web = far("web-1")
    door = start_door(web.entry())
    async with connect(door.addresses[0], multiplex=True) as conn:
        catting = await conn.spawn(["cat"], pty=False, target="web-1")
        await catting.send(b"typed\n")
        await catting.eof()
        assert (await read_all(catting))[0] == b"typed\n"
        assert (await catting.wait()).code == 0
        sized = await conn.spawn(["sh", "-c", "read x; stty size"], pty=True, target="web-1",
                                 rows=24, cols=80)
        await sized.resize(33, 111)
        await sized.send(b"go\r")
        out = (await read_all(sized))[0]
        assert b"33 111" in out, out
        interrupted = await conn.spawn(["sleep", "30"], pty=False, target="web-1")
        await interrupted.signal("INT")
        status = await interrupted.wait()
        assert (status.code, status.signal) == (-2, "INT")
        cancelled = await conn.spawn(["sleep", "30"], pty=False, target="web-1")
        far_pid = cancelled.pid
        await cancelled.cancel()
        with anyio.fail_after(20):
            while Path(f"/proc/{far_pid}").exists() and b"Z" not in Path(
                    f"/proc/{far_pid}/stat").read_bytes().split(b")")[-1][:3]:
                await anyio.sleep(0.05)  # (the far process ends: nothing a client sees)


@pytest.mark.asyncio
async def test_a_client_that_stops_reading_stops_the_far_process(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    web = far("web-1")
    door = start_door(web.entry(), "--target-window", "65536")
    progress = short_dir / "progress"
    script = (f"i=0; while [ $i -lt 400 ]; do head -c 65536 /dev/zero; i=$((i+1)); "
              f"echo $i > {progress}; done")
    async with connect(door.addresses[0], multiplex=True, window=65536) as conn:
        session = await conn.spawn(["sh", "-c", script], pty=False, target="web-1")
        first = await session.receive()  # it runs; now nobody reads
        assert first is not None

        def written() -> int:
            text = progress.read_text().strip() if progress.exists() else ""
            return int(text) if text else 0

        stalled_at, last, since = 0, -1, time.monotonic()
        with anyio.fail_after(60):
            while time.monotonic() - since < 1.5:  # (a stall: the absence of events)
                now = written()
                if now != last:
                    last, since = now, time.monotonic()
                await anyio.sleep(0.05)
            stalled_at = last
        # What waits: the client's window, the door's, the far side's, and its pipe (1 MiB).
        assert stalled_at * 65536 < 4 << 20, stalled_at
        out, _ = await read_all(session)
        assert len(out) + len(first.data) == 400 * 65536
        assert (await session.wait()).code == 0


@pytest.mark.asyncio
async def test_a_detachable_target_session_detaches_attaches_and_is_watched(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    web = far("web-1")
    door = start_door(web.entry())
    address = door.addresses[0]
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", "echo one; read x; echo two $x; exit 4"],
                                   pty=False, target="web-1", detachable=True)
        assert (await session.receive()).data == b"one\n"  # type: ignore[union-attr]
        await session.detach()
        session_id = session.id
        assert session_id is not None
        listed = await conn.list_sessions()
        assert [(s.session, s.target) for s in listed] == [(session_id, "web-1")]
    async with connect(address, multiplex=True) as again:
        watcher = await again.attach(session_id, role="observer")
        writer = await again.attach(session_id, offsets=session.offsets)
        await writer.send(b"x\n")
        assert (await read_all(writer))[0] == b"two x\n"
        assert (await writer.wait()).code == 4
        assert (await read_all(watcher))[0] == b"one\ntwo x\n"
    events = [(r["event"], r["target"]) for r in await ended(short_dir, 1)
              if r["id"] == session_id]
    assert ("session.detach", "web-1") in events and ("session.attach", "web-1") in events
    assert events[-1] == ("session.end", "web-1")


@pytest.mark.asyncio
async def test_a_dropped_carrier_resumes_detachable_sessions_and_ends_the_others(
        start_door: Door, far: FarMaker) -> None:
    web = far("web-1")
    door = start_door(web.entry())
    lines = 400
    script = (f"i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo line$i; sleep 0.005; done; "
              "exit 9")
    async with connect(door.addresses[0], multiplex=True) as conn:
        kept = await conn.spawn(["sh", "-c", script], pty=False, target="web-1",
                                detachable=True)
        plain = await conn.spawn(["sleep", "30"], pty=False, target="web-1")
        first = await kept.receive()
        assert first is not None
        (carrier,) = carriers(door, web)
        os.kill(carrier, signal.SIGKILL)  # the carrier dies, for real
        out = first.data + (await read_all(kept))[0]
        assert out == b"".join(b"line%d\n" % i for i in range(1, lines + 1))
        assert (await kept.wait()).code == 9
        lost = await plain.wait()
        assert lost.code == -1 and lost.error is not None


@pytest.mark.asyncio
async def test_sighup_reads_the_targets_again(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    web, db = far("web-1"), far("db-0")
    door = start_door(web.entry())
    async with connect(door.addresses[0], multiplex=True) as conn:
        running = await conn.spawn(["sh", "-c", "read x; echo still $x"], pty=False,
                                   target="web-1")
        (short_dir / "targets.toml").write_text(db.entry())
        door.proc.send_signal(signal.SIGHUP)
        with anyio.fail_after(20):
            while [t.name for t in await conn.list_targets()] != ["db-0"]:
                await anyio.sleep(0.05)  # (each worker reads it on its own)
        with pytest.raises(RequestError) as removed:
            await conn.spawn(["true"], pty=False, target="web-1")
        assert removed.value.code == ErrorCode.NO_SUCH_TARGET
        added = await conn.spawn(["echo", "new"], pty=False, target="db-0")
        assert (await read_all(added))[0] == b"new\n"
        await running.send(b"here\n")  # the removed target's session goes on
        assert (await read_all(running))[0] == b"still here\n"
        (short_dir / "targets.toml").write_text("[targets.x\n")
        door.proc.send_signal(signal.SIGHUP)
        with anyio.fail_after(20):
            while "the targets read before are kept" not in door.stderr_tail():
                await anyio.sleep(0.05)
        assert [t.name for t in await conn.list_targets()] == ["db-0"]


def test_a_targets_file_that_cannot_be_used_is_exit_3(short_dir: Path, workers: int) -> None:
    import subprocess

    from helpers import ttyserve_command

    from ttyserve.exitcodes import ServeExit

    broken = short_dir / "targets.toml"
    broken.write_text('[targets.a]\nvia = "via:true"\nsurprise = 1\n')
    served = subprocess.run(ttyserve_command(
        "serve", f"--listen=unix:{short_dir / 'a.sock'}", f"--workers={workers}",
        "--targets", str(broken)), capture_output=True, text=True, timeout=30)
    assert served.returncode == ServeExit.CONFIG, served.stderr
    assert f"targets file {broken}" in served.stderr and "surprise" in served.stderr


@pytest.mark.asyncio
async def test_an_upgrade_in_place_ends_a_target_session_as_an_undetachable_one(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    web = far("web-1")
    door = start_door(web.entry())
    async with connect(door.addresses[0], multiplex=True) as conn:
        session = await conn.spawn(["cat"], pty=False, target="web-1", detachable=True)
        here = await conn.spawn(["cat"], pty=False, detachable=True)  # this host's: kept
        door.proc.send_signal(signal.SIGUSR2)
        with anyio.fail_after(30):
            status = await session.wait()
        assert (status.code, status.signal) == (-1, "HUP")
        assert here.status is None
    with anyio.fail_after(30):
        while not any(r["event"] == "server.upgrade" for r in records(short_dir)):
            await anyio.sleep(0.05)  # (the new code's record: nothing a client sees)
    async with connect(door.addresses[0], multiplex=True) as conn:  # both handed over
        listed = {s.session: s for s in await conn.list_sessions()}
        assert listed[here.id].exit is None and listed[here.id].target is None
        ended = listed[session.id]
        assert ended.target == "web-1" and ended.exit is not None
        assert (ended.exit["code"], ended.exit["signal"]) == (-1, "HUP")
    assert not [pid for each in door.pids() for pid in zombie_children(each)]  # its carriers
    # were ended and reaped before the new code began


@pytest.mark.asyncio
async def test_targets_says_connected_from_any_worker(
        start_door: Door, far: FarMaker, workers: int) -> None:
    web = far("web-1")
    door = start_door(web.entry())
    address = door.addresses[0]
    async with connect(address, multiplex=True) as first:
        running = await first.spawn(["cat"], pty=False, target="web-1")
        home = await worker_of(first)
        async with contextlib.AsyncExitStack() as stack:
            other = first
            for _ in range(20):  # (a connection goes to either worker: until the other one)
                if workers == 1 or await worker_of(other) != home:
                    break
                other = await stack.enter_async_context(connect(address, multiplex=True))
            assert workers == 1 or await worker_of(other) != home
            assert [(t.name, t.state) for t in await other.list_targets()] == [
                ("web-1", "connected")]
        await running.eof()
        assert (await running.wait()).code == 0


@pytest.mark.asyncio
async def test_a_target_session_is_shared_and_recorded_as_any_other(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    web = far("web-1")
    casts = short_dir / "casts"
    door = start_door(web.entry(), "--record", str(casts))
    address = door.addresses[0]
    async with connect(address, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", "echo one; read x; echo two $x; exit 3"],
                                   pty=True, target="web-1", detachable=True)
        shared = await conn.share(str(session.id))
        async with connect(address, grant=shared.grant, multiplex=True) as guest:
            watcher = await guest.attach(str(session.id), role="observer")
            await session.send(b"x\r")
            seen = b"".join([chunk.data async for chunk in watcher])
            assert b"one" in seen and b"two x" in seen
            assert (await watcher.wait()).code == 3
        assert (await session.wait()).code == 3
    with anyio.fail_after(20):
        while not (files := list(casts.glob("*.cast"))) or '"x"' not in files[0].read_text():
            await anyio.sleep(0.05)  # (a file tells nobody it grew)
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert files[0].name == f"{session.id}.cast"
    output = "".join(event[2] for event in lines[1:] if event[1] == "o")
    assert "one" in output and "two x" in output and lines[-1][1:] == ["x", "3"]


@pytest.mark.asyncio
async def test_the_terminal_state_reaches_through_the_door(
        start_door: Door, far: FarMaker) -> None:
    from ttyserve.protocol.messages import Modes

    web = far("web-1")
    door = start_door(web.entry())
    script = "stty -echo; printf 'Password: '; read x; stty echo; echo; echo got:$x"
    async with connect(door.addresses[0], multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", script], target="web-1", modes=True)
        seen: list[bytes | Modes] = []
        with anyio.fail_after(20):
            while b"Password: " not in b"".join(e for e in seen if isinstance(e, bytes)):
                event = await session.next_event()
                assert event is not None
                seen.append(event if isinstance(event, Modes) else event.data)
        assert isinstance(seen[0], Modes)  # (echoed, or hidden: the far side may have run
        # stty before the door's first look, which is then the state at offset 0)
        hidden = [i for i, e in enumerate(seen) if isinstance(e, Modes) and e.input == "hidden"]
        prompt = next(i for i, e in enumerate(seen) if isinstance(e, bytes) and b"Pass" in e)
        assert hidden and hidden[0] < prompt  # told before the prompt, through the door
        await session.send(b"hunter2\r")
        assert (await session.wait()).code == 0


@pytest.mark.asyncio
async def test_a_carrier_lost_between_open_and_opened_never_runs_the_command_twice(
        start_door: Door, far: FarMaker, short_dir: Path) -> None:
    import sys

    web = far("web-1")
    cutter = Path(__file__).with_name("cut_before_opened.py")
    door = start_door(web.entry(persist=False, via=f"via:{sys.executable} {cutter}"))
    ran = short_dir / "ran"
    async with connect(door.addresses[0], multiplex=True) as conn:
        with pytest.raises(RequestError) as lost:
            await conn.spawn(["sh", "-c", f"echo once >> {ran}"], pty=False, target="web-1")
    assert lost.value.code == ErrorCode.TARGET_UNREACHABLE and lost.value.retriable
    assert "may have started" in str(lost.value)
    with anyio.fail_after(20):
        while not ran.exists():
            await anyio.sleep(0.02)  # (the far side ran it before it answered)
    assert ran.read_text() == "once\n"  # once, not again over a new carrier
    refused = [r for r in records(short_dir) if r["event"] == "session.refused"]
    assert [(r["target"], r["code"]) for r in refused] == [("web-1", "target_unreachable")]
