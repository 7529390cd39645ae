"""Fixtures: every server and process a test starts is stopped and reaped here."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server

from ttyserve.backends.reaper import become_subreaper, reap_orphans


@pytest.fixture(scope="session", autouse=True)
def adopt_orphans() -> None:
    """Orphans of the sessions tests start become ours, so no zombie outlives a test
    (pid 1 of a container may not reap)."""
    become_subreaper()


@pytest.fixture(autouse=True)
def reap_after_test() -> Iterator[None]:
    yield
    reap_orphans(frozenset())


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="tts-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sock_path(short_dir: Path) -> Path:
    return short_dir / "s.sock"


@pytest.fixture
def server_process(short_dir: Path) -> Iterator[ServerProcess]:
    """A `ttyserve serve` subprocess on a Unix socket, with /bin/sh as default command."""
    server = start_server(short_dir, "--command", "/bin/sh", "--linger", "1")
    try:
        yield server
    finally:
        server.stop()
