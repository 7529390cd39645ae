"""`ttyserve recording convert --to v2 FILE [-o OUT]` (contracts.md) from real subprocesses:
a recording of `serve --record` as asciicast v2 that Debian's asciinema 2.2 prints (and the
v3 file it refuses, which is why the command exists); exit 2 with a line naming what is wrong,
and OUT left as it was, for anything that cannot be converted."""

from __future__ import annotations

import json
import os
import select
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import SH, ServerProcess, start_server, ttyserve_command

from ttyserve.backends.spawn import Stdio, encode_environment, spawn
from ttyserve.client import connect
from ttyserve.exitcodes import RecordingExit

pytestmark = pytest.mark.timeout(60)
PROG = "ttyserve recording convert: "
HEADER = {"version": 3, "term": {"cols": 80, "rows": 24, "type": "xterm"}, "timestamp": 1,
          "command": "sh"}
# Printed in two reads, a resize between them; the markers are computed by the shell, so
# they are in the output but not in the header's command.
SCRIPT = (r"printf 'hello \033[1mbold\033[0m caf\303\251 %s\n' $((6*7)); read x; "
          r"printf 'second %s\n' $((6*7)); stty size; exit 3")
NOT_INSTALLED = "asciinema is not installed (apt-get install asciinema)"


def convert(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command("recording", "convert", *map(str, args)),
                          capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)


def lines_of(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def server(short_dir: Path, workers: int) -> Iterator[ServerProcess]:
    process = start_server(short_dir, "--command", SH, "--linger", "1",
                           "--record", str(short_dir / "rec"))
    try:
        yield process
    finally:
        process.stop()


async def record(server: ServerProcess, directory: Path) -> tuple[Path, bytes]:
    """One PTY session of SCRIPT: its recording, once complete, and what the client got."""
    seen = bytearray()
    async with connect(server.addresses[0]) as conn:
        session = await conn.spawn([SH, "-c", SCRIPT], pty=True, rows=24, cols=80,
                                   term="xterm")
        while b"42\r\n" not in seen:
            chunk = await session.receive()
            assert chunk is not None, bytes(seen)
            seen += chunk.data
        await session.resize(30, 100)
        await session.send(b"\n")
        async for chunk in session:
            seen += chunk.data
        assert session.status is not None and session.status.code == 3
    with anyio.fail_after(10):  # written within half a second (contracts.md)
        while True:
            files = list(directory.glob("*.cast"))
            if files and '"x"' in files[0].read_text():
                return files[0], bytes(seen)
            await anyio.sleep(0.02)


@pytest.mark.asyncio
@pytest.mark.usefixtures("workers")
async def test_a_recording_of_serve_record_as_v2(server: ServerProcess,
                                                  short_dir: Path) -> None:
    path, seen = await record(server, short_dir / "rec")
    out = short_dir / "v2.cast"
    done = convert("--to", "v2", path, "-o", out)
    assert (done.returncode, done.stdout, done.stderr) == (RecordingExit.OK, "", "")
    head, *events = lines_of(out)
    v3_head, *v3_events = lines_of(path)
    assert head == {"version": 2, "width": 80, "height": 24,
                    "timestamp": v3_head["timestamp"], "command": v3_head["command"],
                    "env": {"TERM": "xterm"}}
    # The same events, each at the sum of the intervals before it; the exit a last marker.
    assert [e[1:] for e in events] == [e[1:] for e in v3_events[:-1]] + [["m", "exit 3"]]
    assert v3_events[-1][1:] == ["x", "3"]
    elapsed = 0.0
    for (absolute, *_), (interval, *_) in zip(events, v3_events, strict=True):
        elapsed += interval
        assert absolute == pytest.approx(elapsed, abs=1e-6)
    assert "".join(d for _, c, d in events if c == "o").encode() == seen
    assert ["r", "100x30"] in [e[1:] for e in events]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # it holds what the session printed

    # Without -o: the same lines on stdout.
    to_stdout = convert("--to", "v2", path)
    assert to_stdout.returncode == RecordingExit.OK and to_stdout.stdout == out.read_text()


@pytest.fixture
def asciinema() -> str:
    """Debian's asciinema (2.2 in Debian 12), found before any server is started."""
    path = shutil.which("asciinema")
    if path is None:
        pytest.skip(NOT_INSTALLED)
    return path


def run_at_a_terminal(argv: list[str], home: Path, timeout: float = 20) -> tuple[int, bytes]:
    """Run ``argv`` with a PTY as its controlling terminal (`asciinema cat` opens /dev/tty)
    and return its exit code and all it wrote there."""
    master, slave = os.openpty()
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
               "TERM": "xterm", "LANG": "C.UTF-8"}
        pid = spawn(argv[0], argv, encode_environment(env), str(home),
                    Stdio(tty_path=os.ttyname(slave)))
        os.close(slave)
        slave = -1
        written = b""
        deadline = time.monotonic() + timeout
        while True:  # until EIO: the terminal's last other side closed
            ready, _, _ = select.select([master], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"{argv} did not end: {written!r}"
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            written += chunk
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), written
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


