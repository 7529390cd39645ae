"""Doors with targets on this machine: each target's far side is `serve --stdio --persist`
started by a `via:` carrier through a wrapper that gives it a runtime directory of its own
(so its own server, started in the background, answers on a socket of its own), stopped
after the test."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ServerProcess, children_of, server_pid, start_server, wait_until_gone

VENV_TTYSERVE = Path(sys.executable).with_name("ttyserve")


@dataclass
class Far:
    """One target's far side on this machine."""

    name: str
    runtime: Path  # its own server's runtime directory (the default socket is there)
    wrapper: Path  # the remote command: this venv's ttyserve in that runtime directory

    def entry(self, labels: dict[str, str] | None = None, persist: bool = True,
              via: str = "via:env") -> str:
        """Its `[targets.NAME]` table."""
        pairs = ", ".join(f'{k} = "{v}"' for k, v in (labels or {}).items())
        return (f'[targets.{self.name}]\nvia = "{via}"\nremote_command = "{self.wrapper}"\n'
                f"persist = {str(persist).lower()}\nlabels = {{ {pairs} }}\n")

    def server(self) -> int | None:
        """The pid of its own server, once the far side started one."""
        return server_pid(self.runtime / "ttyserve.sock")


@pytest.fixture
def far() -> Iterator[Callable[[str], Far]]:
    """Far sides by name; their background servers are stopped after the test."""
    made: list[Far] = []

    def make(name: str) -> Far:
        runtime = Path(tempfile.mkdtemp(prefix="tts-far-", dir="/tmp"))
        runtime.chmod(0o700)
        wrapper = runtime / "ttyserve-far"
        wrapper.write_text(f'#!/bin/sh\nXDG_RUNTIME_DIR={runtime} exec {VENV_TTYSERVE} "$@"\n')
        wrapper.chmod(0o755)
        made.append(Far(name, runtime, wrapper))
        return made[-1]

    try:
        yield make
    finally:
        for each in made:
            pid = each.server()
            if pid is not None:
                os.kill(pid, signal.SIGTERM)  # the server its far side started: ours to end
                assert wait_until_gone(pid)
            shutil.rmtree(each.runtime, ignore_errors=True)


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def carriers(door: ServerProcess, far: Far) -> list[int]:
    """The door's running carriers to ``far`` (processes the test started, through it): its
    descendants that run `serve --stdio --persist` in ``far``'s runtime directory (the
    wrapper execs it, so only its environment names the directory)."""
    found = []
    for pid in descendants(door.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"XDG_RUNTIME_DIR={far.runtime}".encode() in environ and b"--stdio" in cmdline:
            found.append(pid)
    return found


@pytest.fixture
def start_door(short_dir: Path, workers: int) -> Iterator[Callable[..., ServerProcess]]:
    """Start a door on ``targets`` (the file's text) with a journal; stopped after."""
    doors: list[ServerProcess] = []

    def start(targets: str, *args: str) -> ServerProcess:
        (short_dir / "targets.toml").write_text(targets)
        doors.append(start_server(short_dir, "--targets", str(short_dir / "targets.toml"),
                                  "--journal", str(short_dir / "journal"), "--linger", "1",
                                  *args))
        return doors[-1]

    try:
        yield start
    finally:
        for door in doors:
            door.stop()
