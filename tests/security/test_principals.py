"""`serve --principals FILE` (contracts.md, "One door to many hosts"): every listener, Unix
sockets included, admits only the file's tokens, each as its principal; a principal with
`local = false` may not run sessions here (journaled); SIGHUP reads the file again, and a
principal removed from it loses its connections and its sessions."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from helpers import ServerProcess, start_server, ttyserve_command

from ttyserve.client import connect
from ttyserve.errors import ErrorCode, RequestError
from ttyserve.exitcodes import ServeExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
ALICE, BOB, CI, CAROL = "alice-token", "bob-token", "ci-token", "carol-token"


def entry(name: str, token: str, local: bool = True) -> str:
    return (f'[principals.{name}]\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"'
            f'\nlocal = {str(local).lower()}\n')


@pytest.fixture
def principals(short_dir: Path) -> Path:
    path = short_dir / "principals.toml"
    path.write_text(entry("alice", ALICE) + entry("bob", BOB) + entry("ci", CI, local=False))
    return path


@pytest.fixture
def door(short_dir: Path, principals: Path) -> Iterator[ServerProcess]:
    server = start_server(short_dir, "--principals", str(principals), "--journal",
                          str(short_dir / "journal"), "--command", "/bin/sh")
    try:
        yield server
    finally:
        server.stop()


def journal(short_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (short_dir / "journal").read_text().splitlines()]


def until_logged(server: ServerProcess, text: str) -> None:
    deadline = time.monotonic() + 10
    while text not in server.stderr_tail():  # (no event: a log line)
        assert time.monotonic() < deadline, server.stderr_tail()
        time.sleep(0.05)


@pytest.mark.asyncio
async def test_each_token_is_its_principal_and_a_uid_alone_is_not_enough(
        door: ServerProcess) -> None:
    address = door.addresses[0]
    for token in (None, "a guess"):
        with pytest.raises(RequestError) as refused:
            async with connect(address, token=token) as conn:
                await conn.list_sessions()
        assert refused.value.code == ErrorCode.UNAUTHORIZED
    async with connect(address, token=ALICE, multiplex=True) as alice:
        session = await alice.spawn(["sleep", "30"], pty=False, detachable=True)
        async with connect(address, token=BOB, multiplex=True) as bob:
            assert await bob.list_sessions() == []  # another principal's: not seen
            with pytest.raises(RequestError) as refused:
                await bob.attach(str(session.id))
            assert refused.value.code == ErrorCode.NO_SUCH_SESSION
        assert [s.session for s in await alice.list_sessions()] == [session.id]
        await session.cancel()


@pytest.mark.asyncio
async def test_a_principal_without_local_is_forbidden_here_and_journaled(
        door: ServerProcess, short_dir: Path) -> None:
    address = door.addresses[0]
    async with connect(address, token=CI) as ci:
        with pytest.raises(RequestError) as refused:
            await ci.spawn(["true"], pty=False)
    assert refused.value.code == ErrorCode.FORBIDDEN and "local = false" in str(refused.value)
    async with connect(address, token=ALICE) as alice:
        session = await alice.spawn(["true"], pty=False)
        await session.wait()
    records = journal(short_dir)
    assert [(r["principal"], r["code"], r.get("target")) for r in records
            if r["event"] == "session.refused"] == [("ci", ErrorCode.FORBIDDEN, None)]
    assert [r["principal"] for r in records if r["event"] == "session.start"] == ["alice"]


def test_a_token_file_beside_principals_is_a_usage_error_and_a_bad_file_a_config_error(
        short_dir: Path, principals: Path, workers: int) -> None:
    token = short_dir / "token"
    token.write_text("x" * 20)
    token.chmod(0o600)
    both = subprocess.run(ttyserve_command(
        "serve", f"--listen=unix:{short_dir / 'a.sock'}", f"--workers={workers}",
        "--principals", str(principals), "--token-file", str(token)),
        capture_output=True, text=True, timeout=30)
    assert both.returncode == ServeExit.USAGE and "--token-file" in both.stderr, both.stderr
    broken = short_dir / "broken.toml"
    broken.write_text('[principals.x]\ntoken_sha256 = "nope"\n')
    bad = subprocess.run(ttyserve_command(
        "serve", f"--listen=unix:{short_dir / 'b.sock'}", f"--workers={workers}",
        "--principals", str(broken)), capture_output=True, text=True, timeout=30)
    assert bad.returncode == ServeExit.CONFIG, bad.stderr
    assert f"principals file {broken}" in bad.stderr and "64 hex digits" in bad.stderr


@pytest.mark.asyncio
async def test_sighup_reads_the_file_again_and_a_removed_principal_loses_everything(
        door: ServerProcess, principals: Path, short_dir: Path) -> None:
    address = door.addresses[0]
    async with connect(address, token=BOB, multiplex=True) as bob:
        session = await bob.spawn(["sh", "-c", "trap '' HUP; echo up; sleep 30"],
                                  pty=False, detachable=True)
        assert (await session.receive()) is not None  # it runs, its trap set
        principals.write_text(entry("alice", ALICE) + entry("carol", CAROL))
        door.proc.send_signal(signal.SIGHUP)
        with anyio.fail_after(20), pytest.raises(RequestError) as closed:
            await session.wait()  # bob's connection is closed, and says why
        assert "principal was removed" in str(closed.value)
    async with connect(address, token=CAROL) as carol:  # a new principal, admitted
        assert await carol.list_sessions() == []
    with pytest.raises(RequestError):
        async with connect(address, token=BOB) as bob:
            await bob.list_sessions()
    with anyio.fail_after(20):  # bob's session hung up and killed after the grace
        while not any(r["event"] == "session.end" and r["id"] == session.id
                      for r in journal(short_dir)):
            await anyio.sleep(0.05)  # (no event a client sees: the journal's line)
    principals.write_text("[principals.carol\n")  # broken: the old ones are kept
    door.proc.send_signal(signal.SIGHUP)
    until_logged(door, "the principals read before are kept")
    async with connect(address, token=CAROL) as carol:
        assert await carol.list_sessions() == []
