"""Hardening acceptance 4-7: the journal after crashes, torn lines, leases and shutdowns."""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from helpers import (
    HELLO,
    SH,
    ServerProcess,
    blocking_unix_socket,
    control_of,
    ctrl,
    kill_group,
    processes_in_group,
    start_server,
    ttyserve_command,
    wait_until,
)

from ttyserve.client import connect
from ttyserve.defaults import KILL_GRACE
from ttyserve.errors import ConnectionLost, RequestError
from ttyserve.exitcodes import ServeExit
from ttyserve.protocol.frames import FrameDecoder, FrameKind
from ttyserve.protocol.messages import Cancel, Exit, Open
from ttyserve.server.journal import Reason, SessionDetach, SessionEnd, SessionStart, read_file

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("workers")]


def starts(journal: Path) -> list[SessionStart]:
    return [r for r in read_file(str(journal)).records if isinstance(r, SessionStart)]


def ends_by_id(journal: Path) -> dict[str, list[SessionEnd]]:
    ends: dict[str, list[SessionEnd]] = {}
    for record in read_file(str(journal)).records:
        if isinstance(record, SessionEnd):
            ends.setdefault(record.id, []).append(record)
    return ends


def assert_one_end_per_start(journal: Path) -> dict[str, SessionEnd]:
    ends = ends_by_id(journal)
    assert set(ends) == {s.id for s in starts(journal)}
    assert all(len(e) == 1 for e in ends.values())
    return {key: value[0] for key, value in ends.items()}


def open_running(server: ServerProcess, script: str, pty: bool,
                 detachable: bool = False) -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(server.addresses[0].removeprefix("unix:"))
    sock.sendall(HELLO + ctrl(1, Open(argv=[SH, "-c", script], pty=pty,
                                      detachable=detachable)))
    decoder, frames = FrameDecoder(), []
    while not any(f.kind is FrameKind.STDOUT for f in frames):
        frames += decoder.feed(sock.recv(65536))
    return sock, json.loads(frames[1].payload)["pid"]


def test_kill_9_with_20_sessions_then_restart(short_dir: Path) -> None:
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal))
    # Half ignore SIGHUP: a PTY session's hang-up on the crash would not end them.
    scripts = ["echo up; sleep 300", "trap '' HUP; echo up; sleep 300"]
    sessions = [open_running(server, scripts[i % 2], pty=i % 4 < 2) for i in range(20)]
    groups = [pgid for _, pgid in sessions]
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    for sock, _ in sessions:
        sock.close()
    assert len(starts(journal)) == 20
    assert ends_by_id(journal) == {}  # a hard death writes no end records

    restarted = start_server(short_dir, "--journal", str(journal))
    try:
        ends = assert_one_end_per_start(journal)
        assert [e.reason for e in ends.values()] == [Reason.CRASH_INFERRED] * 20
        # The orphans' fate: the next start hangs up what the crashed sessions left running.
        deadline = time.monotonic() + 5
        while any(processes_in_group(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [g for g in groups if processes_in_group(g)] == []
    finally:
        assert restarted.stop() == ServeExit.OK


def test_torn_last_line_is_skipped_with_a_warning(short_dir: Path) -> None:
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal))
    sock, pgid = open_running(server, "echo up; sleep 300", pty=False)
    try:
        server.stop(signal.SIGKILL)
        sock.close()
        data = journal.read_bytes()
        journal.write_bytes(data[: len(data) - 7])  # the crash cut the start record mid-line
        server = start_server(short_dir, "--journal", str(journal))
        try:
            assert "torn" in server.stderr_tail()
            result = subprocess.run(ttyserve_command("exec", "--connect", server.addresses[0],
                                                     "--", "echo", "served"),
                                    capture_output=True, timeout=20)
            assert result.stdout == b"served\n"
        finally:
            assert server.stop() == ServeExit.OK
    finally:
        kill_group(pgid)  # its start record was torn away: no restart can end it
    assert read_file(str(journal)).torn == 1
    ends = assert_one_end_per_start(journal)
    assert [e.reason for e in ends.values()] == [Reason.EXIT]


def test_second_server_on_the_same_journal_exits_4(short_dir: Path) -> None:
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal))
    try:
        second = subprocess.run(ttyserve_command("serve", f"--listen=unix:{short_dir / 'b.sock'}",
                                                 "--journal", str(journal)),
                                capture_output=True, timeout=20)
        assert second.returncode == ServeExit.LEASE
        assert f"pid {server.pid}".encode() in second.stderr
    finally:
        server.stop()


