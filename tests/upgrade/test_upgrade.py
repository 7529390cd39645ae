"""Acceptance 3 (section 12): an upgrade in place keeps every detachable session, with the
new code installed at the server's own path; a broken install is refused by the dry run.

The server runs from a copy of the package (PYTHONPATH), which the test changes in place as
an operator's install would: a new version, or a syntax error."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import (
    SH,
    ServerProcess,
    control_of,
    ctrl,
    parent_of,
    raw_peer,
    start_server,
    wait_until,
)

from ttyserve.client import connect
from ttyserve.client.session import Lost, Resumed, Session
from ttyserve.errors import ErrorCode, RequestError
from ttyserve.exitcodes import ServeExit
from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Hello, Open
from ttyserve.server.handover import MEMFD_NAME
from ttyserve.server.journal import ServerUpgrade, SessionEnd, SessionStart, read_file
from ttyserve.version import __version__

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.usefixtures("workers")]

PACKAGE = Path(__file__).resolve().parents[2] / "ttyserve"
NEW_VERSION = "9.9.9+upgraded"
IDLE_PTY, IDLE_PIPE = 7, 8  # with the 5 below, 20 sessions
COUNTER = 'i=0; while [ ! -e "$STOP" ]; do echo $i; i=$((i+1)); sleep 0.002; done; exit 5'
EXITS_WHEN = 'while [ ! -e "$GO" ]; do sleep 0.005; done; sleep {delay}; exit {code}'
# The second one is told when the old server closes the connections; 60 ms later the new
# code is still starting (its imports take longer), so it exits where no code watches it:
# the new code must reap it, and not as an orphan.
INTO_THE_EXECVE = 0.06


@pytest.fixture
def install(tmp_path: Path) -> Path:
    """A copy of the package, installed where only this test's server looks."""
    root = tmp_path / "install"
    shutil.copytree(PACKAGE, root / "ttyserve", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def served(install: Path, short_dir: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """`ttyserve serve` from the copy, with a journal (its cwd holds no package of ours)."""
    server = start_server(short_dir, "--journal", str(short_dir / "journal"), "--linger", "1",
                          "--record", str(short_dir / "casts"),
                          env={"PYTHONPATH": str(install)}, cwd=tmp_path)
    try:
        yield server
    finally:
        server.stop()


def set_version(install: Path, version: str) -> None:
    (install / "ttyserve" / "version.py").write_text(f'__version__ = "{version}"\n')


def descriptors(pid: int) -> collections.Counter[str]:
    """The server's open descriptors by kind (`pipe`, `socket`, `anon_inode:[pidfd]`...)."""
    kinds: collections.Counter[str] = collections.Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        kinds[target.split(":[")[0] if ":[" in target and "inode" not in target
              else target] += 1
    return kinds


def held(server: ServerProcess) -> collections.Counter[str]:
    """`descriptors` of the processes that hold sessions (the workers, or the server)."""
    total: collections.Counter[str] = collections.Counter()
    for pid in server.worker_pids():
        total += descriptors(pid)
    return total


def journal_of(short_dir: Path) -> list[object]:
    return list(read_file(str(short_dir / "journal")).records)


def upgraded(short_dir: Path) -> list[ServerUpgrade]:
    return [r for r in journal_of(short_dir) if isinstance(r, ServerUpgrade)]


async def test_sessions_survive_an_upgrade(served: ServerProcess, install: Path,
                                           short_dir: Path, tmp_path: Path) -> None:
    address = served.addresses[0]
    env = {"STOP": str(tmp_path / "stop"), "GO": str(tmp_path / "go"),
           "GO2": str(tmp_path / "go2")}
    sockets = held(served)["socket"]  # no client connected yet
    # Two connections: with workers, they are served by different ones, and so are their
    # sessions (the second's idle PTYs, the first's idle pipes, an echo on each).
    async with connect(address, multiplex=True) as conn, \
            connect(address, multiplex=True) as other:
        idle = [await other.spawn(["cat"], pty=True, detachable=True) for _ in range(IDLE_PTY)]
        idle += [await conn.spawn(["cat"], pty=False, detachable=True) for _ in range(IDLE_PIPE)]
        counter = await conn.spawn([SH, "-c", COUNTER], pty=False, detachable=True, env=env)
        echoes = [await c.spawn(["cat"], pty=pty, detachable=True)
                  for c, pty in ((conn, True), (other, False))]
        early = await conn.spawn([SH, "-c", EXITS_WHEN.format(delay=0, code=42)], pty=True,
                                 detachable=True, env=env)
        late = await other.spawn(
            [SH, "-c", EXITS_WHEN.replace("$GO", "$GO2").format(delay=INTO_THE_EXECVE, code=43)],
            pty=False, detachable=True, env=env)
        ids = {s.id: s.pid for s in [*idle, counter, *echoes, early, late]}
        for session in [*idle, counter, *echoes, early, late]:
            await session.detach()
    assert len(ids) == 20 and None not in ids
    parents = {parent_of(pid or 0) for pid in ids.values()}
    assert parents == set(served.worker_pids())  # (one process, or both workers)
    assert await wait_until(lambda: held(served)["socket"] == sockets, 5)
    quiet = held(served)  # all 20 running, no client connected

    set_version(install, NEW_VERSION)
    events: list[Lost | Resumed] = []

    def heard(event: Lost | Resumed) -> None:
        events.append(event)
        if isinstance(event, Lost):  # the old server is closing or handing over: in the window
            Path(env["GO2"]).touch()

    async with connect(address, multiplex=True, heartbeat=1, on_resume=heard) as conn:
        streamed = await conn.attach(str(counter.id), resume=30)
        attached = [await conn.attach(str(s.id), resume=30) for s in echoes]
        out = bytearray()

        async def read_counter() -> None:
            async for chunk in streamed:
                out.extend(chunk.data)

        async with anyio.create_task_group() as group:
            group.start_soon(read_counter)
            assert await wait_until(lambda: out.count(b"\n") > 50, 10)
            os.kill(served.pid, signal.SIGUSR2)
            Path(env["GO"]).touch()  # ends during the dry run or the drain
            assert await wait_until(lambda: bool(upgraded(short_dir)), 30), served.stderr_tail()
            assert await wait_until(lambda: any(isinstance(e, Resumed) for e in events), 30)
            lines_then = out.count(b"\n")
            assert await wait_until(lambda: out.count(b"\n") > lines_then + 50, 10)
            Path(env["STOP"]).touch()
        assert (await streamed.wait()).code == 5
        numbers = out.decode().split()
        assert numbers == [str(i) for i in range(len(numbers))]  # each once, in order
        for session in attached:  # input after the upgrade reaches the process, once
            await session.send(b"after\n")
            seen = b""
            while b"after" not in seen.replace(b"\r", b""):
                chunk = await session.receive()
                assert chunk is not None
                seen += chunk.data
            await session.detach()
    assert {type(e) for e in events} == {Lost, Resumed}
    assert served.proc.poll() is None  # the same process all along
    # Nothing leaked across the execve: what the server holds is what it held before, but
    # for the three sessions that ended (two on pipes, one on a terminal and recorded; each
    # had a pidfd).
    ended = collections.Counter({"pipe": 6, "/dev/ptmx": 1, "anon_inode:[pidfd]": 3,
                                 str(short_dir / "casts" / f"{early.id}.cast"): 1})
    expected = quiet - ended
    assert await wait_until(lambda: held(served) == expected, 5), (
        f"more: {held(served) - expected}, fewer: {expected - held(served)}")

    async with connect(address, multiplex=True) as conn:
        listed = {info.session: info for info in await conn.list_sessions()}
        assert {i: info.pid for i, info in listed.items()} == {
            i: pid for i, pid in ids.items() if i != counter.id}
        for ended, code in ((early, 42), (late, 43)):
            session: Session = await conn.attach(str(ended.id))
            with anyio.fail_after(10):  # (its exit comes at once, or never)
                assert (await session.wait()).code == code
    assert served.stop() == ServeExit.OK

    records = journal_of(short_dir)
    [upgrade] = [r for r in records if isinstance(r, ServerUpgrade)]
    assert (upgrade.from_version, upgrade.to_version, upgrade.sessions) == (
        __version__, NEW_VERSION, 20)
    starts = collections.Counter(r.id for r in records if isinstance(r, SessionStart))
    ends = collections.Counter(r.id for r in records if isinstance(r, SessionEnd))
    assert starts == ends == collections.Counter(ids.keys())
    # The recording went on in the new code: one file, output from after the upgrade, and
    # the exit as its last event.
    cast = (short_dir / "casts" / f"{echoes[0].id}.cast").read_text().splitlines()
    events = [json.loads(line) for line in cast[1:]]
    assert "after" in "".join(e[2] for e in events if e[1] == "o")
    assert events[-1][1] == "x" and json.loads(cast[0])["version"] == 3


def dry_runs(server: ServerProcess) -> list[int]:
    """The children of the server's session holders (itself, or its workers) that run what
    it runs: the dry run of an upgrade."""
    command = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    holders = server.worker_pids()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            same = Path(f"/proc/{entry}/cmdline").read_bytes() == command
        except OSError:
            continue
        if same and int(stat[stat.rindex(")") + 2:].split()[1]) in holders:
            found.append(int(entry))
    return found


async def test_a_broken_install_is_refused_by_the_dry_run(
        served: ServerProcess, install: Path, short_dir: Path) -> None:
    """A syntax error in a module the server has not even imported yet (the web listeners'):
    the dry run imports every module, fails, and nothing changes."""
    http = install / "ttyserve" / "web" / "http.py"
    async with connect(served.addresses[0]) as conn:
        session = await conn.spawn(["cat"], pty=False, detachable=True)
        http.write_text(http.read_text() + "\ndef broken(:\n")
        set_version(install, NEW_VERSION)
        os.kill(served.pid, signal.SIGUSR2)
        assert await wait_until(lambda: bool(dry_runs(served)), 10, interval=0.002)
        assert await wait_until(lambda: not dry_runs(served), 30), served.stderr_tail()
        # The same connection, the same session: nothing was closed or handed over.
        await session.send(b"still here\n")
        chunk = await session.receive()
        assert chunk is not None and chunk.data == b"still here\n"
        await session.eof()
        assert (await session.wait()).code == 0
    assert upgraded(short_dir) == [], served.stderr_tail()
    assert served.proc.poll() is None


async def test_the_new_code_reads_the_configuration_anew(short_dir: Path, tmp_path: Path,
                                                         workers: int) -> None:
    """The configuration file changed before SIGUSR2: a listener it no longer names is
    closed (its socket file and lease gone), one it adds that cannot be bound (its port is
    taken) is left out with a line, and the session on the listener kept goes on. With
    workers the listeners are the supervisor's, which an upgrade does not re-execute: they
    stay as they were until a restart (design.md)."""
    kept, dropped = short_dir / "a.sock", short_dir / "b.sock"
    journal = short_dir / "journal"
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = tmp_path / "ttyserve.toml"
    config.write_text(f'listen = ["unix:{kept}", "unix:{dropped}"]\njournal = "{journal}"\n'
                      'insecure = true\n')
    server = start_server(short_dir, "--config", str(config), listen=[], expect_lines=2)
    try:
        async with connect(f"unix:{kept}") as conn:
            session = await conn.spawn(["cat"], pty=False, detachable=True)
            await session.detach()
        config.write_text(f'listen = ["unix:{kept}", "tcp:127.0.0.1:{port}"]\n'
                          f'journal = "{journal}"\ninsecure = true\n')
        os.kill(server.pid, signal.SIGUSR2)
        assert await wait_until(lambda: bool(upgraded(short_dir)), 30), server.stderr_tail()
        assert dropped.exists() is (workers > 1)
        assert Path(f"{dropped}.lock").exists() is (workers > 1)
        async with connect(f"unix:{kept}") as conn:
            again = await conn.attach(str(session.id))
            await again.send(b"still here\n")
            chunk = await again.receive()
            assert chunk is not None and chunk.data == b"still here\n"
            await again.eof()
            assert (await again.wait()).code == 0
        assert server.proc.poll() is None
    finally:
        assert server.stop() == ServeExit.OK
        taken.close()


def handing_over(pid: int) -> bool:
    """Whether the server holds the hand-over's state: from just before its execve until
    the new code has read it (while the new interpreter starts)."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if MEMFD_NAME in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    return True
    return False


async def test_a_signal_while_the_new_code_starts_waits_for_it(
        served: ServerProcess, short_dir: Path) -> None:
    """SIGUSR2 again once the hand-over began (after the dry run: its child has come and
    gone): the signal is held across the execve and the new code upgrades once more, where
    it would have killed the server, and every session with it."""
    async with connect(served.addresses[0]) as conn:
        session = await conn.spawn(["cat"], pty=False, detachable=True)
        await session.detach()
    os.kill(served.pid, signal.SIGUSR2)
    assert await wait_until(lambda: bool(dry_runs(served)), 10, interval=0.002)
    assert await wait_until(lambda: not dry_runs(served), 30)
    assert await wait_until(lambda: any(handing_over(pid) for pid in served.worker_pids()),
                            30, interval=0.001)
    os.kill(served.pid, signal.SIGUSR2)
    assert await wait_until(lambda: len(upgraded(short_dir)) == 2, 20), served.stderr_tail()
    assert served.proc.poll() is None
    async with connect(served.addresses[0]) as conn:
        again = await conn.attach(str(session.id))
        await again.send(b"twice\n")
        chunk = await again.receive()
        assert chunk is not None and chunk.data == b"twice\n"


async def test_the_drain_lets_undetachable_sessions_end_and_a_shutdown_ends_the_hand_over(
        short_dir: Path, tmp_path: Path) -> None:
    """--upgrade-drain 30: once the hand-over began (an `open` is refused with
    `server_restarting`), a session that cannot be reattached and ends by itself delivers its
    exit; a SIGTERM then ends the hand-over at once (no upgrade), and the shutdown hangs up
    the other one."""
    go = tmp_path / "go"
    journal = short_dir / "journal"
    server = start_server(short_dir, "--upgrade-drain", "30", "--journal", str(journal))
    try:
        async with connect(server.addresses[0], multiplex=True) as conn:
            alone = await conn.spawn(
                [SH, "-c", EXITS_WHEN.format(delay=0, code=7)], pty=False, env={"GO": str(go)})
            held = await conn.spawn(["sleep", "1000"], pty=False)
            os.kill(server.pid, signal.SIGUSR2)
            with anyio.fail_after(30):
                while True:  # each `true` ends at once: the next try follows its exit
                    try:
                        probe = await conn.spawn(["true"], pty=False)
                    except RequestError as exc:
                        assert exc.code == ErrorCode.SERVER_RESTARTING
                        break
                    await probe.wait()
            go.touch()
            assert (await alone.wait()).code == 7  # within the drain, its exit reaches us
            os.kill(server.pid, signal.SIGTERM)
            with anyio.fail_after(10):  # not the 30 s of the drain
                assert (await held.wait()).signal == "HUP"
        assert server.wait(timeout=10) == ServeExit.OK
    finally:
        server.stop()
    assert upgraded(short_dir) == []


async def test_a_writer_two_observers_and_a_grant_come_through_an_upgrade(
        served: ServerProcess, install: Path, short_dir: Path) -> None:
    """Section 11 across section 12: the writer and two observers (through a grant) resume at
    their offsets, each gets what was written after, once; the grant works afterwards, for
    a new observer, and its owner can still revoke it."""
    address = served.addresses[0]
    resumed: list[Session] = []

    def heard(event: Lost | Resumed) -> None:
        if isinstance(event, Resumed):
            resumed.append(event.session)

    async with connect(address, multiplex=True, on_resume=heard) as owner:
        writer = await owner.spawn(["cat"], pty=False, resume=30)
        shared = await owner.share(str(writer.id), ttl=600)
        async with connect(address, multiplex=True, grant=shared.grant,
                           on_resume=heard) as guest:
            observers = [await guest.attach(str(writer.id), role="observer", resume=30)
                         for _ in range(2)]
            watching = [writer, *observers]
            await writer.send(b"before\n")
            for session in watching:
                chunk = await session.receive()
                assert chunk is not None and chunk.data == b"before\n"
            set_version(install, NEW_VERSION)
            os.kill(served.pid, signal.SIGUSR2)
            assert await wait_until(lambda: bool(upgraded(short_dir)), 30), (
                served.stderr_tail())
            await writer.send(b"after\n")  # (it waits for the writer's resume)
            for session in watching:
                with anyio.fail_after(20):
                    chunk = await session.receive()
                assert chunk is not None and chunk.data == b"after\n"  # nothing twice
            # Each resumed (with workers, once per worker that closed a link it used, maybe
            # twice: the output above came once all the same).
            assert set(map(id, resumed)) == set(map(id, watching))
            assert [s.role for s in watching] == ["writer", "observer", "observer"]
        async with connect(address, multiplex=True, grant=shared.grant) as late:
            newcomer = await late.attach(str(writer.id), role="observer")
            await writer.send(b"later\n")
            seen = b""
            while not seen.endswith(b"later\n"):  # the scrollback, then what came live
                chunk = await newcomer.receive()
                assert chunk is not None
                seen += chunk.data
            assert seen == b"before\nafter\nlater\n"
            answer = await owner.unshare(shared.grant)
            assert answer.channels == 1
        await writer.eof()
        assert (await writer.wait()).code == 0


async def test_every_connection_hears_server_restarting_after_its_ending_sessions_exits(
        served: ServerProcess, short_dir: Path) -> None:
    """Section 12: every connection gets `server_restarting` on channel 0 before its close,
    also one whose sessions the upgrade ends: their `exit` first, then the error. A single
    session, two undetachable ones multiplexed, and one of each."""
    shapes = {"single": [False], "undetachable": [False, False], "mixed": [False, True]}
    async with contextlib.AsyncExitStack() as stack:
        peers = {}
        for shape, detachable in shapes.items():
            peer = peers[shape] = await stack.enter_async_context(raw_peer(served.addresses[0]))
            await peer.send(ctrl(0, Hello(protocol=1, multiplex=shape != "single")) + b"".join(
                ctrl(n, Open(argv=["cat"], pty=False, detachable=d))
                for n, d in enumerate(detachable, 1)))
            assert (await peer.next_control())["type"] == "welcome"
            for _ in detachable:
                assert (await peer.next_control())["type"] == "opened"
        os.kill(served.pid, signal.SIGUSR2)
        for shape, peer in peers.items():
            with anyio.fail_after(30):
                frames = await peer.frames_until_eof()
            last = control_of(frames[-1])
            assert frames[-1].channel == 0 and last["code"] == "server_restarting", (shape, last)
            for channel, detachable in enumerate(shapes[shape], 1):
                ending = [control_of(f)["type"] for f in frames if f.channel == channel
                          and f.kind is FrameKind.CTRL_OUT]
                assert ending == ([] if detachable else ["exit"]), (shape, channel, ending)
    assert await wait_until(lambda: bool(upgraded(short_dir)), 30), served.stderr_tail()
