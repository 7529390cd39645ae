"""`serve --cgroup`, the limits, several servers, and what a server killed hard leaves: with
the real `ttyserve serve` and real cgroups."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import anyio
import pytest
from conftest import alive, tree, writable_cgroup
from helpers import SH, parent_of, start_server, ttyserve_command, wait_until

from ttyserve.backends.cgroups import BASE_NAME, cgroup_of, instance_name
from ttyserve.client import connect
from ttyserve.exitcodes import ServeExit
from ttyserve.server.journal import Reason, SessionEnd, read_file

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


def serve_fails(tmp: Path, *args: str) -> tuple[int, str]:
    """Run `serve` that must not start: its exit code and stderr."""
    proc = subprocess.run(ttyserve_command("serve", f"--listen=unix:{tmp / 's.sock'}", *args),
                          capture_output=True, text=True, timeout=30)
    assert not proc.stdout, proc.stdout  # never listening
    return proc.returncode, proc.stderr


def controller_available(name: str) -> bool:
    own = writable_cgroup()
    return own is not None and name in Path(own, "cgroup.controllers").read_text().split()


async def session_cgroup(address: str, argv: list[str]) -> tuple[int, str]:
    """Open a detachable session running ``argv``; its pid and cgroup, once it runs."""
    async with connect(address) as conn:
        session = await conn.spawn(argv, pty=False, detachable=True)
        assert session.pid is not None
        cgroup = cgroup_of(session.pid)
        assert cgroup is not None
        await session.detach()
    return session.pid, cgroup


async def test_fork_bomb_is_held_at_the_pids_limit_or_serve_names_the_controller(
        short_dir: Path, cgroup_base: str) -> None:
    """This machine decides the branch (closing notes say which ran): with the pids
    controller, a fork bomb never holds more than 64 processes and dies whole; without it,
    `serve` refuses to start, exit 3, naming it."""
    if not controller_available("pids"):
        code, stderr = serve_fails(short_dir, f"--cgroup={cgroup_base}",
                                   "--session-pids-max=64")
        assert code == ServeExit.CONFIG, stderr
        assert "the pids controller is not available" in stderr, stderr
        return
    server = start_server(short_dir, f"--cgroup={cgroup_base}", "--session-pids-max=64")
    try:
        bomb = "b() { b & b; }; echo started; b"
        async with connect(server.addresses[0]) as conn:
            session = await conn.spawn([SH, "-c", bomb], pty=False)
            assert session.pid is not None
            cgroup = cgroup_of(session.pid)
            assert cgroup is not None
            assert await wait_until(lambda: len(tree(cgroup)) >= 60, 10)
            peak = 0
            for _ in range(50):
                peak = max(peak, int(Path(cgroup, "pids.current").read_text()))
                await anyio.sleep(0.01)
            assert 60 <= peak <= 64
            await session.cancel()
            assert await wait_until(lambda: not os.path.exists(cgroup), 5)
    finally:
        assert server.stop() == ServeExit.OK


async def test_a_pids_limit_below_the_servers_own_threads_is_refused(short_dir: Path) -> None:
    code, stderr = serve_fails(short_dir, "--session-pids-max=32")
    assert code == ServeExit.CONFIG
    assert "at least 64" in stderr, stderr


async def test_a_directory_that_is_no_cgroup_is_refused(short_dir: Path) -> None:
    code, stderr = serve_fails(short_dir, f"--cgroup={short_dir}")
    assert code == ServeExit.CONFIG
    assert "not in a cgroup v2 hierarchy" in stderr, stderr


async def test_limits_without_containment_are_refused(short_dir: Path) -> None:
    code, stderr = serve_fails(short_dir, "--cgroup=off", "--session-pids-max=100")
    assert code == ServeExit.CONFIG
    assert "cgroup off" in stderr, stderr


async def test_auto_puts_each_server_in_a_directory_of_its_own(tmp_path: Path) -> None:
    """auto: under a `ttyserve` child of the server's own cgroup, one directory per server
    (tests run many at once), each gone when its server stops."""
    if writable_cgroup() is None:
        pytest.skip("a writable cgroup v2 hierarchy is not installed here")
    servers = [start_server(tmp_path / name, "--cgroup=auto")
               for name in ("a", "b") if not (tmp_path / name).mkdir()]
    roots = []
    try:
        for server in servers:
            own = cgroup_of(server.pid)
            assert own is not None
            pid, cgroup = await session_cgroup(server.addresses[0], ["sleep", "1000"])
            root = os.path.join(own, BASE_NAME, str(instance_name(server.pid)))
            # The server's directory holds its sessions' cgroups; with workers, a directory
            # per worker holds its own.
            worker = parent_of(pid)
            assert os.path.dirname(cgroup) == (root if worker == server.pid else os.path.join(
                root, str(instance_name(worker))))
            roots.append(root)
        assert roots[0] != roots[1]
    finally:
        for server in servers:
            assert server.stop() == ServeExit.OK
    assert not any(os.path.exists(root) for root in roots)


async def test_off_leaves_sessions_in_the_servers_cgroup(short_dir: Path) -> None:
    server = start_server(short_dir, "--cgroup=off")
    try:
        pid, cgroup = await session_cgroup(server.addresses[0], ["sleep", "1000"])
        assert cgroup == cgroup_of(parent_of(pid))
    finally:
        assert server.stop() == ServeExit.OK
    assert not alive(pid)


async def test_the_next_start_kills_and_removes_what_a_killed_server_left(
        short_dir: Path, cgroup_base: str) -> None:
    journal = short_dir / "journal"
    args = (f"--cgroup={cgroup_base}", f"--journal={journal}")
    server = start_server(short_dir, *args)
    script = "setsid sleep 1000 & exec sleep 1000"
    pid, cgroup = await session_cgroup(server.addresses[0], [SH, "-c", script])
    assert await wait_until(lambda: len(tree(cgroup)) == 2, 5)
    pids = tree(cgroup)
    server.stop(signal.SIGKILL)
    try:
        assert all(alive(p) for p in pids)  # nothing ended them: the server died hard
        again = start_server(short_dir, *args)
        try:
            assert not any(alive(p) for p in pids)  # killed before it serves
            assert not os.path.exists(os.path.dirname(cgroup))  # the dead server's directory
            ends = [r for r in read_file(str(journal)).records if isinstance(r, SessionEnd)]
            assert [e.reason for e in ends] == [Reason.CRASH_INFERRED]
        finally:
            assert again.stop() == ServeExit.OK
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    del pid


async def test_what_a_server_without_journal_left_is_named_with_how_to_end_it(
        short_dir: Path, cgroup_base: str) -> None:
    """With no journal to say which sessions were its, the next start leaves a killed
    server's session cgroups as they are, and says which they are and how to end them: the
    command it gives works."""
    args = (f"--cgroup={cgroup_base}",)
    server = start_server(short_dir, *args)
    pid, cgroup = await session_cgroup(server.addresses[0], [SH, "-c", "exec sleep 1000"])
    server.stop(signal.SIGKILL)
    try:
        again = start_server(short_dir, *args)
        try:
            said = again.stderr_tail()
            assert alive(pid) and "still hold processes" in said, said
            advice = re.search(r"to end them: (for d in .*; done)", said)
            assert advice is not None and os.path.dirname(cgroup) in advice.group(1), said
            subprocess.run(["sh", "-c", advice.group(1)], check=True, timeout=10)
            assert await wait_until(lambda: not alive(pid), 5)
        finally:
            assert again.stop() == ServeExit.OK
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_auto_without_cgroup_v2_says_so_once_and_serves(short_dir: Path) -> None:
    """In a mount namespace with no cgroup v2 mounted (a real one: unshare, umount), `auto`
    prints its one line on stderr and serves, sessions in no cgroup of ours."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("root with unshare (util-linux) is not installed here: a mount namespace "
                    "is needed to hide cgroup v2")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    points = [line.split()[4] for line in mounts if " - cgroup2 " in line]
    umount = "; ".join(f"umount -l {point}" for point in points)
    argv = ["unshare", "--mount", "sh", "-c", f'{umount}; exec "$@"', "sh",
            *ttyserve_command("serve", f"--listen=unix:{short_dir / 's.sock'}")]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # `listening ...`: it serves
        assert line.startswith(b"listening "), process.stderr.read() if process.stderr else ""
        async with connect(f"unix:{short_dir / 's.sock'}") as conn:
            session = await conn.spawn(["true"], pty=False)
            assert (await session.wait()).code == 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    assert process.returncode == ServeExit.OK, err
    said = [line for line in err.decode().splitlines() if "containment is off" in line]
    assert len(said) == 1 and "no cgroup v2" in said[0], err