def test_records_of_a_normal_life(short_dir: Path) -> None:
    journal = short_dir / "journal.jsonl"
    # Without containment: its members (`cgroup`, `leftovers`) are tests/containment's.
    server = start_server(short_dir, "--journal", str(journal), "--command", SH,
                          "--cgroup", "off")
    address = server.addresses[0]
    try:
        for argv in (["sh", "-c", "cat; exit 3"], ["no-such-command"]):
            subprocess.run(ttyserve_command("exec", "--connect", address, "--", *argv),
                           input=b"12345", capture_output=True, timeout=20)
        sock, _ = open_running(server, "echo up; sleep 300", pty=False)
        sock.sendall(ctrl(1, {"type": "cancel"}))
        sock.recv(100)
        sock.close()
    finally:
        assert server.stop() == ServeExit.OK
    started = starts(journal)
    ends = assert_one_end_per_start(journal)
    first, failed, cancelled = (ends[s.id] for s in started)
    assert started[0].argv == ["sh", "-c", "cat; exit 3"] and started[0].pty is False
    assert (first.reason, first.code, first.bytes_in, first.bytes_out) == (Reason.EXIT, 3, 5, 5)
    assert started[1].pid is None and started[1].start_time is None
    assert failed.reason == Reason.SPAWN_FAILED and failed.errno == errno.ENOENT
    assert cancelled.reason == Reason.CANCELLED
    # The bytes on disk are the contract's format: the tag first, a spawn failure's null pid
    # written, members left None omitted.
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert list(lines[0]) == ["event", "id", "at", "peer", "argv", "pty", "pid", "start_time",
                              "principal", "target"]
    assert lines[0]["target"] is None  # (always written: null on this host)
    assert lines[0]["event"] == "session.start" and lines[0]["start_time"] > 0
    failed_start = next(line for line in lines if line["id"] == started[1].id)
    assert failed_start["pid"] is None and "start_time" not in failed_start
    first_end = next(line for line in lines if line["id"] == started[0].id
                     and line["event"] == "session.end")
    assert first_end == {"event": "session.end", "id": started[0].id, "at": first_end["at"],
                         "reason": "exit", "code": 3, "bytes_in": 5, "bytes_out": 5,
                         "principal": lines[0]["principal"], "target": None}
    listing = subprocess.run(ttyserve_command("sessions", "--journal", str(journal)),
                             capture_output=True, timeout=20, text=True)
    assert listing.returncode == 0
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:5] == ["STARTED", "ID", "PID", "PTY", "REASON"]
    assert [line.split()[4] for line in lines[1:]] == ["exit", "spawn_failed", "cancelled"]
    as_json = subprocess.run(ttyserve_command("sessions", "--journal", str(journal), "--json"),
                             capture_output=True, timeout=20, text=True)
    assert [json.loads(line)["end"]["reason"] for line in as_json.stdout.splitlines()] == [
        "exit", "spawn_failed", "cancelled"]


def test_sigterm_with_50_busy_sessions(short_dir: Path) -> None:
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal), "--shutdown-timeout", "20")
    sessions = [open_running(server, "echo up; while :; do echo busy; sleep 0.01; done",
                             pty=i % 2 == 0) for i in range(50)]
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    exits = 0
    for sock, _ in sessions:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        sock.close()
        frames = FrameDecoder(64 << 20).feed(data)
        last = json.loads(frames[-1].payload) if frames[-1].kind is FrameKind.CTRL_OUT else {}
        exits += last.get("type") == "exit"
    assert server.wait(20) == ServeExit.OK
    assert time.monotonic() - started < 20
    ends = assert_one_end_per_start(journal)
    assert exits == 50
    assert [e.reason for e in ends.values()] == [Reason.SHUTDOWN] * 50


IGNORES_HUP = "trap '' HUP; echo up; while :; do sleep 1; done"  # its sleeps ignore it too


