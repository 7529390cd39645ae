"""`serve --record DIR` over real sockets: asciicast v3 files that replay to the screen the
client saw, input only when asked, no file for pipes, detached sessions, a crash's prefix, and
a directory that cannot be written."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pyte
import pytest
from helpers import SH, ServerProcess, kill_group, start_server

from ttyserve.client import Session, connect
from ttyserve.errors import ConnectionLost, SessionDetached
from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Exit
from ttyserve.server.journal import SessionStart, read_file
from ttyserve.server.sessions.recording import Recording

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]

Event = list[Any]  # [interval, code, data]

# The markers are computed by the shell, so they are in the output but not in the header's
# command.
SCREEN_SCRIPT = r"""
printf '\033[1;31mred\033[0m caf'; sleep 0.2; printf '\303'; sleep 0.2; printf '\251\n'
i=0; while [ $i -lt 30 ]; do echo "line $i"; i=$((i+1)); done
printf 'ready-%s\n' $((6*7)); read x; stty size; printf '\033[5;10Hafter\n'; exit 3
"""


@pytest.fixture
def record_dir(short_dir: Path) -> Path:
    return short_dir / "rec"  # missing: the server makes it


@pytest.fixture
def server(short_dir: Path, record_dir: Path) -> Iterator[ServerProcess]:
    process = start_server(short_dir, "--command", SH, "--linger", "1",
                           "--record", str(record_dir), "--journal", str(short_dir / "j.jsonl"))
    try:
        yield process
    finally:
        process.stop()


def parse_cast(path: Path) -> tuple[dict[str, Any], list[Event], str]:
    """The header and events of every complete line, and what follows the last newline."""
    *lines, rest = path.read_text().split("\n")
    assert lines, f"{path} has no header line"
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]], rest


def the_cast(directory: Path) -> Path | None:
    files = list(directory.glob("*.cast")) if directory.is_dir() else []
    assert len(files) <= 1, files
    return files[0] if files else None


async def cast_until(directory: Path, done: Callable[[list[Event]], bool],
                     timeout: float = 10) -> tuple[Path, dict[str, Any], list[Event]]:
    """Poll the one recording in ``directory`` (a file tells nobody it grew) until ``done``."""
    with anyio.fail_after(timeout):
        while True:
            path = the_cast(directory)
            if path is not None and path.stat().st_size:
                head, events, _ = parse_cast(path)
                if done(events):
                    return path, head, events
            await anyio.sleep(0.02)


def ended(events: list[Event]) -> bool:
    return bool(events) and events[-1][1] == "x"


def output_of(events: list[Event]) -> str:
    return "".join(data for _, code, data in events if code == "o")


async def read_until(session: Session, marker: bytes, seen: bytearray) -> None:
    while marker not in seen:
        chunk = await session.receive()
        assert chunk is not None, f"the session ended before {marker!r}: {bytes(seen)!r}"
        seen += chunk.data


def replay(head: dict[str, Any], events: list[Event]) -> pyte.Screen:
    screen = pyte.Screen(head["term"]["cols"], head["term"]["rows"])
    stream = pyte.Stream(screen)
    for _, code, data in events:
        if code == "o":
            stream.feed(data)
        elif code == "r":
            cols, rows = map(int, data.split("x"))
            screen.resize(lines=rows, columns=cols)
    return screen


@pytest.mark.asyncio
async def test_replay_gives_the_screen_the_client_saw(
        server: ServerProcess, record_dir: Path, short_dir: Path) -> None:
    argv = [SH, "-c", SCREEN_SCRIPT]
    seen = pyte.Screen(40, 10)  # what the client received, on a terminal of its own
    stream = pyte.ByteStream(seen)
    before, started = time.time(), time.monotonic()
    async with connect(server.addresses[0]) as conn:
        session = await conn.spawn(argv, pty=True, rows=10, cols=40, term="screen-256color")
        first = bytearray()
        await read_until(session, b"ready-42\r\n", first)
        stream.feed(bytes(first))
        await session.resize(15, 60)
        seen.resize(lines=15, columns=60)
        await session.send(b"\n")
        async for chunk in session:
            stream.feed(chunk.data)
        assert session.status is not None and session.status.code == 3
    elapsed = time.monotonic() - started

    path, head, events = await cast_until(record_dir, ended)
    assert head == {"version": 3, "term": {"cols": 40, "rows": 10, "type": "screen-256color"},
                    "timestamp": head["timestamp"], "command": shlex.join(argv)}
    assert before - 1 <= head["timestamp"] <= time.time()
    assert events[-1][1:] == ["x", "3"] and [e[1] for e in events].count("x") == 1
    assert [e[2] for e in events if e[1] == "r"] == ["60x15"]
    # Intervals since the previous event: non-negative, adding up to no more than the
    # session lasted (times since the start would add up to far more: 30 lines came late).
    intervals = [e[0] for e in events]
    assert all(isinstance(t, float | int) and t >= 0 for t in intervals)
    assert 0.399 <= sum(intervals) <= elapsed + 0.01, intervals

    replayed = replay(head, events)
    assert replayed.display == seen.display
    assert (replayed.cursor.x, replayed.cursor.y) == (seen.cursor.x, seen.cursor.y)
    assert "café" in output_of(events)  # é came in two reads, and was not mangled
    assert any(line.startswith("15 60") for line in replayed.display)
    assert replayed.display[4][9:14] == "after"

    # DIR/ID.cast, ID the journal's id; the directory private, the file its owner's alone.
    (start,) = [r for r in read_file(str(short_dir / "j.jsonl")).records
                if isinstance(r, SessionStart)]
    assert path == record_dir / f"{start.id}.cast"
    assert stat.S_IMODE(record_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.asyncio
@pytest.mark.parametrize("record_input", [False, True])
async def test_input_is_recorded_only_when_asked(short_dir: Path, record_input: bool) -> None:
    record_dir = short_dir / "rec"
    args = ["--record", str(record_dir), *(["--record-input"] if record_input else [])]
    server = start_server(short_dir, "--command", SH, *args)
    try:
        async with connect(server.addresses[0]) as conn:
            script = "echo ready-$((6*7)); read x; echo got-${#x}"  # (echo on: section 14
            # keeps input read unseen out: tests/integration/test_terminal_state.py)
            session = await conn.spawn([SH, "-c", script], pty=True)
            await read_until(session, b"ready-42", bytearray())
            await session.send(b"hunter2\n")
            assert (await session.wait()).code == 0
        path, _, events = await cast_until(record_dir, ended)
    finally:
        server.stop()
    typed = "".join(data for _, code, data in events if code == "i")
    assert "got-7" in output_of(events)
    if record_input:
        assert typed == "hunter2\n"
    else:
        assert typed == "" and '"i"' not in path.read_text()


@pytest.mark.asyncio
async def test_pipe_sessions_write_no_file(server: ServerProcess, record_dir: Path) -> None:
    async with connect(server.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", "echo piped"], pty=False)
        assert (await session.wait()).code == 0
    # A file is made before `opened` is sent: had there been one, it would be there now.
    assert the_cast(record_dir) is None


@pytest.mark.asyncio
async def test_a_detached_session_keeps_recording(
        server: ServerProcess, record_dir: Path, short_dir: Path) -> None:
    go = short_dir / "go"
    script = (f"echo before; while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.02; done; "
              "echo detached-$((6*7)); read x; exit 5")
    async with connect(server.addresses[0], multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", script], pty=True, detachable=True)
        assert session.id is not None
        await read_until(session, b"before", bytearray())
        await session.detach()
        with pytest.raises(SessionDetached):
            while (chunk := await session.receive()) is not None:
                assert chunk.stream == "stdout"  # a PTY has one output
    go.touch()  # only now, with nobody attached, does the process print its marker
    path, _, _ = await cast_until(record_dir, lambda e: "detached-42" in output_of(e))
    assert path.name == f"{session.id}.cast"
    async with connect(server.addresses[0], multiplex=True) as conn:
        again = await conn.attach(session.id)
        await again.send(b"\n")
        assert (await again.wait()).code == 5
    _, _, events = await cast_until(record_dir, ended)
    assert events[-1][1:] == ["x", "5"]


@pytest.mark.asyncio
async def test_a_killed_server_leaves_whole_lines(short_dir: Path) -> None:
    record_dir = short_dir / "rec"
    server = start_server(short_dir, "--command", SH, "--record", str(record_dir))
    pgid: int | None = None
    try:
        async with connect(server.addresses[0]) as conn:
            script = ("echo mark-$((6*7)); i=0; "
                      "while :; do echo \"line $i é\"; i=$((i+1)); done")
            session = await conn.spawn([SH, "-c", script], pty=True)
            pgid = session.pid
            await read_until(session, b"mark-42", bytearray())
            # The marker reaches the file within the flush delay, the output flowing on.
            path, _, _ = await cast_until(record_dir, lambda e: "mark-42" in output_of(e))
            server.stop(signal.SIGKILL)
            with pytest.raises(ConnectionLost):
                async for chunk in session:
                    assert chunk.stream == "stdout"  # a PTY has one output
    finally:
        groups = [pgid, *server.session_children()]  # the session's, before it is orphaned
        server.stop(signal.SIGKILL)
        for group in groups:
            if group is not None:
                kill_group(group)
    # Every complete line parses (parse_cast leaves out what follows the last newline: a
    # line the kill may have cut).
    head, events, _ = parse_cast(path)
    assert head["version"] == 3
    assert "mark-42" in output_of(events) and all(e[1] == "o" for e in events)


@pytest.mark.asyncio
async def test_a_directory_that_cannot_be_written_does_not_stop_the_session(
        short_dir: Path) -> None:
    blocker = short_dir / "file"
    blocker.write_text("not a directory")
    server = start_server(short_dir, "--command", SH, "--record", str(blocker / "rec"))
    try:
        async with connect(server.addresses[0], multiplex=True) as conn:
            session = await conn.spawn([SH, "-c", "echo still-$((6*7)); exit 4"], pty=True)
            seen = bytearray()
            async for chunk in session:
                seen += chunk.data
            assert b"still-42" in seen and session.status == Exit(code=4)
            second = await conn.spawn([SH, "-c", "exit 0"], pty=True)
            assert (await second.wait()).code == 0
    finally:
        code = server.stop()
    assert code == 0
    logged = [line for line in server.stderr_tail().splitlines() if "recording" in line]
    assert len(logged) == 2, logged  # once per session
    assert all("unrecorded" in line for line in logged)


@pytest.mark.asyncio
async def test_a_write_that_fails_stops_the_recording_with_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    fd = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC
    recording = Recording(fd, "/dev/full", with_input=False)
    with caplog.at_level(logging.ERROR, logger="ttyserve"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(recording.run)
            for _ in range(3):
                recording.output(FrameKind.STDOUT, b"x" * 100)
                with anyio.fail_after(5):
                    while not caplog.records:  # until the flusher's write failed
                        await anyio.sleep(0.01)
            recording.resized(30, 100)
            await recording.aclose(Exit(code=0))
    assert [r.message for r in caplog.records] == [
        "recording /dev/full: [Errno 28] No space left on device; "
        "the session goes on unrecorded"]
