"""`serve --spawn portable`: the portable backend behind the real server, end to end.

It is what platforms without the fast path get automatically (glibc before 2.29,
macOS); here it is forced, so the same exit codes and streams are checked on it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import SH, ServerProcess, start_server, ttyserve_command

from ttyserve.exitcodes import ExecExit, ServeExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


@pytest.fixture
def portable_server(short_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(short_dir, "--spawn", "portable", "--command", SH, "--linger", "1")
    try:
        yield server
    finally:
        assert server.stop() == ServeExit.OK


def run(server: ServerProcess, *args: str, stdin: bytes = b"",
        ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(ttyserve_command("exec", "--connect", server.addresses[0], *args),
                          input=stdin, capture_output=True, timeout=30)


def test_pipes_streams_and_statuses(portable_server: ServerProcess) -> None:
    payload = os.urandom(200_000)
    result = run(portable_server, "-T", "--", SH, "-c", "cat; echo err >&2; exit 3",
                 stdin=payload)
    assert (result.returncode, result.stdout, result.stderr) == (3, payload, b"err\n")
    assert run(portable_server, "-T", "--", SH, "-c", "kill -9 $$").returncode == 137
    assert run(portable_server, "-T", "--", "no-such-command").returncode == ExecExit.NOT_FOUND


def test_a_pty_with_its_size_and_the_sessions_path(portable_server: ServerProcess,
                                                   tmp_path: Path) -> None:
    tool = tmp_path / "only-here"
    tool.write_text("#!/bin/sh\ntty; stty size\n")
    tool.chmod(0o700)
    result = run(portable_server, "-t", "--env", f"PATH={tmp_path}:/usr/bin:/bin", "--",
                 "only-here")
    lines = result.stdout.replace(b"\r", b"").split(b"\n")
    assert result.returncode == 0, result.stderr
    assert lines[0].startswith(b"/dev/pts/") and lines[1] == b"24 80"


def test_an_unknown_spawn_kind_is_a_usage_error(short_dir: Path) -> None:
    result = subprocess.run(ttyserve_command("serve", "--spawn", "fork-it",
                                             f"--listen=unix:{short_dir / 's.sock'}"),
                            capture_output=True, timeout=30)
    assert result.returncode == ServeExit.USAGE
    assert b"--spawn" in result.stderr