@pytest.mark.asyncio
async def test_a_shutdown_kills_what_ignores_the_hang_up_after_the_kill_grace(
        short_dir: Path) -> None:
    """Shutdown hangs up as `cancel` does: SIGKILL after the kill grace, so sessions that
    ignore SIGHUP (pipe and PTY; one detached, one detachable attached from another
    connection) neither hold the drain nor outlive the server, and each has its end."""
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal), "--shutdown-timeout", "30")
    address = server.addresses[0]
    try:
        async with connect(address, multiplex=True) as conn, \
                connect(address, multiplex=True) as other:
            attached = [await conn.spawn([SH, "-c", IGNORES_HUP], pty=pty) for pty in (False, True)]
            detached = await conn.spawn([SH, "-c", IGNORES_HUP], pty=True, detachable=True)
            moved = await conn.spawn([SH, "-c", IGNORES_HUP], pty=False, detachable=True)
            for session in (*attached, detached, moved):
                assert (await session.receive()) is not None  # "up": it runs, HUP ignored
            await detached.detach()
            taken = await other.attach(moved.id or "", steal=True)
            pids = [s.pid or 0 for s in (*attached, detached, moved)]
            started = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(KILL_GRACE + 10):
                statuses = [await s.wait() for s in (*attached, taken)]
        assert server.wait() == ServeExit.OK
        elapsed = time.monotonic() - started
    finally:
        server.stop(signal.SIGKILL)
    assert [status.signal for status in statuses] == ["KILL"] * 3
    assert KILL_GRACE * 0.9 <= elapsed < KILL_GRACE + 4, elapsed
    assert all(processes_in_group(pid) == [] for pid in pids)
    ends = assert_one_end_per_start(journal)
    assert len(ends) == 4
    assert {(e.reason, e.signal) for e in ends.values()} == {(Reason.SHUTDOWN, "KILL")}


@pytest.mark.asyncio
@pytest.mark.parametrize("forced_by", ["watchdog", "second signal"])
async def test_a_forced_shutdown_kills_every_session_and_writes_its_end(
        short_dir: Path, forced_by: str) -> None:
    """A client that stops reading holds its sessions' exits, and so the drain: the watchdog
    ends it with exit 1; a second SIGTERM does at once, before the kill grace. Either way
    the sessions, detachable or not, die with the server and have their end records."""
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal), "--shutdown-timeout", "2")
    # Neither a hang-up nor a closed pipe ends it: only a kill does.
    flood = "trap '' HUP PIPE; echo up; while :; do echo flooding; done 2>/dev/null"
    held = [open_running(server, script, pty=False, detachable=detachable)
            for script in (flood, IGNORES_HUP)  # no client reads after the first output
            for detachable in (False, True)]
    gone, _ = held[-1]
    gone.close()  # its session goes on detached, its connection gone
    assert await wait_until(lambda: any(isinstance(r, SessionDetach)
                                        for r in read_file(str(journal)).records), 10)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    if forced_by == "second signal":  # once the first was taken (two pending are one)
        assert await wait_until(lambda: "shutting down" in server.stderr_tail(), 10)
        server.proc.send_signal(signal.SIGTERM)
    try:
        assert server.wait(20) == ServeExit.ERROR
        elapsed = time.monotonic() - started
        assert (2 if forced_by == "watchdog" else 0) <= elapsed < 6, elapsed
        assert all(processes_in_group(pgid) == [] for _, pgid in held)
    finally:
        for sock, pgid in held:
            sock.close()
            kill_group(pgid)  # (what a broken server would leave)
    ends = assert_one_end_per_start(journal)
    assert len(ends) == len(held) and {e.reason for e in ends.values()} == {Reason.SHUTDOWN}


def test_a_session_cancelled_in_the_batch_of_its_open_has_both_records(short_dir: Path) -> None:
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal), "--command", SH)
    try:
        for _ in range(5):
            with blocking_unix_socket(server.addresses[0].removeprefix("unix:")) as sock:
                sock.sendall(HELLO + ctrl(1, Open(argv=["sleep", "30"], pty=False))
                             + ctrl(1, Cancel()))
                # its answers, until it closes the connection after the cancel
                data = b"".join(iter(functools.partial(sock.recv, 65536), b""))
            assert control_of(FrameDecoder().feed(data)[0])["type"] == "welcome"
    finally:
        assert server.stop() == ServeExit.OK
    ends = assert_one_end_per_start(journal)
    assert len(ends) == 5 and {e.reason for e in ends.values()} == {Reason.CANCELLED}


QUIET = ["sleep", "86400"]  # no SIGPIPE or EOF ends it by chance: only a signal does


