"""Fixtures: every server and process a test starts is stopped and reaped here."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import helpers
import pytest
from helpers import ServerProcess, start_server

from ttyserve.backends.reaper import become_subreaper, reap_orphans

# A `serve --stdio` started by a test would start a warm far side (cli/warm.py) in the real
# runtime directory, to outlive the test: off, but where a test asks for it in a directory
# of its own (tests/cli/test_warm.py, the stdio tests' warm runs, the ssh carriers).
os.environ["TTYSERVE_WARM"] = "0"


@pytest.fixture(scope="session", autouse=True)
def adopt_orphans() -> None:
    """Orphans of the sessions tests start become ours, so no zombie outlives a test
    (pid 1 of a container may not reap)."""
    become_subreaper()


@pytest.fixture(autouse=True)
def reap_after_test() -> Iterator[None]:
    yield
    reap_orphans(frozenset())
    for pid in helpers.zombie_children(os.getpid()):  # (what reap_orphans leaves: our own
        os.waitpid(pid, os.WNOHANG)  # session's, such as a killed server's workers)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="tts-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected socket pair: ours (blocking as made), and the peer's, non-blocking."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    try:
        yield ours, theirs
    finally:
        ours.close()
        theirs.close()


@pytest.fixture
def sock_path(short_dir: Path) -> Path:
    return short_dir / "s.sock"


@pytest.fixture(params=[1, 2], ids=["workers1", "workers2"])
def workers(request: pytest.FixtureRequest) -> Iterator[int]:
    """Every server a test starts runs as one process, and as a supervisor with two workers
    (so a feature that forgets the other workers fails)."""
    helpers.WORKERS = request.param
    try:
        yield request.param
    finally:
        helpers.WORKERS = None


@pytest.fixture
def server_process(short_dir: Path, workers: int) -> Iterator[ServerProcess]:
    """A `ttyserve serve` subprocess on a Unix socket, with /bin/sh as default command."""
    server = start_server(short_dir, "--command", "/bin/sh", "--linger", "1")
    try:
        yield server
    finally:
        server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say loudly which tests a missing system package skipped, and how to install it."""
    missing: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if "is not installed" in reason:  # a system package, or a writable cgroup v2
            reason = reason.removeprefix("Skipped: ")
            missing[reason] = missing.get(reason, 0) + 1
    if not missing:
        return
    terminalreporter.write_sep("!", "TESTS SKIPPED: SYSTEM PACKAGES MISSING", red=True, bold=True)
    for reason, count in missing.items():
        terminalreporter.write_line(f"{count} test(s) did not run: {reason}", red=True, bold=True)
    terminalreporter.write_sep("!", "install them and run make test again (CI always does)",
                               red=True, bold=True)
