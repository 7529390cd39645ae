"""`ttyserve share`, `unshare`, `attach --grant/--observe` and `sessions --live` as a person
uses them (contracts.md, sessions that survive anything)."""

from __future__ import annotations

import json
import re
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server, token_file, ttyserve_command

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "share-cli-token"


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    process = start_server(short_dir, "--command", "/bin/sh", "--max-share-ttl", "1800",
                           "--token-file", str(token_file(short_dir, TOKEN)),
                           listen=[f"unix:{short_dir / 's.sock'}", "tcp:127.0.0.1:0",
                                   "ws:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command(*args), capture_output=True, text=True, timeout=30,
                          **kwargs)  # type: ignore[call-overload]


def test_share_attach_with_the_grant_and_unshare(server: ServerProcess, short_dir: Path,
                                                 ) -> None:
    _, tcp, ws = server.addresses
    token = ("--token-file", str(short_dir / "token"))
    owner = ("--connect", tcp, *token)  # every holder of the token is one principal
    opened = subprocess.Popen(ttyserve_command(
        "exec", *owner, "--detachable", "-T", "--", "sh", "-c",
        "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.1; done"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert opened.stderr is not None
        assert select.select([opened.stderr], [], [], 10)[0], "exec said nothing"
        said = re.search(rb"session (\S+) ", opened.stderr.readline())
        assert said is not None
        session_id = said.group(1).decode()
        shared = run("share", *owner, "--ttl", "10m", session_id)
        assert shared.returncode == 0, shared.stderr
        grant = shared.stdout.strip()
        assert grant and "\n" not in grant
        assert re.search(r"observer grant (gid-\S+) for session " + session_id,
                         shared.stderr), shared.stderr
        browse = run("share", "--connect", ws, *token, session_id)  # no --ttl: the server's
        assert browse.returncode == 0, browse.stderr  # default, within its --max-share-ttl
        host_port = ws.removeprefix("ws:")
        assert re.fullmatch(rf"g\S+\nbrowse http://{re.escape(host_port)}/#grant=g\S+"
                            rf"&session={session_id}\n", browse.stdout), browse.stdout
        # The grant over TCP, with no token: it watches, and says so on --json.
        watcher = subprocess.Popen(ttyserve_command(
            "attach", "--connect", tcp, "--grant", grant, "--json", session_id),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        assert watcher.stdout is not None
        events = [json.loads(watcher.stdout.readline()) for _ in range(3)]
        assert events[0]["event"] == "opened" and events[1]["event"] == "stdout"
        listed = run("sessions", "--live", *owner, "--json")
        (info,) = [json.loads(row) for row in listed.stdout.splitlines()]
        assert info["observers"] == 1 and len(info["grants"]) == 2
        assert grant not in listed.stdout  # the ids only, never the grants
        table = run("sessions", "--live", *owner)
        assert re.search(r"WATCHING\s+GRANTS", table.stdout)
        revoked = run("unshare", *owner, grant)
        assert revoked.returncode == 0 and "1 channel detached" in revoked.stderr
        rest = watcher.communicate(timeout=20)
        assert watcher.returncode == 0  # detached: the session goes on
        last = json.loads(rest[0].splitlines()[-1])
        assert last == {"event": "detached", "session": session_id, "reason": "revoked"}
        assert "the grant was revoked" in rest[1]
        again = run("unshare", *owner, grant)
        assert again.returncode == 255 and "no such grant" in again.stderr
    finally:
        opened.kill()
        opened.wait()


def test_share_refusals_exit_255_naming_what_was_wrong(server: ServerProcess) -> None:
    unix = server.addresses[0]
    unknown = run("share", "--connect", unix, "snosuchsession")
    assert unknown.returncode == 255 and "no such session" in unknown.stderr
    bad_ttl = run("share", "--connect", unix, "--ttl", "soon", "sany")
    assert bad_ttl.returncode == 255 and "'soon' is not a duration" in bad_ttl.stderr
    too_long = run("share", "--connect", unix, "--ttl", "1h", "sany")
    assert too_long.returncode == 255 and "max-share-ttl" in too_long.stderr