@pytest.mark.asyncio
async def test_a_server_killed_right_after_opened_leaves_no_session_without_its_records(
        short_dir: Path) -> None:
    """SIGKILL the moment the client holds an `opened`, many times over: every `opened` it
    saw has its start record, each start gets exactly one end (the killed server's are
    crash-inferred), and the next server hangs up every process of those sessions."""
    journal = short_dir / "journal.jsonl"
    seen: list[int] = []  # the pids of every `opened` the client saw
    for round_ in range(8):
        server = start_server(short_dir, "--journal", str(journal))
        try:
            pids = await open_until_killed(server, sessions=12, kill_after=1 + round_ % 12)
        finally:
            server.stop(signal.SIGKILL)
        assert pids, "no session opened before the kill"
        seen += pids
    server = start_server(short_dir, "--journal", str(journal))  # recovers, then serves
    # With containment, even a process spawned just before a kill, whose start record never
    # reached the disk, is found by its cgroup: every killed server's directory is gone.
    servers = {os.path.dirname(s.cgroup) for s in starts(journal) if s.cgroup is not None}
    assert [d for d in servers if os.path.exists(d)] == []
    assert server.stop() == ServeExit.OK
    recorded = {s.pid: s.id for s in starts(journal)}
    assert set(seen) <= set(recorded), "an opened session has no start record"
    ends = assert_one_end_per_start(journal)
    assert {ends[recorded[pid]].reason for pid in seen} == {Reason.CRASH_INFERRED}
    assert all(processes_in_group(pid) == [] for pid in seen)  # nothing of them runs


async def open_until_killed(server: ServerProcess, sessions: int, kill_after: int) -> list[int]:
    """Open ``sessions`` quiet sessions at once on one connection and SIGKILL the server as
    soon as ``kill_after`` of them were answered; the pids of those answered.

    The client hangs up only once the server has: a worker of `--workers N` serves on for
    the milliseconds its supervisor takes to die, and a hang-up then would truly cancel."""
    pids: list[int] = []
    async with connect(server.addresses[0], multiplex=True) as conn:
        opened = []

        async def open_one() -> None:
            try:
                session = await conn.spawn(QUIET, pty=False)
            except (ConnectionLost, RequestError):
                return  # the kill came first
            assert session.pid is not None
            pids.append(session.pid)
            opened.append(session)
            if len(pids) == kill_after:
                os.kill(server.pid, signal.SIGKILL)  # at once: no await since `opened`

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for _ in range(sessions):
                    tg.start_soon(open_one)
            with pytest.raises(ConnectionLost):
                await opened[0].wait()
    return pids


@pytest.mark.asyncio
async def test_a_graceful_shutdown_records_how_each_session_really_ended(
        short_dir: Path) -> None:
    """Shut down while one process has exited by itself (its session still drains the
    output a background job holds open), one ignores the hang-up and exits by itself
    later, and one is ended by the hang-up: only the last is `shutdown`."""
    journal = short_dir / "journal.jsonl"
    server = start_server(short_dir, "--journal", str(journal), "--linger", "30")
    scripts = {
        "exited": "trap '' HUP; sleep 3 & echo up; exit 3",  # sleep holds stdout open
        "ignores": "trap '' HUP; echo up; sleep 0.3; exit 236",  # within the kill grace
        "ended": "echo up; exec sleep 86400",
    }
    statuses: dict[str, Exit] = {}
    try:
        async with connect(server.addresses[0], multiplex=True) as conn:
            sessions = {name: await conn.spawn([SH, "-c", script], pty=False)
                        for name, script in scripts.items()}
            for session in sessions.values():
                assert (await session.receive()) is not None  # "up": it runs
            exited = sessions["exited"].pid or 0
            assert await wait_until(lambda: not Path(f"/proc/{exited}").exists(), 10)  # reaped
            server.proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                for name, session in sessions.items():
                    statuses[name] = await session.wait()
        assert server.wait() == ServeExit.OK
    finally:
        server.stop(signal.SIGKILL)
    assert (statuses["exited"].code, statuses["ignores"].code) == (3, 236)
    assert statuses["ended"].signal == "HUP"
    pids = {s.pid: s.id for s in starts(journal)}
    ends = assert_one_end_per_start(journal)
    reasons = {name: ends[pids[sessions[name].pid]] for name in scripts}
    assert {name: (end.reason, end.code) for name, end in reasons.items()} == {
        "exited": (Reason.EXIT, 3), "ignores": (Reason.EXIT, 236),
        "ended": (Reason.SHUTDOWN, -1)}
    assert reasons["ended"].signal == "HUP"