@pytest.mark.asyncio
@pytest.mark.usefixtures("workers")
async def test_asciinema_2_prints_the_converted_recording(
        asciinema: str, server: ServerProcess, short_dir: Path) -> None:
    path, seen = await record(server, short_dir / "rec")
    out = short_dir / "v2.cast"
    assert convert("--to", "v2", path, "-o", out).returncode == RecordingExit.OK

    # Why the command exists: asciinema 2.x refuses the v3 file and prints none of it.
    code, written = run_at_a_terminal([asciinema, "cat", str(path)], short_dir)
    assert code != 0 and b"hello" not in written, written
    # The v2 file: exactly what the session printed (asciinema puts its terminal in raw
    # mode, so the terminal adds nothing).
    code, written = run_at_a_terminal([asciinema, "cat", str(out)], short_dir)
    assert (code, written) == (0, seen)


def v3_file(directory: Path, *events: str, tail: str = "") -> Path:
    path = directory / "rec.cast"
    path.write_text("".join(line + "\n" for line in [json.dumps(HEADER), *events]) + tail)
    return path


@pytest.fixture
def out(short_dir: Path) -> Path:
    """An OUT that exists already: a failed conversion must leave it as it was."""
    path = short_dir / "out.cast"
    path.write_text("keep me\n")
    return path


def assert_left_alone(out: Path) -> None:
    assert out.read_text() == "keep me\n"
    assert sorted(p.name for p in out.parent.iterdir() if p.name.endswith(".tmp")) == []


@pytest.mark.parametrize(("content", "says"), [
    ("", "rec.cast: empty: not an asciicast recording"),
    ("just some text\n", "rec.cast:1: not JSON: not a header of an asciicast v3 recording"),
    ('{"version": 2, "width": 80, "height": 24}\n[0.5, "o", "a"]\n',
     "rec.cast:1: already asciicast v2: nothing to convert"),
    (json.dumps(HEADER) + '\n[0.5, "o", "a"]\n[0.5, "o", "b\n[0.5, "o", "c"]\n',
     "rec.cast:3: not JSON: not an event of an asciicast v3 recording"),
    (json.dumps(HEADER) + '\n[-1, "o", "a"]\n',
     "rec.cast:2: the interval -1 is not a number of seconds, 0 or more"),
], ids=["empty", "text", "v2", "a broken line", "a negative interval"])
def test_what_is_not_a_recording_exits_2_naming_it(short_dir: Path, out: Path, content: str,
                                                   says: str) -> None:
    path = short_dir / "rec.cast"
    path.write_text(content)
    done = convert("--to", "v2", path, "-o", out)
    assert done.returncode == RecordingExit.NOT_CONVERTED == 2
    assert done.stderr == f"{PROG}{path.parent}/{says}\n" and done.stdout == ""
    assert_left_alone(out)


def test_a_file_that_is_not_utf8_exits_2(short_dir: Path, out: Path) -> None:
    path = v3_file(short_dir, '[0.5, "o", "a"]')
    path.write_bytes(path.read_bytes() + b'[0.5, "o", "\xff"]\n')
    done = convert("--to", "v2", path, "-o", out)
    assert done.returncode == 2 and done.stderr == f"{PROG}{path}: not UTF-8 text: not an " \
                                                   "asciicast recording\n"
    assert_left_alone(out)


def test_a_missing_file_exits_2_naming_it(short_dir: Path, out: Path) -> None:
    done = convert("--to", "v2", short_dir / "gone.cast", "-o", out)
    assert done.returncode == 2
    assert done.stderr == f"{PROG}{short_dir}/gone.cast: No such file or directory\n"
    assert_left_alone(out)


@pytest.mark.parametrize(("where", "reason"), [
    ("nowhere/v2.cast", "No such file or directory"),
    ("a-directory", "Is a directory"),  # found only at the rename: the temporary file goes
])
def test_an_out_that_cannot_be_written_exits_2_naming_it(short_dir: Path, where: str,
                                                         reason: str) -> None:
    path = v3_file(short_dir, '[0.5, "o", "a"]')
    (short_dir / "a-directory").mkdir()
    done = convert("--to", "v2", path, "-o", short_dir / where)
    assert done.returncode == 2
    assert done.stderr == f"{PROG}cannot write {short_dir / where}: {reason}\n"
    assert sorted(p.name for p in short_dir.rglob("*")) == ["a-directory", "rec.cast"]


def test_out_is_replaced_whole_and_may_be_file_itself(short_dir: Path, out: Path) -> None:
    path = v3_file(short_dir, '[0.5, "o", "a"]', '[0.25, "x", "0"]')
    assert convert("--to", "v2", path, "-o", out).returncode == 0
    assert lines_of(out)[1:] == [[0.5, "o", "a"], [0.75, "m", "exit 0"]]
    assert convert("--to", "v2", path, "-o", path).returncode == 0  # in place
    assert path.read_text() == out.read_text()


def test_a_cut_last_line_is_dropped_with_a_warning(short_dir: Path) -> None:
    """What a server killed while recording leaves (docs/cli.md): whole lines, then one cut."""
    path = v3_file(short_dir, '[0.5, "o", "a"]', tail='[0.25, "o", "b')
    done = convert("--to", "v2", path)
    assert done.returncode == 0
    assert [json.loads(line) for line in done.stdout.splitlines()][1:] == [[0.5, "o", "a"]]
    assert done.stderr == (f"{PROG}{path}:3: dropped the cut last line (what a server that "
                           "crashed while recording leaves)\n")


@pytest.mark.parametrize("args", [
    [], ["--to", "v2"], ["x.cast"], ["--to", "v3", "x.cast"], ["--to", "v2", "x", "--bogus"],
], ids=" ".join)
def test_usage_errors_exit_2_with_the_commands_usage(args: list[str]) -> None:
    done = convert(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ttyserve recording convert ")
