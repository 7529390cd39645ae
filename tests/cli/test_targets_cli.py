"""`ttyserve targets --connect DOOR [--json]` lists what the caller may reach (contracts.md,
"One door to many hosts"): a table, or `{"targets": [...]}` as the `targets` message says
it, only the targets the caller's principal may open. `sessions --live` says which target
each session runs on, and `attach` takes a target's session by its id as any other."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import anyio
import pytest
from helpers import token_file, ttyserve_command
from target_doors import door

from ttyserve.client import connect
from ttyserve.exitcodes import ExecExit

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("workers")]
HOSTS = {"web-1": {"labels": {"role": "web", "env": "prod"}},
         "web-2": {"labels": {"role": "web"}}, "db-1": {"labels": {"role": "db"}}}
ALICE = "alice-token-of-the-door"


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command(*args), input=stdin, capture_output=True,
                          text=True, timeout=60)


def test_targets_lists_what_the_callers_principal_may_open(short_dir: Path) -> None:
    digest = hashlib.sha256(ALICE.encode()).hexdigest()
    principals = short_dir / "principals.toml"
    principals.write_text(f'[principals.alice]\ntoken_sha256 = "{digest}"\n'
                          'targets = ["role=web"]\n')
    token = str(token_file(short_dir, ALICE))
    with door(short_dir, HOSTS, "--principals", str(principals)) as server:
        address = server.addresses[0]
        listed = cli("targets", "--connect", address, "--token-file", token, "--json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == {"targets": [
            {"name": "web-1", "labels": {"role": "web", "env": "prod"}, "state": "idle"},
            {"name": "web-2", "labels": {"role": "web"}, "state": "idle"}]}
        table = cli("targets", "--connect", address, "--token-file", token)
        assert table.returncode == 0, table.stderr
        assert [line.split() for line in table.stdout.splitlines()] == [
            ["NAME", "STATE", "LABELS"], ["web-1", "idle", "role=web,env=prod"],
            ["web-2", "idle", "role=web"]]
        refused = cli("targets", "--connect", address)  # no token: no principal
        assert refused.returncode == ExecExit.FAILURE
        assert f"ttyserve targets: {address}: unauthorized" in refused.stderr


def test_targets_says_when_the_door_cannot_be_reached(short_dir: Path) -> None:
    result = cli("targets", "--connect", f"unix:{short_dir / 'none.sock'}")
    assert result.returncode == ExecExit.FAILURE
    assert result.stderr.startswith(f"ttyserve targets: unix:{short_dir / 'none.sock'}: ")


@pytest.mark.asyncio
async def test_sessions_live_names_the_target_and_attach_takes_its_session(
        short_dir: Path) -> None:
    with door(short_dir, {"web-1": {"persist": True}}) as server:
        address = server.addresses[0]
        async with connect(address, multiplex=True) as conn:
            session = await conn.spawn(["sh", "-c", 'read line; echo "got $line on $WHERE"; '
                                        "exit 6"], pty=False, detachable=True,
                                       target="web-1")
            await session.detach()
            assert session.id is not None
            live = await anyio.to_thread.run_sync(cli, "sessions", "--live", "--connect",
                                                  address)
            header, row = live.stdout.splitlines()
            assert header.split()[:2] == ["SESSION", "TARGET"], live.stdout
            assert row.split()[:2] == [session.id, "web-1"]
            as_json = await anyio.to_thread.run_sync(cli, "sessions", "--live", "--json",
                                                     "--connect", address)
            assert json.loads(as_json.stdout)["target"] == "web-1"
        attached = await anyio.to_thread.run_sync(
            lambda: cli("attach", "--connect", address, session.id or "", stdin="hi\n"))
        assert (attached.returncode, attached.stdout) == (6, "got hi on web-1\n"), (
            attached.stderr)
