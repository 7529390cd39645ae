"""Doors with targets on this machine (target_doors.py): far sides by name, and a door on a
targets file with a journal, each ended after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server
from target_doors import Far, far_side


@pytest.fixture
def far() -> Iterator[Callable[[str], Far]]:
    """Far sides by name; their background servers are stopped after the test."""
    made: list[Far] = []

    def make(name: str) -> Far:
        made.append(far_side(name))
        return made[-1]

    try:
        yield make
    finally:
        for each in made:
            each.stop()


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
