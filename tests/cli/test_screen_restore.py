"""Full-screen programs come back (section 10's prologue, and SIGWINCH after the replay), in a
real terminal (tmux): vim reattached shows what a client that never left shows, cell by
cell, and a fresh terminal is put back in the alternate screen whose switch the ring lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyte
import pytest
from helpers import ServerProcess, start_server, ttyserve_command
from test_detach_cli import Tmux, command

pytestmark = [pytest.mark.usefixtures("workers"), pytest.mark.timeout(90),
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed: apt-get install tmux"),
              pytest.mark.skipif(shutil.which("vim") is None,
                                 reason="vim is not installed: apt-get install vim")]
ROWS, COLS = 24, 80


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    """A small ring (vim's start is dropped at once), and every PTY session recorded: the
    recording is the screen a client that never left would show."""
    process = start_server(short_dir, "--scrollback", "4096", "--record",
                           str(short_dir / "casts"), "--command", "/bin/sh")
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    session = Tmux(f"ttyserve-screen-{time.monotonic_ns()}")
    try:
        session.run("new-session", "-d", "-s", "t", "-n", "base", "-x", str(COLS),
                    "-y", str(ROWS + 1), "sh", "-c", "sleep 600")  # (+1: tmux's status line)
        yield session
    finally:
        session.kill()


def window(tmux: Tmux, name: str, line: str) -> None:
    tmux.run("new-window", "-d", "-n", name, "sh", "-c", f"{line}; echo rc=$?; sleep 600")


def pane(tmux: Tmux, name: str) -> list[str]:
    """The window's visible cells, row by row (the alternate screen when it is on)."""
    return [row.rstrip() for row in tmux.run("capture-pane", "-p", "-t", f"t:{name}")
            .split("\n")[:ROWS]]


def never_left(cast: Path) -> list[str]:
    """The screen of a client that read every byte: the recording, played into pyte."""
    lines = cast.read_text().splitlines()
    size = json.loads(lines[0])["term"]
    screen = pyte.Screen(size["cols"], size["rows"])
    stream = pyte.Stream(screen)
    for line in lines[1:]:
        _, kind, data = json.loads(line)
        if kind == "o":
            stream.feed(data)
        elif kind == "r":
            cols, rows = (int(n) for n in data.split("x"))
            screen.resize(rows, cols)
    return [row.rstrip() for row in screen.display][:ROWS]


def until_equal(read: object, expected: object, timeout: float = 15) -> list[str]:
    """Poll (tmux has no event for a redraw) until ``read()`` equals ``expected()``."""
    deadline = time.monotonic() + timeout
    while (got := read()) != (want := expected()):  # type: ignore[operator]
        assert time.monotonic() < deadline, "\n".join(
            ["the attached terminal:", *got, "a client that never left:", *want])
        time.sleep(0.1)
    return got  # type: ignore[no-any-return]


def only_session(address: str) -> str:
    """The id of the one detachable session (vim's screen hides the line exec said it on)."""
    listed = subprocess.run(ttyserve_command("sessions", "--live", "--connect", address,
                                             "--json"), capture_output=True, timeout=20)
    (info,) = [json.loads(line) for line in listed.stdout.splitlines()]
    return str(info["session"])


def alternate_on(tmux: Tmux, name: str) -> bool:
    return tmux.run("display-message", "-p", "-t", f"t:{name}", "#{alternate_on}").strip() == "1"


def test_vim_reattached_shows_the_screen_of_a_client_that_never_left(
        server: ServerProcess, tmux: Tmux, short_dir: Path) -> None:
    address = server.addresses[0]
    (short_dir / "notes.txt").write_text("".join(f"line {n} of the notes\n" for n in range(200)))
    window(tmux, "exec", command("exec", "--connect", address, "--detachable", "-t", "--cwd",
                                 str(short_dir), "--", "vim", "-u", "NONE", "-i", "NONE",
                                 "-N", "notes.txt"))
    tmux.expect("exec", r"line 0 of the notes")
    session_id = only_session(address)
    for keys in (["50G"], ["o", "an edit made here", "Escape"]):
        tmux.keys("exec", *keys)  # moves and an edit: redraws, until the ring lost vim's start
    tmux.expect("exec", r"an edit made here")
    tmux.keys("exec", "120G")
    tmux.keys("exec", "zz")
    tmux.expect("exec", r"line 130 of the notes")
    tmux.run("send-keys", "-t", "t:exec", "-l", "lh" * 1500)  # cursor moves: the ring (4 KiB)
    # then holds only those, nothing of the screen: the reattach needs the redraw
    cast = next((short_dir / "casts").glob("*.cast"))
    before = until_equal(lambda: pane(tmux, "exec"), lambda: never_left(cast))
    assert any("line 120 of the notes" in row for row in before), before
    tmux.keys("exec", "C-\\")
    tmux.keys("exec", "d")
    tmux.expect("exec", r"rc=0")  # detached: exec said so, and its epilogue put the
    assert not alternate_on(tmux, "exec")  # terminal back on its main screen

    window(tmux, "attach", command("attach", "--connect", address, session_id))
    after = until_equal(lambda: pane(tmux, "attach"), lambda: never_left(cast))
    assert after == before and alternate_on(tmux, "attach")
    tmux.keys("attach", ":q!", "Enter")
    tmux.expect("attach", r"rc=0")  # vim ended: attach exits with its status


def test_the_alternate_screen_comes_back_after_the_ring_lost_its_switch(
        server: ServerProcess, tmux: Tmux) -> None:
    address = server.addresses[0]
    window(tmux, "exec", command("exec", "--connect", address, "--detachable", "-t", "--",
                                 "sh", "-c", "printf '\\033[?1049h\\033[?25l'; "
                                 "head -c 2097152 /dev/zero | tr '\\0' x; echo; "
                                 "echo two-mib-done; read wait"))
    tmux.expect("exec", r"two-mib-done")
    session_id = only_session(address)
    assert alternate_on(tmux, "exec")
    tmux.keys("exec", "C-\\")
    tmux.keys("exec", "d")
    window(tmux, "attach", command("attach", "--connect", address, session_id))
    tmux.expect("attach", r"two-mib-done")  # the replay: the ring's last 4 KiB
    assert alternate_on(tmux, "attach")  # put there by the prologue alone
    cursor = tmux.run("display-message", "-p", "-t", "t:attach", "#{cursor_flag}").strip()
    assert cursor == "0"  # ?25l: the cursor hidden again too


def test_attach_observe_shows_vim_live_and_keys_typed_there_reach_nothing(
        server: ServerProcess, tmux: Tmux, short_dir: Path) -> None:
    """Section 11 at a terminal: an observer sees the writer's vim cell for cell, live; what
    is typed at the observer (`q`, even `:q!` and Enter) reaches nothing; the detach key
    leaves, and the writer goes on."""
    address = server.addresses[0]
    (short_dir / "notes.txt").write_text("".join(f"line {n} of the notes\n" for n in range(200)))
    window(tmux, "exec", command("exec", "--connect", address, "--detachable", "-t", "--cwd",
                                 str(short_dir), "--", "vim", "-u", "NONE", "-i", "NONE",
                                 "-N", "notes.txt"))
    tmux.expect("exec", r"line 0 of the notes")
    session_id = only_session(address)
    tmux.run("send-keys", "-t", "t:exec", "-l", "jk" * 1500)  # the ring loses vim's start
    window(tmux, "watch", command("attach", "--observe", "--connect", address, session_id))
    until_equal(lambda: pane(tmux, "watch"), lambda: pane(tmux, "exec"))
    tmux.keys("exec", "50G")  # the writer moves: the observer sees it live
    tmux.expect("watch", r"line 60 of the notes")
    tmux.keys("watch", "q")
    tmux.keys("watch", ":q!", "Enter")  # would end vim, were it typed there
    tmux.keys("exec", "o", "typed by the writer", "Escape")
    tmux.expect("watch", r"typed by the writer")
    shown = until_equal(lambda: pane(tmux, "watch"), lambda: pane(tmux, "exec"))
    assert not any(":q!" in row for row in shown), shown  # vim never saw the command
    tmux.keys("watch", "C-\\")
    tmux.keys("watch", "d")
    tmux.expect("watch", r"rc=0")
    tmux.keys("exec", ":q!", "Enter")
    tmux.expect("exec", r"rc=0")  # vim ran until the writer ended it
