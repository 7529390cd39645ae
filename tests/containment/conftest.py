"""Fixtures for containment: a cgroup base of the test's own, and in-process servers that put
every session in a cgroup under it. Real cgroups: these need root and a writable cgroup v2."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import SH

from ttyserve.addresses import Address
from ttyserve.backends.cgroups import (
    Containment,
    kill_tree,
    open_containment,
    own_cgroup,
    populated,
    remove_tree,
)
from ttyserve.backends.local import LocalBackend
from ttyserve.server.journal import Journal
from ttyserve.server.listener import Server
from ttyserve.server.settings import ServerSettings
from ttyserve.server.sockets import SocketLease, open_listeners

NO_CGROUPS = ("a writable cgroup v2 hierarchy is not installed here (containment needs Linux, "
              "root and cgroup2 mounted: CI has them)")


def writable_cgroup() -> str | None:
    """This process's cgroup v2 directory, where it may make children; else None."""
    own = own_cgroup()
    if own is None or not os.access(own, os.W_OK):
        return None
    return own


@pytest.fixture
def cgroup_base() -> Iterator[str]:
    """A base directory for one test's servers, killed and removed after it."""
    own = writable_cgroup()
    if own is None:
        pytest.skip(NO_CGROUPS)
    base = os.path.join(own, f"ttyserve-test-{secrets.token_hex(4)}")
    try:
        yield base
    finally:
        if os.path.isdir(base):
            kill_tree(base)
            deadline = time.monotonic() + 5
            while populated(base) and time.monotonic() < deadline:
                time.sleep(0.01)
            remove_tree(base)


def tree(directory: str) -> list[int]:
    """Every process in ``directory`` and below."""
    pids = []
    for top, _, _ in os.walk(directory):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in Path(top, "cgroup.procs").read_text().split()]
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


@contextlib.asynccontextmanager
async def contained_server(sock_path: Path, base: str, *, journal: Path | None = None,
                           **given: Any) -> AsyncIterator[tuple[Server, str, Containment]]:
    """A real server in this process whose sessions each run in a cgroup under ``base``;
    shut down gracefully on the way out."""
    settings = ServerSettings(command=[SH], linger=given.pop("linger", 0.3),
                              shutdown_timeout=10, cgroup=base, **given)
    containment = open_containment(base, settings.limits)
    opened = Journal(str(journal)) if journal is not None else None
    server = Server(settings, LocalBackend(containment=containment), journal=opened)
    leases: list[SocketLease] = []
    listeners = open_listeners([Address("unix", path=str(sock_path))], leases)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listeners)
            try:
                yield server, f"unix:{sock_path}", containment
            finally:
                server.shutdown()
    finally:
        for lease in leases:
            lease.release()
        if opened is not None:
            opened.close()
        containment.close()
