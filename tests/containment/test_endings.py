"""Acceptance 1: a session's whole process tree lives in its cgroup and dies with the session,
whatever left the process group (setsid, a double-forked daemon), on every way it ends."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
from conftest import alive, contained_server, tree
from helpers import HELLO, SH, control_of, ctrl, raw_peer, wait_until

from ttyserve.backends.cgroups import cgroup_of
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Cancel, Open
from ttyserve.server.journal import SessionEnd, read_file

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

# Each leaves its process group: the first by setsid, the second as a daemon does (a fork
# that exits, setsid, its stdio let go).
ESCAPERS = {
    "setsid": "setsid sleep 1000 & echo started; exec sleep 1000",
    "daemon": "(setsid sleep 1000 </dev/null >/dev/null 2>&1 &); echo started; exec sleep 1000",
}
GONE_WITHIN = 2.0  # seconds: the contract's bound once the session is ended


async def start(peer, script: str, pty: bool, **members: object) -> int:  # type: ignore[no-untyped-def]
    """Open ``script`` and wait until its tree (the shell and what escaped) is up; its pid."""
    await peer.send(HELLO + ctrl(1, Open(argv=[SH, "-c", script], pty=pty, **members)))
    assert (await peer.next_control())["type"] == "welcome"
    opened = await peer.next_control()
    assert opened["type"] == "opened", opened
    seen = b""
    while b"started" not in seen:
        frame = await peer.next_frame()
        assert frame is not None and frame.kind is FrameKind.STDOUT
        seen += frame.payload
    return int(opened["pid"])  # type: ignore[call-overload]


async def until_exit(peer) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The session's `exit` message (all output before it read and dropped)."""
    while True:
        frame = await peer.next_frame()
        assert frame is not None, "no exit"
        if frame.kind is FrameKind.CTRL_OUT and (message := control_of(frame))["type"] == "exit":
            return message


async def escaped_tree(pid: int) -> tuple[str, list[int]]:
    """The session's cgroup and every process in it, once the escaper is among them."""
    cgroup = cgroup_of(pid)
    assert cgroup is not None

    def escaped() -> bool:
        return any(group_of(p) not in (pid, None) for p in tree(cgroup))

    assert await wait_until(escaped, 5), "nothing left the process group: the test proves nothing"
    return cgroup, tree(cgroup)


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


async def all_gone(cgroup: str, pids: list[int], after: float = 0) -> None:
    """Within GONE_WITHIN of the session's end (``after`` seconds from now), every process
    of its tree has gone and its cgroup with them."""
    assert await wait_until(lambda: not any(alive(p) for p in pids), after + GONE_WITHIN), (
        [p for p in pids if alive(p)])
    assert await wait_until(lambda: not os.path.exists(cgroup), GONE_WITHIN), cgroup


def kill_left(pids: list[int]) -> None:
    """Clean-up after a failure: whatever of the tree is left, killed."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=sorted(ESCAPERS))
def escaper(request: pytest.FixtureRequest) -> str:
    return ESCAPERS[request.param]


@pytest.fixture(params=[False, True], ids=["pipe", "pty"])
def pty(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


DETACHED_TIMEOUT = 1  # seconds, for the ending by the detached timeout


@pytest.mark.parametrize("ending", ["cancel", "hang-up", "detached timeout", "shutdown"])
async def test_ending_a_session_ends_its_whole_tree(sock_path: Path, cgroup_base: str,
                                                    escaper: str, pty: bool,
                                                    ending: str) -> None:
    """Cancel; the client's connection going (a hang-up); nobody attaching within the
    detached timeout; a graceful shutdown: each kills what left the process group too."""
    members = ({"detachable": True, "detached_timeout": DETACHED_TIMEOUT}
               if ending == "detached timeout" else {})
    async with (contained_server(sock_path, cgroup_base) as (server, address, _c),
                raw_peer(address) as peer):
        cgroup, pids = await escaped_tree(await start(peer, escaper, pty, **members))
        try:
            if ending == "cancel":
                await peer.send(ctrl(1, Cancel()))
            elif ending == "shutdown":
                server.shutdown()
            else:  # hang-up, or detached: hung up DETACHED_TIMEOUT from now
                await peer.transport.aclose()
            await all_gone(cgroup, pids, after=DETACHED_TIMEOUT if members else 0)
        finally:
            kill_left(pids)


async def test_normal_exit_kills_leftovers(sock_path: Path, cgroup_base: str, escaper: str,
                                           pty: bool, short_dir: Path) -> None:
    """At a normal exit what is left is killed once the output is over, before the exit goes
    out; the journal counts it."""
    script = escaper.replace("exec sleep 1000", "read line; exit 3")
    journal = short_dir / "journal"
    async with (contained_server(sock_path, cgroup_base, journal=journal) as (_, address, _c),
                raw_peer(address) as peer):
        cgroup, pids = await escaped_tree(await start(peer, script, pty))
        try:
            await peer.send(encode_frame(FrameKind.STDIN, 1, b"go\n"))
            assert (await until_exit(peer))["code"] == 3
            # Killed before the exit went out, not just soon after.
            assert not any(alive(p) for p in pids), [p for p in pids if alive(p)]
            await all_gone(cgroup, pids)
        finally:
            kill_left(pids)
    ends = [r for r in read_file(str(journal)).records if isinstance(r, SessionEnd)]
    assert [(e.reason, e.code, e.leftovers, e.oom) for e in ends] == [("exit", 3, 1, False)]


async def test_leave_keeps_the_daemon(sock_path: Path, cgroup_base: str, pty: bool) -> None:
    """--leftovers leave: the daemon outlives the session, as with ssh; its cgroup goes once
    it has gone."""
    script = ESCAPERS["daemon"].replace("exec sleep 1000", "read line; exit 0")
    async with (contained_server(sock_path, cgroup_base, leftovers="leave") as (_, address, _c),
                raw_peer(address) as peer):
        cgroup, pids = await escaped_tree(await start(peer, script, pty))
        try:
            await peer.send(encode_frame(FrameKind.STDIN, 1, b"go\n"))
            assert (await until_exit(peer))["code"] == 0
            # The exit goes out once what is left was dealt with: here, left running.
            daemons = [p for p in pids if alive(p)]
            assert daemons and os.path.isdir(cgroup)
            kill_left(daemons)
            assert await wait_until(lambda: not os.path.exists(cgroup), 3), cgroup
        finally:
            kill_left(pids)
